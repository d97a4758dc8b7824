// Package failpoint holds named points in hosting's code where a test
// makes the process fail on purpose, to show what a crash at that point
// leaves behind. Points are enabled only by the environment variable
// VIPKIT_FAILPOINTS, read once when the program starts: a comma-separated
// list of name=action. With the variable unset (as in production) every
// point does nothing.
//
// The actions:
//
//	kill   the process sends itself SIGKILL (os.Process.Kill): no deferred
//	       call, no rollback, no clean-up runs
//	error  the point returns ErrInjected
//
// Example: VIPKIT_FAILPOINTS=hosting.service.before-commit=kill
package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Env is the environment variable that enables failpoints.
const Env = "VIPKIT_FAILPOINTS"

// The failpoints of package hosting.
const (
	// BeforeCommit is in a share change's transaction after its Ziti
	// writes, just before the commit.
	BeforeCommit = "hosting.service.before-commit"
	// CascadeStep is in a cascade's transaction (agent, account or
	// frontdoor) after one share's Ziti writes, when more shares remain:
	// a crash there is in the middle of the cascade.
	CascadeStep = "hosting.service.cascade-step"
	// BeforeAck is in the consumer after an event's transaction
	// committed, before its message is acknowledged.
	BeforeAck = "hosting.events.before-ack"
)

// ErrInjected is the error of a point whose action is "error".
var ErrInjected = errors.New("failpoint: injected failure")

var points = parse(os.Getenv(Env))

func parse(v string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		k, a, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && k != "" {
			out[k] = a
		}
	}
	return out
}

// Eval runs the point name: nil when it is not enabled.
func Eval(name string) error {
	switch points[name] {
	case "":
		return nil
	case "kill":
		p, err := os.FindProcess(os.Getpid())
		if err == nil {
			err = p.Kill()
		}
		if err != nil {
			return fmt.Errorf("%w at %s: kill: %v", ErrInjected, name, err)
		}
		select {} // the signal is on its way; nothing after the point runs
	case "error":
		return fmt.Errorf("%w at %s", ErrInjected, name)
	}
	return fmt.Errorf("%w at %s: unknown action %q", ErrInjected, name, points[name])
}
