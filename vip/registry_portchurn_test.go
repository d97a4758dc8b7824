package vip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// TestChurnDistinctPorts adds and removes 10,000 distinct ports over one
// service's life, beside a listener that stays, and checks after every
// removal that the field count is what the live configuration needs plus
// the port floor and the latest removal's registers. The first 300 ports
// go one at a time, with a backend each (the field limit used to be hit
// at the 186th); the rest in batches of 64 per edit, without backends, to
// keep the test short under -race. A replay of a removed port's recorded
// snapshots stays dropped.
func TestChurnDistinctPorts(t *testing.T) {
	tn := newTestNet(t, 1, 11)
	ctx := context.Background()
	r := tn.open(0, crdt.NewMemStore(), Limits{Listeners: 65}) // batches of 64
	if _, err := r.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	node := tn.nodes[0].ID
	keep := PortKey{Proto: TCP, Port: 443}
	if _, err := r.PortAdd(ctx, "api", keep, []Backend{{Node: node, Port: 8443}, {Node: node, Port: 9443}}); err != nil {
		t.Fatal(err)
	}
	on := true
	if _, err := r.PortSet(ctx, "api", keep, PortSettings{PortCheck: &on}); err != nil {
		t.Fatal(err)
	}
	// The live configuration: name, addr, and tcp/443's register, cfg and
	// two backends.
	const live = 2 + 4
	const total, singles, batch = 10000, 300, 64
	portOf := func(i int) PortKey {
		pk := PortKey{Proto: TCP, Port: uint16(1000 + i)}
		if i%2 == 1 {
			pk.Proto = UDP
		}
		return pk
	}
	check := func(i int, v ServiceView, removed int) {
		t.Helper()
		if n, want := len(r.Replica().Fields(crdt.ServiceID(v.ID))), live+1+removed; n != want {
			t.Fatalf("port %d: %d fields held, want %d (live %d + floor + %d removed registers)", i, n, want, live, removed)
		}
		if !v.Routable || len(v.Listeners) != 1 {
			t.Fatalf("port %d: routable %v, listeners %v, err %q", i, v.Routable, v.Listeners, v.Err)
		}
	}
	var recorded, recordedRemoved []byte
	recordedPort := portOf(100)
	for i := range singles {
		pk := portOf(i)
		v, err := r.PortAdd(ctx, "api", pk, []Backend{{Node: node, Port: 7000}})
		if err != nil {
			t.Fatalf("port %d: add %s: %v", i, pk, err)
		}
		if pk == recordedPort {
			recorded, _ = r.Replica().EncodedSnapshot(crdt.ServiceID(v.ID))
		}
		if v, err = r.PortRemove(ctx, "api", pk); err != nil {
			t.Fatalf("port %d: remove %s: %v", i, pk, err)
		}
		if pk == recordedPort {
			recordedRemoved, _ = r.Replica().EncodedSnapshot(crdt.ServiceID(v.ID))
		}
		check(i, v, 1)
	}
	for i := singles; i < total; i += batch {
		n := min(batch, total-i)
		v, err := r.Get("api")
		if err != nil {
			t.Fatal(err)
		}
		draft := v.Service.Clone()
		for j := range n {
			pk := portOf(i + j)
			draft.Listeners = append(draft.Listeners, Listener{Proto: pk.Proto, Port: pk.Port})
		}
		if v, err = r.Save(ctx, draft, v.Revision); err != nil {
			t.Fatalf("ports %d-%d: add: %v", i, i+n-1, err)
		}
		if len(v.Listeners) != n+1 {
			t.Fatalf("ports %d-%d: %d listeners after add", i, i+n-1, len(v.Listeners))
		}
		draft = v.Service.Clone()
		draft.Listeners = slices.DeleteFunc(draft.Listeners, func(l Listener) bool { return l.Key() != keep })
		if v, err = r.Save(ctx, draft, v.Revision); err != nil {
			t.Fatalf("ports %d-%d: remove: %v", i, i+n-1, err)
		}
		check(i+n-1, v, n)
	}
	v, _ := r.Get("api")
	id := crdt.ServiceID(v.ID)
	before, held := v.Revision, len(r.Replica().Fields(id))
	for _, snap := range [][]byte{recorded, recordedRemoved} {
		if _, err := r.Replica().MergeSnapshot(ctx, snap); err != nil {
			t.Fatalf("replay: %v", err)
		}
		r.Merged([]ServiceID{v.ID})
	}
	v, _ = r.Get("api")
	if _, ok := v.Listener(recordedPort); ok || v.Revision != before {
		t.Fatalf("replay of %s brought something back: listeners %v", recordedPort, v.Listeners)
	}
	for _, f := range r.Replica().Fields(id) {
		if strings.HasPrefix(f.Key, listenerKey(recordedPort)) {
			t.Fatalf("replayed field %s held", f.Key)
		}
	}
	if n := len(r.Replica().Fields(id)); n != held {
		t.Fatalf("after replay: %d fields, %d before", n, held)
	}
	l, _ := v.Listener(keep)
	if len(l.Backends) != 2 || l.Check.PortCheck == nil || !*l.Check.PortCheck {
		t.Fatalf("kept listener %+v", l)
	}
	// The service still takes new listeners.
	if v, err := r.PortAdd(ctx, "api", PortKey{Proto: TCP, Port: 80}, []Backend{{Node: node, Port: 8080}}); err != nil || !v.Routable {
		t.Fatalf("add after churn: %v", err)
	}
}

// TestPortRemoveLosesConcurrentEditsAtOldFloor shows the cost of the port
// floor: while member a removes tcp/80, member b adds a backend to tcp/443
// and adds tcp/8080. a's removal raises the floor to tcp/80's generation
// and moves tcp/443 above it, so b's edits, made at or below the new
// floor, are lost, and both members converge on a's state.
func TestPortRemoveLosesConcurrentEditsAtOldFloor(t *testing.T) {
	tn := newTestNet(t, 2, 13)
	ctx := context.Background()
	a, b := tn.regs[0], tn.regs[1]
	if _, err := a.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	n1, n2 := tn.nodes[0].ID, tn.nodes[1].ID
	https, http, alt := PortKey{Proto: TCP, Port: 443}, PortKey{Proto: TCP, Port: 80}, PortKey{Proto: TCP, Port: 8080}
	if _, err := a.PortAdd(ctx, "api", https, []Backend{{Node: n1, Port: 8443}}); err != nil {
		t.Fatal(err)
	}
	v, err := a.PortAdd(ctx, "api", http, []Backend{{Node: n1, Port: 8080}})
	if err != nil {
		t.Fatal(err)
	}
	l80, _ := v.Listener(http)
	tn.sync(0, 1)
	if v, err = a.PortRemove(ctx, "api", http); err != nil {
		t.Fatal(err)
	}
	if l, _ := v.Listener(https); l.Generation <= l80.Generation {
		t.Fatalf("tcp/443 at generation %d, not moved above the floor %d", l.Generation, l80.Generation)
	}
	if _, err := b.BackendAdd(ctx, "api", https, Backend{Node: n2, Port: 9443}); err != nil {
		t.Fatal(err)
	}
	vb, err := b.PortAdd(ctx, "api", alt, []Backend{{Node: n2, Port: 8081}})
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := vb.Listener(alt); l.Generation > l80.Generation {
		t.Fatalf("b's tcp/8080 at generation %d, above the coming floor %d: the test shows nothing", l.Generation, l80.Generation)
	}
	tn.sync(0, 1)
	tn.sync(1, 0)
	va, _ := a.Get("api")
	vb, _ = b.Get("api")
	if va.Revision != vb.Revision {
		t.Fatalf("not converged: %s vs %s", va.Revision, vb.Revision)
	}
	if len(va.Listeners) != 1 {
		t.Fatalf("listeners %v, want only tcp/443 (b's concurrent tcp/8080 is lost)", va.Listeners)
	}
	l, _ := va.Listener(https)
	if len(l.Backends) != 1 || l.Backends[0] != (Backend{Node: n1, Port: 8443}) {
		t.Fatalf("tcp/443 backends %v, want only %s:8443 (b's concurrent add is lost)", l.Backends, n1)
	}
	// Edits made after the floor arrived are kept.
	if _, err := b.PortAdd(ctx, "api", alt, []Backend{{Node: n2, Port: 8081}}); err != nil {
		t.Fatal(err)
	}
	tn.sync(1, 0)
	if va, _ = a.Get("api"); len(va.Listeners) != 2 {
		t.Fatalf("after the floor: listeners %v", va.Listeners)
	}
}

// olderCheck and olderObsolete are CheckField and Obsolete as agents
// without the port floor have them: L/floor does not parse as a listener
// key, so it is refused, and the obsolete rule is the per-port one.
func olderCheck(f *crdt.Field) error {
	if f.Key == keyFloor {
		return badKey(f.Key)
	}
	return CheckField(f)
}

func olderObsolete(id crdt.ServiceID, fields []crdt.Field) []string {
	return Obsolete(id, slices.DeleteFunc(slices.Clone(fields), func(f crdt.Field) bool { return f.Key == keyFloor }))
}

// TestPortFloorMixedMesh: what an agent without the floor does beside a
// current one, as docs/wire.md says. It refuses L/floor, keeps the
// service routed with the same listeners, and learns a removal from the
// latest removal's register; it holds the removed registers the current
// agent dropped, and those replayed to the current agent stay dropped. It
// keeps routing a port whose removal it missed when a later removal
// superseded it, and a listener it adds at or below the floor is dropped
// by current agents.
func TestPortFloorMixedMesh(t *testing.T) {
	tn := newTestNet(t, 2, 17)
	ctx := context.Background()
	rep, err := crdt.Open(ctx, crdt.Config{Network: tn.netID, Signer: tn.keys[1], Members: tn.members, Store: crdt.NewMemStore(),
		Obsolete: olderObsolete, Check: olderCheck, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	old, err := NewRegistry(RegistryOptions{Network: "home", Prefix: tn.prefix, Replica: rep, Nodes: tn.nodeList, Rand: rand.NewChaCha8([32]byte{1, 99})})
	if err != nil {
		t.Fatal(err)
	}
	tn.regs[1] = old
	cur := tn.regs[0]
	n1 := tn.nodes[0].ID
	if _, err := cur.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	port := func(p uint16) PortKey { return PortKey{Proto: TCP, Port: p} }
	for _, p := range []uint16{443, 80} {
		if _, err := cur.PortAdd(ctx, "api", port(p), []Backend{{Node: n1, Port: p + 8000}}); err != nil {
			t.Fatal(err)
		}
	}
	syncMixed(t, tn, 0, 1)
	sameListeners := func(what string) {
		t.Helper()
		vc, _ := cur.Get("api")
		vo, _ := old.Get("api")
		if !vo.Routable || !slices.EqualFunc(vc.Listeners, vo.Listeners, func(x, y Listener) bool {
			return x.Key() == y.Key() && x.Generation == y.Generation && slices.Equal(x.Backends, y.Backends)
		}) {
			t.Fatalf("%s: current agent %v, older agent %v (routable %v, %q)", what, vc.Listeners, vo.Listeners, vo.Routable, vo.Err)
		}
	}
	if _, err := cur.PortRemove(ctx, "api", port(80)); err != nil {
		t.Fatal(err)
	}
	before := old.Replica().Refused().Schema
	syncMixed(t, tn, 0, 1)
	sameListeners("after a removal")
	if old.Replica().Refused().Schema == before {
		t.Fatal("the older agent took L/floor")
	}
	// Churn seen one removal at a time: the older agent follows, and
	// holds every removed register.
	for p := uint16(1); p <= 5; p++ {
		if _, err := cur.PortAdd(ctx, "api", port(p), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := cur.PortRemove(ctx, "api", port(p)); err != nil {
			t.Fatal(err)
		}
		syncMixed(t, tn, 0, 1)
		sameListeners(fmt.Sprintf("after removing tcp/%d", p))
	}
	vc, _ := cur.Get("api")
	id := crdt.ServiceID(vc.ID)
	nc, no := len(cur.Replica().Fields(id)), len(old.Replica().Fields(id))
	if no != nc-1+5 {
		t.Fatalf("older agent holds %d fields, current %d: want the current's without the floor, plus the 5 earlier removals", no, nc)
	}
	syncMixed(t, tn, 1, 0)
	if n := len(cur.Replica().Fields(id)); n != nc {
		t.Fatalf("the older agent's removed registers came back: %d fields, %d before", n, nc)
	}
	sameListeners("after syncing back")
	// A removal the older agent missed, superseded by a later one.
	if _, err := cur.PortAdd(ctx, "api", port(6), nil); err != nil {
		t.Fatal(err)
	}
	syncMixed(t, tn, 0, 1)
	for _, p := range []uint16{6, 7} {
		if p == 7 {
			if _, err := cur.PortAdd(ctx, "api", port(p), nil); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cur.PortRemove(ctx, "api", port(p)); err != nil {
			t.Fatal(err)
		}
	}
	syncMixed(t, tn, 0, 1)
	if vo, _ := old.Get("api"); !slices.ContainsFunc(vo.Listeners, func(l Listener) bool { return l.Key() == port(6) }) {
		t.Fatalf("older agent: %v; the missed removal of tcp/6 was expected to stay unseen", vo.Listeners)
	}
	// A listener the older agent adds below the floor.
	vo, err := old.PortAdd(ctx, "api", port(9000), []Backend{{Node: n1, Port: 9000}})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := vo.Listener(port(9000))
	syncMixed(t, tn, 1, 0)
	if vc, _ = cur.Get("api"); slices.ContainsFunc(vc.Listeners, func(l Listener) bool { return l.Key() == port(9000) }) {
		t.Fatalf("current agent took tcp/9000 at generation %d, at or below its floor", l.Generation)
	}
}

// syncMixed is testNet.sync for a mesh with an older agent: a field the
// receiver's schema refuses (L/floor at the older agent) leaves the rest
// of the snapshot merged, and is no failure.
func syncMixed(t *testing.T, tn *testNet, from, to int) {
	t.Helper()
	src, dst := tn.regs[from].Replica(), tn.regs[to].Replica()
	var changed []ServiceID
	for _, in := range src.Services() {
		snap, _ := src.EncodedSnapshot(in.ID)
		res, err := dst.MergeSnapshot(context.Background(), snap)
		if err != nil && !errors.Is(err, crdt.ErrInvalidField) {
			t.Fatalf("merge %d→%d: %v", from, to, err)
		}
		for _, id := range res.Changed {
			changed = append(changed, ServiceID(id))
		}
	}
	tn.regs[to].Merged(changed)
}

// TestConcurrentPortRemovalsAreBothLost: two members removing different
// ports of one service at once each move the other's port above the
// floor, so both removals are lost, and they converge with both ports.
func TestConcurrentPortRemovalsAreBothLost(t *testing.T) {
	tn := newTestNet(t, 2, 19)
	ctx := context.Background()
	a, b := tn.regs[0], tn.regs[1]
	if _, err := a.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	n1 := tn.nodes[0].ID
	p, q := PortKey{Proto: TCP, Port: 80}, PortKey{Proto: TCP, Port: 81}
	for _, k := range []PortKey{p, q} {
		if _, err := a.PortAdd(ctx, "api", k, []Backend{{Node: n1, Port: k.Port}}); err != nil {
			t.Fatal(err)
		}
	}
	tn.sync(0, 1)
	if _, err := a.PortRemove(ctx, "api", p); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PortRemove(ctx, "api", q); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	tn.sync(1, 0)
	va, _ := a.Get("api")
	vb, _ := b.Get("api")
	if va.Revision != vb.Revision {
		t.Fatalf("not converged: %s vs %s", va.Revision, vb.Revision)
	}
	if len(va.Listeners) != 2 {
		t.Fatalf("listeners %v, want both tcp/80 and tcp/81 back (each removal moved the other port)", va.Listeners)
	}
}
