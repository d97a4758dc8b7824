//go:build linux

package keelvip_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
)

// addrEvent is one address change the kernel reported in a namespace,
// stamped with CLOCK_BOOTTIME when the checker received it.
type addrEvent struct {
	at   time.Duration
	node string
	add  bool
}

// addrWatch subscribes to every member namespace's address events
// (RTM_NEWADDR/RTM_DELADDR, netlink) and keeps those of the VIP in one
// merged log. It sees what the kernel does, including an address that
// expires by its valid_lft with every keel-vip process frozen.
type addrWatch struct {
	// mu guards log and closed.
	mu sync.Mutex
	// +checklocks:mu
	log  []addrEvent
	done chan struct{}
	// +checklocks:mu
	closed bool
}

func (c *cluster) watchAddrs() *addrWatch {
	w := &addrWatch{done: make(chan struct{})}
	for _, n := range c.nodes[:2] {
		ch := make(chan netlink.AddrUpdate, 256)
		// The subscription socket is made inside the namespace and stays
		// bound to it.
		err := n.h.Do(func() error {
			return netlink.AddrSubscribeWithOptions(ch, w.done, netlink.AddrSubscribeOptions{
				ErrorCallback: func(err error) {
					w.mu.Lock()
					closed := w.closed
					w.mu.Unlock()
					if !closed {
						c.t.Errorf("%s: address subscription: %v", n.name, err)
					}
				},
			})
		})
		if err != nil {
			c.t.Fatal(err)
		}
		// The state at subscription time.
		if carriesAddr(n.h, testVIP) {
			w.add(addrEvent{at: bootNow(), node: n.name, add: true})
		}
		go func() {
			for u := range ch {
				ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
				if !ok || ip.Unmap() != testVIP {
					continue
				}
				w.add(addrEvent{at: bootNow(), node: n.name, add: u.NewAddr})
			}
		}()
	}
	c.t.Cleanup(w.close)
	return w
}

func (w *addrWatch) add(e addrEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// A refresh (new lifetime) of a carried address is another NEWADDR:
	// keep only changes of state.
	for i := len(w.log) - 1; i >= 0; i-- {
		if w.log[i].node == e.node {
			if w.log[i].add == e.add {
				return
			}
			break
		}
	}
	if !e.add && !slices.ContainsFunc(w.log, func(x addrEvent) bool { return x.node == e.node }) {
		return
	}
	w.log = append(w.log, e)
}

func (w *addrWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}

func (w *addrWatch) events() []addrEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	es := slices.Clone(w.log)
	sort.SliceStable(es, func(i, j int) bool { return es[i].at < es[j].at })
	return es
}

// carriers returns who carries the VIP at boot time at, by the log.
func carriersAt(es []addrEvent, at time.Duration) []string {
	on := map[string]bool{}
	for _, e := range es {
		if e.at > at {
			break
		}
		on[e.node] = e.add
	}
	var out []string
	for n, v := range on {
		if v {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// twoCarriers returns every interval in which two nodes carried the VIP.
func twoCarriers(es []addrEvent) []string {
	on := map[string]bool{}
	var out []string
	for _, e := range es {
		on[e.node] = e.add
		if on["a"] && on["b"] {
			out = append(out, fmt.Sprintf("%v (%s added)", e.at, e.node))
		}
	}
	return out
}

// lastCarried returns the end of the last interval in which node carried
// the VIP, and whether it still carries it.
func lastCarried(es []addrEvent, node string) (time.Duration, bool) {
	var end time.Duration
	on := false
	for _, e := range es {
		if e.node != node {
			continue
		}
		on = e.add
		if !e.add {
			end = e.at
		}
	}
	return end, on
}

// gaps returns the longest interval with no carrier between from and to.
func longestGap(es []addrEvent, from, to time.Duration) time.Duration {
	on := map[string]bool{}
	var gap, since time.Duration
	empty := true
	since = from
	for _, e := range es {
		if e.at > to {
			break
		}
		on[e.node] = e.add
		now := on["a"] || on["b"]
		if e.at < from {
			empty = !now
			continue
		}
		if empty && now {
			gap = max(gap, e.at-since)
		}
		if !empty && !now {
			since = e.at
		}
		empty = !now
	}
	if empty {
		gap = max(gap, to-since)
	}
	return gap
}

// checkFence checks the fence of node in the address log es: never two
// carriers, and node's VIP gone, no later than 11 s after the send of its
// last answered renewal (renewed). It returns when the VIP went and
// whether every check held; what is added to the message when node still
// carries.
func checkFence(t *testing.T, es []addrEvent, node string, renewed time.Duration, what string) (time.Duration, bool) {
	t.Helper()
	ok := true
	if two := twoCarriers(es); len(two) > 0 {
		t.Errorf("two carriers at %v", two)
		ok = false
	}
	gone, still := lastCarried(es, node)
	switch {
	case still || gone == 0:
		t.Errorf("%s still carries the VIP (%s)", node, what)
		return 0, false
	case gone-renewed > 11*time.Second:
		t.Errorf("%s's VIP gone %v after the send of its last answered renewal, want ≤ 11 s", node, gone-renewed)
		return gone, false
	}
	return gone, ok
}

// controllerPid returns the pid of n's controller: its only process in
// n's namespace with the controller's uid. (The uids are fixed, so a
// second run of these tests on the machine has processes with the same
// uid in its own namespaces.)
func (c *cluster) controllerPid(n *node) int {
	var pids []int
	waitFor(c.t, 30*time.Second, n.name+"'s controller", func() bool {
		pids = inNetns(pidsOfUID(n.ctlUID), n.h.Inode())
		return len(pids) == 1
	})
	return pids[0]
}

// inNetns returns the pids among pids whose network namespace has inode
// ino.
func inNetns(pids []int, ino uint64) []int {
	var out []int
	for _, pid := range pids {
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Ino == ino {
			out = append(out, pid)
		}
	}
	return out
}

// freshRenewal waits until n's last answered renewal was sent under 1.2 s
// ago and returns the boot time of its send (within the status call's
// latency): the next renewal is then at least 0.8 s away, so a process
// stopped right now has it as its last.
func (c *cluster) freshRenewal(n *node) time.Duration {
	var at time.Duration
	waitFor(c.t, 30*time.Second, n.name+" renews", func() bool {
		before := bootNow()
		st, err := c.status(n)
		if err != nil || st.RenewalAgeMs < 0 || st.RenewalAgeMs > 1200 {
			return false
		}
		at = before - time.Duration(st.RenewalAgeMs)*time.Millisecond
		return true
	})
	return at
}

// TestFrozenHolderNetns is the fault that a frozen process makes: the
// holder's controller is stopped (SIGSTOP) for 30 s with the VIP on its
// interface, then continued. The address must be gone from the holder's
// interface by 11 s after the send of its last answered renewal (nothing
// of keel-vip runs there to drop it: the kernel's valid_lft does), never
// overlap the replica's carry, and after the SIGCONT exactly one member
// carries within 45 s.
func TestFrozenHolderNetns(t *testing.T) {
	seed := testenv.Seed(t, 16)
	impair := map[string]any{"latency_ms": 125, "jitter_ms": 12.5, "loss": 0.01}
	c := newCluster(t, seed, true, impair, "a", "b", "c")
	A, B := c.node("a"), c.node("b")
	c.start()
	c.startEtcd(500, 5000)
	w := c.watchAddrs()
	c.holdAtA()

	pid := c.controllerPid(A)
	renewed := c.freshRenewal(A)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := bootNow()
	time.Sleep(30 * time.Second) // the fault's length
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	cont := bootNow()
	t.Logf("A's controller stopped %v after its last answered renewal, for %v", stopped-renewed, cont-stopped)
	waitFor(t, 45*time.Second, "one carrier after the SIGCONT", func() bool {
		return carriesAddr(A.h, testVIP) != carriesAddr(B.h, testVIP)
	})
	time.Sleep(5 * time.Second) // the settled state, observed
	end := bootNow()
	es := w.events()
	if gone, ok := checkFence(t, es, "a", renewed, fmt.Sprintf("carriers at the SIGCONT: %v", carriersAt(es, cont))); ok {
		t.Logf("A's VIP gone %v after the send of its last answered renewal", gone-renewed)
	}
	if got := carriersAt(es, end); len(got) != 1 {
		t.Errorf("carriers at the end: %v, want exactly one", got)
	}
	t.Logf("longest gap with no carrier: %v; address events: %v", longestGap(es, stopped, end), es)
}

// restartController starts n's controller again the way systemd restarts
// keel-vip-control.service (units layout).
func (c *cluster) restartController(n *node) *netns.Process {
	creds := filepath.Join(n.dir, "creds-control")
	cg := filepath.Join(cgroup2Root(c.t), n.ctlCgroup)
	n.ctl = netns.StartChildT(c.t, n.h, "keel-unit", cg, strconv.Itoa(int(n.ctlUID)), creds, c.exe, "control")
	return n.ctl
}

// TestCrashLoopUnitsNetns: under systemd's split (played with plain
// processes, as TestPrivilegeSplitUnits does), the holder's controller is
// killed and then crash-loops (its state file is corrupt, so every start
// exits at once; systemd restarts it every second). The helper must not
// keep the VIP: it is gone within the drop deadline of the last answered
// renewal, and the other member's carry never overlaps it.
func TestCrashLoopUnitsNetns(t *testing.T) {
	seed := testenv.Seed(t, 162)
	c := newCluster(t, seed, true, nil, "a", "b", "c")
	A, B := c.node("a"), c.node("b")
	c.startUnits()
	c.startEtcd(500, 5000)
	w := c.watchAddrs()
	c.holdAtA()

	renewed := c.freshRenewal(A)
	if err := os.WriteFile(filepath.Join(A.mesh.StateDir, "state.json"), []byte("{corrupt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := A.ctl.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := bootNow()
	starts := 0
	for bootNow()-killed < 40*time.Second {
		p := c.restartController(A)
		starts++
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := p.Wait(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("restarted controller did not exit: %v", err)
		}
		time.Sleep(time.Second) // RestartSec=1
	}
	waitFor(t, 45*time.Second, "B carries", func() bool { return carriesAddr(B.h, testVIP) })
	es := w.events()
	if gone, ok := checkFence(t, es, "a", renewed, fmt.Sprintf("after %d crash-looping starts", starts)); ok {
		t.Logf("%d controller starts; A's VIP gone %v after its last answered renewal, %v after the kill", starts, gone-renewed, gone-killed)
	}
	t.Logf("address events: %v", es)
}

// TestWipedStateFencedNetns: the holder A dies and B takes over by a
// promote; A's disk is then replaced (its state file is gone) and A
// starts again, and then B stops. A must come up fenced (etcd shows its
// own held key: it held the VIP before) and must not claim by itself
// after B stopped, however long it waits; only a promote on A brings the
// VIP back. Under systemd's split, as TestCrashLoopUnitsNetns plays it.
func TestWipedStateFencedNetns(t *testing.T) {
	seed := testenv.Seed(t, 171)
	c := newCluster(t, seed, true, nil, "a", "b", "c")
	A, B := c.node("a"), c.node("b")
	c.startUnits()
	c.startEtcd(500, 5000)
	w := c.watchAddrs()
	c.holdAtA()

	if err := A.ctl.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "promote B", func() bool {
		out, err := c.promote(B, true)
		if err != nil {
			t.Logf("promote b: %v", err)
		}
		return err == nil && strings.Contains(out, "epoch")
	})
	waitFor(t, 45*time.Second, "B carries", func() bool { return carriesAddr(B.h, testVIP) })
	waitFor(t, 45*time.Second, "A's VIP gone", func() bool { return !carriesAddr(A.h, testVIP) })

	// A's disk is replaced: it starts with no state file.
	if err := os.Remove(filepath.Join(A.mesh.StateDir, "state.json")); err != nil {
		t.Fatal(err)
	}
	restarted := bootNow()
	c.restartController(A)
	waitFor(t, 45*time.Second, "A fenced after its restart without state", func() bool {
		st, err := c.status(A)
		if err != nil {
			t.Logf("a: %v", err)
		}
		return err == nil && st.Fenced && st.Role == "replica" && !st.Carried
	})

	// B stops. A waits fenced: past B's drop and a lease TTL and more.
	if err := B.ctl.Kill(); err != nil {
		t.Fatal(err)
	}
	stopped := bootNow()
	waitFor(t, 45*time.Second, "B's VIP gone", func() bool { return !carriesAddr(B.h, testVIP) })
	for bootNow()-stopped < 30*time.Second {
		st, err := c.status(A)
		if err == nil && (!st.Fenced || st.Role != "replica") {
			t.Fatalf("%v after B stopped, A is %+v: a wiped fenced member claimed by itself", bootNow()-stopped, st)
		}
		time.Sleep(500 * time.Millisecond) // the watch window's pace; the address events are checked below
	}
	for _, e := range w.events() {
		if e.node == "a" && e.add && e.at > restarted {
			t.Fatalf("A carried the VIP %v after its restart without state, before any promote; events %v", e.at-restarted, w.events())
		}
	}
	// A promote on A clears the fence.
	waitFor(t, 60*time.Second, "promote A", func() bool {
		out, err := c.promote(A, true)
		if err != nil {
			t.Logf("promote a: %v", err)
		}
		return err == nil && strings.Contains(out, "epoch")
	})
	waitFor(t, 30*time.Second, "A carries after its promote", func() bool { return carriesAddr(A.h, testVIP) })
	t.Logf("address events: %v", w.events())
}
