package vip

import (
	"context"
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
