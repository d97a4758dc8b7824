package keelvip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/syncx"
)

// Hooks is the mesh file's "hooks" section: a command the controller runs
// on each change of this node's role.
//
//	"hooks": {"command": ["/usr/local/bin/keel-role", "--notify"], "timeout_s": 10}
//
// The command runs with the role in its environment (KEEL_ROLE, see
// hookEnv) and nothing else of the controller's environment, stdin from
// /dev/null, stdout and stderr logged up to HookOutputMax bytes, in its
// own process group, which is killed when the command exits or its
// timeout passes. Hooks run one at a time, in the order of the changes,
// on their own goroutine: a hook never delays a fence, a drop or a
// renewal. A hook runs as the controller's own user and only from a
// controller without privileges (not root, no capability): the helper
// (tend) never runs one.
type Hooks struct {
	// Command is the program (an absolute path) and its arguments; empty
	// means no hook.
	Command []string
	// Timeout bounds one run (default DefaultHookTimeout, at most
	// MaxHookTimeout).
	Timeout time.Duration
}

const (
	// DefaultHookTimeout bounds one hook run unless timeout_s says.
	DefaultHookTimeout = 10 * time.Second
	// MaxHookTimeout is the largest timeout_s accepted.
	MaxHookTimeout = 5 * time.Minute
	// HookOutputMax is how much of a run's stdout and stderr is logged;
	// the rest is counted and dropped.
	HookOutputMax = 4096
	// HookQueue is how many role changes wait for the hook at most. Past
	// it the oldest waiting change is dropped (and counted): the hook
	// always runs for the newest.
	HookQueue = 16
	// maxHookArgs and maxHookArgLen bound the command line.
	maxHookArgs, maxHookArgLen = 64, 4096
)

// errPrivilegedHook refuses to run a hook in a privileged process.
var errPrivilegedHook = errors.New("keelvip: hooks run only in an unprivileged controller (not root, no capability)")

// validate checks the section as the mesh file gives it.
func (h Hooks) validate() error {
	if len(h.Command) == 0 {
		return nil
	}
	if err := validateCommand("hooks.command", h.Command); err != nil {
		return err
	}
	if h.Timeout < 0 || h.Timeout > MaxHookTimeout {
		return fmt.Errorf("hooks.timeout_s: %v, want 1 to %d", h.Timeout, int(MaxHookTimeout/time.Second))
	}
	return nil
}

// validateCommand checks a command line of the mesh file (field names
// it in errors): an absolute program path, bounded arguments, no NUL.
func validateCommand(field string, cmd []string) error {
	if len(cmd) > maxHookArgs {
		return fmt.Errorf("%s: %d arguments, at most %d", field, len(cmd), maxHookArgs)
	}
	if !filepath.IsAbs(cmd[0]) {
		return fmt.Errorf("%s[0] %q: want an absolute path (the command runs with no PATH of the controller's)", field, cmd[0])
	}
	for i, a := range cmd {
		if len(a) > maxHookArgLen {
			return fmt.Errorf("%s[%d]: %d bytes, at most %d", field, i, len(a), maxHookArgLen)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("%s[%d]: contains a NUL byte", field, i)
		}
	}
	return nil
}

// hookEvent is one role change as a hook sees it.
type hookEvent struct {
	role, previous string // holder, replica, fenced, released
	epoch          uint64
	holder         string
	carried        bool
}

// roleOf names the role of a controller's change for hooks.
func roleOf(c claim.Change) string {
	switch {
	case c.Fenced:
		return "fenced"
	case c.Released:
		return "released"
	case c.Role == claim.RoleHolder:
		return "holder"
	default:
		return "replica"
	}
}

// HookStats counts hook runs.
type HookStats struct {
	OK, Failed, TimedOut uint64
	// Dropped counts role changes dropped from a full queue; Truncated
	// the output bytes not logged.
	Dropped, Truncated uint64
}

// hookRunner runs Hooks for a controller's changes.
type hookRunner struct {
	cfg        Hooks
	vip        string
	node       string
	mesh       string
	log        *slog.Logger
	privileged func() bool // reports whether this process may not run hooks
	wake       chan struct{}

	ok        atomic.Uint64
	failed    atomic.Uint64
	timedOut  atomic.Uint64
	dropped   atomic.Uint64
	truncated atomic.Uint64

	// qmu guards the queue and closing.
	qmu syncx.Mutex
	// queue holds the events waiting for the worker, oldest first.
	// +checklocks:qmu
	queue []hookEvent
	// closing is set once the changes have ended.
	// +checklocks:qmu
	closing bool
}

func newHookRunner(cfg Hooks, mesh, node, vip string, log *slog.Logger) *hookRunner {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultHookTimeout
	}
	return &hookRunner{cfg: cfg, mesh: mesh, node: node, vip: vip, log: log, privileged: processPrivileged, wake: make(chan struct{}, 1)}
}

// Stats returns the counts so far.
func (h *hookRunner) Stats() HookStats {
	return HookStats{OK: h.ok.Load(), Failed: h.failed.Load(), TimedOut: h.timedOut.Load(), Dropped: h.dropped.Load(), Truncated: h.truncated.Load()}
}

// run takes changes until the channel closes or ctx ends, and runs the
// hook for each change of role or epoch (the first change, the role at
// start, included). It returns when both its goroutines have ended; a run
// in progress is killed when ctx ends.
func (h *hookRunner) run(ctx context.Context, changes <-chan claim.Change) error {
	if h.privileged() {
		return errPrivilegedHook
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.worker(ctx)
	}()
	last := hookEvent{}
	defer func() {
		// The changes have ended (the controller closed, its last change,
		// the drop, included): the queue gets one timeout to run out,
		// then what still runs is killed.
		h.qmu.Lock()
		h.closing = true
		h.qmu.Unlock()
		h.poke()
		t := time.AfterFunc(h.cfg.Timeout, cancel)
		wg.Wait()
		t.Stop()
	}()
	for c := range changes {
		ev := hookEvent{role: roleOf(c), epoch: c.Epoch, carried: c.Carried, previous: last.role}
		if c.Holder.IsValid() {
			ev.holder = c.Holder.String()
		}
		if ev.role == last.role && ev.epoch == last.epoch {
			continue
		}
		last = ev
		h.enqueue(ev)
	}
	return nil
}

// enqueue adds ev, dropping the oldest waiting event from a full queue.
func (h *hookRunner) enqueue(ev hookEvent) {
	h.qmu.Lock()
	if len(h.queue) >= HookQueue {
		h.queue = append(h.queue[:0], h.queue[1:]...)
		h.dropped.Add(1)
	}
	h.queue = append(h.queue, ev)
	h.qmu.Unlock()
	h.poke()
}

// poke wakes the worker.
func (h *hookRunner) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// worker runs the queued events in order until ctx ends, or until the
// queue is empty once run is closing.
func (h *hookRunner) worker(ctx context.Context) {
	for {
		h.qmu.Lock()
		var ev hookEvent
		ok := len(h.queue) > 0
		if ok {
			ev = h.queue[0]
			h.queue = append(h.queue[:0], h.queue[1:]...)
		}
		closing := h.closing
		h.qmu.Unlock()
		if !ok && closing {
			return
		}
		if ctx.Err() != nil {
			return
		}
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-h.wake:
				continue
			}
		}
		h.runOne(ctx, ev)
	}
}

// runOne runs the hook for ev and logs the outcome.
func (h *hookRunner) runOne(ctx context.Context, ev hookEvent) {
	res, err := runHookCommand(ctx, h.cfg, h.env(ev))
	h.truncated.Add(res.truncated)
	attrs := []any{"role", ev.role, "epoch", ev.epoch, "took", res.took.Round(time.Millisecond)}
	if len(res.output) > 0 {
		attrs = append(attrs, "output", string(res.output))
	}
	if res.truncated > 0 {
		attrs = append(attrs, "output_dropped_bytes", res.truncated)
	}
	switch {
	case res.timedOut:
		h.timedOut.Add(1)
		h.log.Warn("hook killed at its timeout", append(attrs, "timeout", h.cfg.Timeout)...)
	case err != nil:
		h.failed.Add(1)
		h.log.Warn("hook failed", append(attrs, "err", err)...)
	default:
		h.ok.Add(1)
		h.log.Info("hook ran", attrs...)
	}
}

// env is the whole environment of a run for ev.
func (h *hookRunner) env(ev hookEvent) []string {
	carried := "0"
	if ev.carried {
		carried = "1"
	}
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"KEEL_ROLE=" + ev.role,
		"KEEL_PREVIOUS_ROLE=" + ev.previous,
		"KEEL_EPOCH=" + strconv.FormatUint(ev.epoch, 10),
		"KEEL_HOLDER=" + ev.holder,
		"KEEL_CARRIED=" + carried,
		"KEEL_VIP=" + h.vip,
		"KEEL_NODE=" + h.node,
		"KEEL_MESH=" + h.mesh,
	}
}

// hookResult is what one run did.
type hookResult struct {
	output    []byte
	truncated uint64
	timedOut  bool
	took      time.Duration
}

// limitedBuffer keeps the first max bytes written and counts the rest.
type limitedBuffer struct {
	mu syncx.Mutex
	// max is the number of bytes kept.
	// +checklocks:mu
	max int
	// +checklocks:mu
	b []byte
	// +checklocks:mu
	dropped uint64
}

// Write keeps what fits and reports every byte written.
func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := min(len(p), l.max-len(l.b))
	l.b = append(l.b, p[:n]...)
	l.dropped += uint64(len(p) - n)
	return len(p), nil
}

func (l *limitedBuffer) result() ([]byte, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b, l.dropped
}
