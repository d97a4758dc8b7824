//go:build linux

package keelvip

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/testenv"
)

// testRunner is a hook runner for cmd that may run as root (the test's
// process), logging to the test.
func testRunner(t *testing.T, cmd []string, timeout time.Duration) *hookRunner {
	h := newHookRunner(Hooks{Command: cmd, Timeout: timeout}, "m1", "a", "fd00:1::1:100", slog.New(slog.NewTextHandler(tWriter{t}, nil)))
	h.privileged = func() bool { return false }
	return h
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// feed sends changes on a channel that it closes, and runs h on it.
func feed(t *testing.T, h *hookRunner, changes ...claim.Change) {
	t.Helper()
	ch := make(chan claim.Change)
	done := make(chan error, 1)
	go func() { done <- h.run(context.Background(), ch) }()
	testenv.Within(t, "sending the changes", func() {
		for _, c := range changes {
			ch <- c
		}
		close(ch)
	})
	testenv.Within(t, "the runner to end", func() {
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// TestHookRunsOnRoleChanges: the hook runs once per change of role or
// epoch, in order, from the role at start to the drop, with the role, the
// one before it, the epoch and whether the node carries in its
// environment; a change of anything else runs nothing.
func TestHookRunsOnRoleChanges(t *testing.T) {
	out := filepath.Join(t.TempDir(), "runs")
	h := testRunner(t, []string{"/bin/sh", "-c", `echo "$KEEL_ROLE $KEEL_EPOCH $KEEL_PREVIOUS_ROLE $KEEL_CARRIED $KEEL_VIP $KEEL_NODE $KEEL_MESH" >> ` + out}, 5*time.Second)
	a := netip.MustParseAddr("fd00:1::1:1")
	feed(t, h,
		claim.Change{Seq: 0, Role: claim.RoleReplica},
		claim.Change{Seq: 1, Role: claim.RoleHolder, Epoch: 1, Holder: a},
		claim.Change{Seq: 2, Role: claim.RoleHolder, Epoch: 1, Holder: a, Carried: true}, // carry only: no run
		claim.Change{Seq: 3, Role: claim.RoleReplica, Epoch: 1, Holder: a, Fenced: true},
		claim.Change{Seq: 4, Role: claim.RoleHolder, Epoch: 2, Holder: a, Carried: true},
		claim.Change{Seq: 5, Role: claim.RoleReplica, Epoch: 2, Holder: a, Released: true},
	)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"replica 0  0 fd00:1::1:100 a m1",
		"holder 1 replica 0 fd00:1::1:100 a m1",
		"fenced 1 holder 0 fd00:1::1:100 a m1",
		"holder 2 fenced 1 fd00:1::1:100 a m1",
		"released 2 holder 0 fd00:1::1:100 a m1",
	}
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, want) {
		t.Fatalf("hook runs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st := h.Stats(); st.OK != 5 || st.Failed+st.TimedOut+st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHookEnvironmentClean: a hook sees the KEEL_ variables and PATH and
// nothing of the controller's environment.
func TestHookEnvironmentClean(t *testing.T) {
	t.Setenv("KEEL_TEST_SECRET", "must-not-leak")
	h := testRunner(t, []string{"/usr/bin/env"}, 5*time.Second)
	res, err := runHookCommand(context.Background(), h.cfg, h.env(hookEvent{role: "holder", epoch: 7}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(res.output)), "\n") {
		k, _, _ := strings.Cut(l, "=")
		names = append(names, k)
	}
	slices.Sort(names)
	want := []string{"KEEL_CARRIED", "KEEL_EPOCH", "KEEL_HOLDER", "KEEL_MESH", "KEEL_NODE", "KEEL_PREVIOUS_ROLE", "KEEL_ROLE", "KEEL_VIP", "PATH"}
	if !slices.Equal(names, want) {
		t.Fatalf("the hook's environment: %v, want %v", names, want)
	}
}

// processGone reports whether pid has exited (gone, or a zombie nobody
// reaped yet).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, after, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(after, "Z")
}

// hookChildPid runs cmd, which prints the pid of a background child, and
// returns the result and that pid.
func hookChildPid(t *testing.T, cmd string, timeout time.Duration) (hookResult, int) {
	t.Helper()
	res, _ := runHookCommand(context.Background(), Hooks{Command: []string{"/bin/sh", "-c", cmd}, Timeout: timeout}, nil)
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.output)))
	if err != nil {
		t.Fatalf("hook output %q: %v", res.output, err)
	}
	return res, pid
}

// TestHookTimeoutKillsGroup: a hook past its timeout is killed with its
// whole process group, its background child included; so is the group of
// a hook that exits leaving a child behind.
func TestHookTimeoutKillsGroup(t *testing.T) {
	res, pid := hookChildPid(t, "sleep 300 & echo $!; wait", 300*time.Millisecond)
	if !res.timedOut {
		t.Fatalf("a hook that waits 300 s was not timed out: %+v", res)
	}
	waitGone(t, pid, "the timed-out hook's child")
	res, pid = hookChildPid(t, "sleep 300 & echo $!", 10*time.Second)
	if res.timedOut {
		t.Fatalf("a hook that exits at once was timed out")
	}
	waitGone(t, pid, "the background child of a hook that exited")
}

func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs", what, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHookOutputBounded: of a hook's output the first HookOutputMax bytes
// are kept and the rest counted.
func TestHookOutputBounded(t *testing.T) {
	res, err := runHookCommand(context.Background(), Hooks{Command: []string{"/bin/sh", "-c", "head -c 1000000 /dev/zero | tr '\\000' x"}, Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.output) != HookOutputMax || res.truncated != 1000000-HookOutputMax {
		t.Fatalf("kept %d bytes and dropped %d of 1000000", len(res.output), res.truncated)
	}
}

// TestHookQueueNeverBlocks: while a hook hangs, 100 role changes are
// taken at once (the controller's watch is never held up); the queue
// keeps HookQueue of them, drops and counts the oldest, and the hook runs
// for the newest once it is free.
func TestHookQueueNeverBlocks(t *testing.T) {
	dir := t.TempDir()
	release, last := filepath.Join(dir, "release"), filepath.Join(dir, "last")
	h := testRunner(t, []string{"/bin/sh", "-c", `while [ ! -e ` + release + ` ]; do sleep 0.01; done; echo "$KEEL_EPOCH" > ` + last}, 30*time.Second)
	ch := make(chan claim.Change)
	done := make(chan error, 1)
	go func() { done <- h.run(context.Background(), ch) }()
	const n = 100
	testenv.Within(t, "100 changes while the hook hangs", func() {
		for i := range n {
			role := claim.RoleReplica
			if i%2 == 1 {
				role = claim.RoleHolder
			}
			ch <- claim.Change{Seq: uint64(i), Role: role, Epoch: uint64(i + 1)}
		}
	})
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	close(ch)
	testenv.Within(t, "the runner to end", func() {
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	st := h.Stats()
	if st.OK+st.Dropped != n || st.Dropped < n-HookQueue-1 || st.Failed+st.TimedOut != 0 {
		t.Fatalf("stats %+v for %d changes and a queue of %d", st, n, HookQueue)
	}
	if b, _ := os.ReadFile(last); strings.TrimSpace(string(b)) != strconv.Itoa(n) {
		t.Fatalf("the last run saw epoch %q, want the newest change's %d", b, n)
	}
}

// TestHookRefusedWhenPrivileged: a controller that is root or holds a
// capability runs no hook; an unprivileged one (another uid, no
// capability) does.
func TestHookRefusedWhenPrivileged(t *testing.T) {
	if testenv.OtherUserRole() == "hookpriv" {
		if processPrivileged() {
			fmt.Println("HOOKPRIV privileged")
			os.Exit(1)
		}
		fmt.Println("HOOKPRIV unprivileged")
		return
	}
	if testenv.OtherUserRole() != "" {
		return
	}
	h := newHookRunner(Hooks{Command: []string{"/bin/true"}}, "m1", "a", "fd00:1::1:100", slog.New(slog.DiscardHandler))
	h.privileged = func() bool { return true }
	if err := h.run(context.Background(), make(chan claim.Change)); err != errPrivilegedHook {
		t.Fatalf("a privileged runner: %v, want errPrivilegedHook", err)
	}
	if os.Geteuid() == 0 && !processPrivileged() {
		t.Fatal("root is not counted as privileged")
	}
	out, err := testenv.AsOtherUser(t, "TestHookRefusedWhenPrivileged", "hookpriv").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "HOOKPRIV unprivileged") {
		t.Fatalf("as another uid without capabilities: %v\n%s", err, out)
	}
}

// TestHookMetrics: the controller's collector exports the hook counts
// when a hook is configured, and no hook series otherwise.
func TestHookMetrics(t *testing.T) {
	h := newHookRunner(Hooks{Command: []string{"/bin/true"}}, "m1", "a", "fd00::1:100", slog.New(slog.DiscardHandler))
	h.ok.Add(3)
	h.failed.Add(1)
	h.timedOut.Add(2)
	h.dropped.Add(5)
	c := controllerCollector{vip: "fd00::1:100", node: "a", ttl: 20 * time.Second,
		status: func() claim.Status { return claim.Status{RenewalAge: -1} }, stats: func() claim.Stats { return claim.Stats{} },
		promotes: new(promoteCounts), hooks: h}
	if probs, err := testutil.CollectAndLint(c); err != nil || len(probs) != 0 {
		t.Fatalf("lint: %v %v", probs, err)
	}
	want := `
# HELP keel_vip_hook_runs_total Role-change hook runs, by result: ok, failed (a non-zero exit or no start), timeout (killed at its timeout), dropped (a role change that a full queue dropped before its run).
# TYPE keel_vip_hook_runs_total counter
keel_vip_hook_runs_total{node="a",result="dropped",vip="fd00::1:100"} 5
keel_vip_hook_runs_total{node="a",result="failed",vip="fd00::1:100"} 1
keel_vip_hook_runs_total{node="a",result="ok",vip="fd00::1:100"} 3
keel_vip_hook_runs_total{node="a",result="timeout",vip="fd00::1:100"} 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "keel_vip_hook_runs_total"); err != nil {
		t.Fatal(err)
	}
	c.hooks = nil
	if n := testutil.CollectAndCount(c, "keel_vip_hook_runs_total"); n != 0 {
		t.Fatalf("%d hook series without a hook", n)
	}
}
