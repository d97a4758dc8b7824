package tsng

import (
	"strings"
	"testing"
)

// TestCLIRemoveNeedsYesWithoutTerminal: without a terminal to ask on,
// `vip remove` refuses, keeps the VIP and names --yes; with --yes it
// removes.
func TestCLIRemoveNeedsYesWithoutTerminal(t *testing.T) {
	f := newAPIFixture(t)
	f.must("vip", "create", "home", "api")
	for _, env := range []*Env{{}, {Stdin: strings.NewReader("y\n")}} {
		code, _, errs := f.run(env, "vip", "remove", "home", "api")
		if code != ExitUsage || !strings.Contains(errs, "--yes") || !strings.Contains(errs, "not a terminal") {
			t.Errorf("remove without a terminal (stdin %T): exit %d %q, want %d naming --yes", env.Stdin, code, errs, ExitUsage)
		}
		if code, _, _ := f.run(nil, "vip", "show", "home", "api"); code != ExitOK {
			t.Fatalf("the VIP is gone after a refused remove: show exit %d", code)
		}
	}
	f.must("vip", "remove", "home", "api", "--yes")
	if code, _, _ := f.run(nil, "vip", "show", "home", "api"); code != ExitNotFound {
		t.Fatalf("show after remove --yes: exit %d, want %d", code, ExitNotFound)
	}
}
