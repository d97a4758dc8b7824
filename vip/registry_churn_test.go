package vip

import (
	"context"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// TestChurnBackendReplacements replaces a listener's only backend 10,000
// times and checks that the field count stays at what the live
// configuration needs.
func TestChurnBackendReplacements(t *testing.T) {
	tn := newTestNet(t, 1, 7)
	ctx := context.Background()
	r := tn.regs[0]
	if _, err := r.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	k := PortKey{Proto: TCP, Port: 443}
	node := tn.nodes[0].ID
	if _, err := r.PortAdd(ctx, "api", k, []Backend{{Node: node, Port: 1}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10000; i++ {
		old, nw := Backend{Node: node, Port: uint16(i)}, Backend{Node: node, Port: uint16(i + 1)}
		if _, err := r.BackendAdd(ctx, "api", k, nw); err != nil {
			t.Fatalf("cycle %d: add: %v", i, err)
		}
		v, err := r.BackendRemove(ctx, "api", k, old)
		if err != nil {
			t.Fatalf("cycle %d: remove: %v", i, err)
		}
		if n := len(r.Replica().Fields(crdt.ServiceID(v.ID))); n > 4 {
			t.Fatalf("cycle %d: %d fields held, want at most 4 (name, addr, listener, backend)", i, n)
		}
	}
}

// TestBackendRemoveLosesConcurrentOldGenerationAdd shows the cost of
// moving a listener to a new generation on backend removal: a backend
// added concurrently at the old generation is lost, and both members
// converge on the same state.
func TestBackendRemoveLosesConcurrentOldGenerationAdd(t *testing.T) {
	tn := newTestNet(t, 2, 9)
	ctx := context.Background()
	a, b := tn.regs[0], tn.regs[1]
	if _, err := a.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	k := PortKey{Proto: TCP, Port: 443}
	n1, n2 := tn.nodes[0].ID, tn.nodes[1].ID
	if _, err := a.PortAdd(ctx, "api", k, []Backend{{Node: n1, Port: 1}, {Node: n1, Port: 2}}); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	if _, err := a.BackendRemove(ctx, "api", k, Backend{Node: n1, Port: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.BackendAdd(ctx, "api", k, Backend{Node: n2, Port: 3}); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	tn.sync(1, 0)
	va, _ := a.Get("api")
	vb, _ := b.Get("api")
	if va.Revision != vb.Revision {
		t.Fatalf("not converged: %s vs %s", va.Revision, vb.Revision)
	}
	l, _ := va.Listener(k)
	if len(l.Backends) != 1 || l.Backends[0] != (Backend{Node: n1, Port: 2}) {
		t.Fatalf("backends %v, want only %s:2 (the concurrent add at the old generation is lost)", l.Backends, n1)
	}
}
