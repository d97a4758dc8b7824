//go:build linux

package keelvip_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
)

// obligation is what the checker holds a holder to after a fault that
// stops its renewals: from renewed+11 s until resumed it carries no VIP.
type obligation struct {
	node             string
	kind             string
	renewed, resumed time.Duration // CLOCK_BOOTTIME
}

// faultRun is the state of one seeded fault-injection run.
type faultRun struct {
	t       *testing.T
	c       *cluster
	r       *rand.Rand
	w       *addrWatch
	counts  map[string]int
	obl     []obligation
	settles []time.Duration // how long after each heal one member carried
}

// holder returns the member that carries the VIP now ("" for none).
func (f *faultRun) holder() *node {
	var h *node
	for _, n := range f.c.nodes[:2] {
		if carriesAddr(n.h, testVIP) {
			if h != nil {
				f.t.Errorf("two carriers now: %s and %s", h.name, n.name)
			}
			h = n
		}
	}
	return h
}

func (f *faultRun) pick(ns []*node) *node { return ns[f.r.IntN(len(ns))] }

func (f *faultRun) dur(lo, hi int) time.Duration {
	return time.Duration(lo+f.r.IntN(hi-lo+1)) * time.Second
}

// restartTend starts n's helper again after it exited (systemd's
// Restart=always) and waits for it to serve.
func (f *faultRun) restartTend(n *node) {
	select {
	case <-n.tend.Done():
	case <-time.After(20 * time.Second):
		f.t.Fatalf("%s's tend did not exit", n.name)
	}
	n.tend = netns.StartChildT(f.t, n.h, "keel-tend", n.meshPath, f.c.exe)
	waitFor(f.t, 60*time.Second, n.name+"'s tend back", func() bool { _, err := f.c.status(n); return err == nil })
}

// inject runs one fault of kind on n, returns once it has healed.
func (f *faultRun) inject(kind string, n *node) {
	t, c := f.t, f.c
	f.counts[kind]++
	h := f.holder()
	ob := obligation{node: n.name, kind: kind}
	// A frozen helper freezes the node's wireguard-go too: its etcd
	// member is cut off and its renewals stop.
	stopsRenewals := map[string]bool{"partition": true, "kill-controller": true, "stop-controller": true, "stop-helper": true,
		"kill-etcd": true, "kill-holder": true}
	watched := h != nil && h == n && stopsRenewals[kind]
	if watched {
		ob.renewed = c.freshRenewal(n)
	}
	start := bootNow()
	var d time.Duration
	switch kind {
	case "partition":
		d = f.dur(5, 30)
		if err := c.sw.Cut(n.h); err != nil {
			t.Fatal(err)
		}
		time.Sleep(d)
		if err := c.sw.Heal(n.h); err != nil {
			t.Fatal(err)
		}
	case "stop-controller", "stop-helper":
		d = f.dur(5, 30)
		pid := n.tend.Pid()
		if kind == "stop-controller" {
			pid = c.controllerPid(n)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(d)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	case "kill-controller":
		if err := syscall.Kill(c.controllerPid(n), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		f.restartTend(n) // the helper exits with its controller, dropping every VIP
	case "kill-etcd":
		d = f.dur(5, 15)
		if err := n.etcd.Kill(); err != nil {
			t.Fatal(err)
		}
		<-n.etcd.Done()
		time.Sleep(d)
		n.etcd = netns.StartChildT(t, n.h, "etcd", n.etcdArgs...)
	case "move-leader":
		c.moveLeader(n, false)
	case "promote":
		out, err := c.promote(n, false)
		if err != nil {
			t.Logf("planned promote on %s: %v", n.name, err)
		} else if !strings.Contains(out, "this node holds the VIP at epoch") {
			t.Errorf("planned promote on %s printed %q", n.name, out)
		}
	case "kill-holder":
		// The whole node's keel-vip dies (SIGKILL of the helper; its
		// children die with it): the kernel's valid_lft removes the VIP.
		// The other member is promoted with --old-primary-gone and must
		// report that it holds the VIP (exit 0) once it does.
		other := c.nodes[0]
		if other == n {
			other = c.nodes[1]
		}
		if err := n.tend.Kill(); err != nil {
			t.Fatal(err)
		}
		// The killed node's etcd member is cut off with its WireGuard
		// device, which may cost an election: the operator retries a
		// promote that failed (it then exits non-zero, not holding).
		var out string
		var err error
		waitFor(t, 90*time.Second, "promote --old-primary-gone on "+other.name, func() bool {
			out, err = c.promote(other, true)
			if err != nil && carriesAddr(other.h, testVIP) {
				t.Errorf("promote --old-primary-gone on %s failed (%v) while it carries the VIP", other.name, err)
			}
			return err == nil
		})
		if !strings.Contains(out, "this node holds the VIP at epoch") || !carriesAddr(other.h, testVIP) {
			t.Errorf("promote --old-primary-gone on %s after SIGKILL of %s: %q, carries %v", other.name, n.name, out, carriesAddr(other.h, testVIP))
		}
		f.restartTend(n)
	}
	healed := bootNow()
	if watched {
		ob.resumed = healed
		f.obl = append(f.obl, ob)
	}
	t.Logf("fault %-15s on %s for %v (holder %v)", kind, n.name, (healed - start).Round(100*time.Millisecond), nameOf(h))
	f.settle(healed)
}

func nameOf(n *node) string {
	if n == nil {
		return "none"
	}
	return n.name
}

// settle waits until exactly one member carries the VIP, within 45 s of
// the heal; if both members are fenced, none may carry, and a planned
// promote follows (the only way out of a fence; docs/security.md).
func (f *faultRun) settle(healed time.Duration) {
	deadline := time.Now().Add(45 * time.Second)
	for {
		a, b := carriesAddr(f.c.nodes[0].h, testVIP), carriesAddr(f.c.nodes[1].h, testVIP)
		if a != b {
			f.settles = append(f.settles, bootNow()-healed)
			return
		}
		if a && b {
			f.t.Errorf("two carriers %v after a heal", bootNow()-healed)
		}
		if time.Now().After(deadline) {
			sa, erra := f.c.status(f.c.nodes[0])
			sb, errb := f.c.status(f.c.nodes[1])
			if erra == nil && errb == nil && sa.Fenced && sb.Fenced {
				f.t.Logf("both members fenced, none carries: planned promote")
				f.inject("promote", f.pick(f.c.nodes[:2]))
				return
			}
			f.t.Errorf("45 s after a heal: carriers a=%v b=%v (status a %+v %v, b %+v %v)", a, b, sa, erra, sb, errb)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFaultInjectionNetns is the fault-injection run on the real system:
// the cluster of TestPartitionNetns (namespaces, wireguard-go on kernel
// TUNs, three etcd member processes, the helper, controller and listener
// of every node), a fixed case (SIGSTOP of the holder's controller for
// 30 s) and then a seeded random schedule of faults. An independent
// checker reads every member namespace's address events (netlink) into
// one CLOCK_BOOTTIME log: never two carriers; a holder whose renewals a
// fault stopped carries no VIP from 11 s after the send of its last
// answered renewal until the fault heals; after each heal exactly one
// member carries within 45 s, or none while both are fenced. CI runs
// 2 minutes of faults (under 5 minutes in all); VIPKIT_LONG=1 runs at
// least 30 minutes of faults (the last one starts before 30 minutes are
// up and runs to its heal).
func TestFaultInjectionNetns(t *testing.T) {
	seed := testenv.Seed(t, 1616)
	t.Logf("seed %d (VIPKIT_SEED=%d repeats the schedule)", seed, seed)
	budget := 2 * time.Minute // with the setup and the fixed case, under 5 minutes
	if testenv.Long() {
		budget = 30 * time.Minute
	}
	impair := map[string]any{"latency_ms": 125, "jitter_ms": 12.5, "loss": 0.01}
	c := newCluster(t, seed, true, impair, "a", "b", "c")
	c.start()
	c.startEtcd(500, 5000)
	f := &faultRun{t: t, c: c, r: rand.New(rand.NewPCG(seed, 16)), w: c.watchAddrs(), counts: map[string]int{}}
	c.holdAtA()
	runStart := bootNow()

	// The fixed case: the holder's controller stopped for 30 s.
	h := f.holder()
	pid := c.controllerPid(h)
	f.counts["stop-controller (fixed, 30 s)"]++
	renewed := c.freshRenewal(h)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Second)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.obl = append(f.obl, obligation{node: h.name, kind: "stop-controller (fixed)", renewed: renewed, resumed: bootNow()})
	t.Logf("fault %-15s on %s for 30s (fixed case)", "stop-controller", h.name)
	f.settle(bootNow())

	kinds := []string{"partition", "kill-controller", "stop-controller", "stop-helper", "kill-etcd", "move-leader", "promote", "kill-holder"}
	wall := time.Now()
	for time.Since(wall) < budget && !t.Failed() {
		kind := kinds[f.r.IntN(len(kinds))]
		var n *node
		switch kind {
		case "partition", "kill-etcd", "move-leader":
			n = f.pick(c.nodes)
		case "kill-holder":
			if n = f.holder(); n == nil {
				continue
			}
		default:
			n = f.pick(c.nodes[:2])
		}
		f.inject(kind, n)
	}
	end := bootNow()

	// The checker, on the kernel's own events.
	es := f.w.events()
	if two := twoCarriers(es); len(two) > 0 {
		t.Errorf("two carriers at %v", two)
	}
	var longestGone time.Duration
	for _, o := range f.obl {
		from := o.renewed + 11*time.Second
		// Only a VIP that went before the fault healed counts: a short
		// fault (a 5 s stop) leaves renewals going on afterwards, and the
		// VIP rightly stays.
		gone := goneAt(es, o.node, o.renewed)
		if gone > 0 && gone <= o.resumed {
			longestGone = max(longestGone, gone-o.renewed)
		}
		if from < o.resumed && carriedDuring(es, o.node, from, o.resumed) {
			t.Errorf("%s (%s): carried the VIP later than 11 s after its last answered renewal (gone %v after it)", o.node, o.kind, gone-o.renewed)
		}
	}
	gap := longestGap(es, runStart, end)
	var kindsDone []string
	for k, v := range f.counts {
		kindsDone = append(kindsDone, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(kindsDone)
	var table strings.Builder
	fmt.Fprintf(&table, "| seed | faults (by kind) | run | longest last-answered-renewal → VIP gone | longest no-carrier gap | longest heal → one carrier |\n| --- | --- | --- | --- | --- | --- |\n")
	fmt.Fprintf(&table, "| %d | %s | %s | %s | %s | %s |\n", seed, strings.Join(kindsDone, ", "), secs(end-runStart), secs(longestGone), secs(gap), secs(slices.Max(append(f.settles, 0))))
	t.Logf("fault-injection run:\n%s\n%d address events, %d holders held to the 11 s bound", table.String(), len(es), len(f.obl))
	t.Logf("address events (boot time, node, add): %v", es)
	if p := os.Getenv("KEELVIP_FAULTS_TABLE"); p != "" {
		_ = os.WriteFile(p, []byte(table.String()), 0o644)
	}
}

// goneAt returns when node's VIP went after since (0: it did not carry at
// since, or never went).
func goneAt(es []addrEvent, node string, since time.Duration) time.Duration {
	on := false
	for _, e := range es {
		if e.node != node {
			continue
		}
		if e.at <= since {
			on = e.add
			continue
		}
		if !on {
			return 0
		}
		if !e.add {
			return e.at
		}
	}
	return 0
}

// carriedDuring reports whether node carried the VIP at any instant in
// [from, to].
func carriedDuring(es []addrEvent, node string, from, to time.Duration) bool {
	on := false
	for _, e := range es {
		if e.node != node {
			continue
		}
		if e.at > to {
			break
		}
		if e.at <= from {
			on = e.add
			continue
		}
		if on || e.add {
			return true
		}
	}
	return on
}
