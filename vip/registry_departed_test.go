package vip

import (
	"context"
	"errors"
	"testing"
)

// TestRegistryDepartedNode: a backend whose node leaves the member list
// resolves by its stored id (full and unique prefix), never blocks other
// edits of its service, is removed like any backend, and cannot be
// written as a new backend (another port, or a listener's new
// incarnation).
func TestRegistryDepartedNode(t *testing.T) {
	ctx := context.Background()
	tn := newTestNet(t, 3, 11)
	reg := tn.regs[0]
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	tcp, udp := PortKey{TCP, 443}, PortKey{UDP, 53}
	n2, n3 := tn.nodes[1], tn.nodes[2]
	if _, err := reg.PortAdd(ctx, "api", tcp, []Backend{{n2.ID, 7443}, {n3.ID, 7443}}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PortAdd(ctx, "api", udp, []Backend{{n3.ID, 53}}); err != nil {
		t.Fatal(err)
	}
	tn.mu.Lock()
	tn.nodes = []NodeInfo{tn.nodes[0], n3} // server2 departs
	tn.mu.Unlock()
	reg.Refresh()

	for _, sel := range []string{n2.ID.String() + ":7443", n2.ID.String()[:10] + ":7443"} {
		b, err := reg.ResolveBackend(sel)
		if err != nil || b != (Backend{n2.ID, 7443}) {
			t.Fatalf("ResolveBackend(%s) = %v, %v", sel, b, err)
		}
	}
	if _, err := reg.ResolveBackend("server2:7443"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a name no agent source knows resolved: %v", err)
	}
	if _, err := reg.BackendAdd(ctx, "api", tcp, Backend{n3.ID, 8443}); err != nil {
		t.Fatalf("unrelated edit blocked by the departed backend: %v", err)
	}
	if _, err := reg.BackendAdd(ctx, "api", udp, Backend{n2.ID, 53}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a departed node added as a new backend: %v", err)
	}
	cur, _ := reg.Get("api")
	draft := cur.Service.Clone()
	draft.Listeners[0].Generation = 0
	if l, _ := draft.Listener(tcp); l != nil {
		l.Generation = cur.Listeners[0].Generation + 100 // a new incarnation
	}
	if _, err := reg.Save(ctx, draft, cur.Revision); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a new incarnation of the listener kept the departed backend: %v", err)
	}
	v, err := reg.BackendRemove(ctx, "api", tcp, Backend{n2.ID, 7443})
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := v.Listener(tcp); len(l.Backends) != 2 {
		t.Fatalf("after removal: %+v", l.Backends)
	}
}

// TestRegistryDepartedNodeName: with FormerNodes, the name the agent knew
// resolves too, unless a member holds that name now.
func TestRegistryDepartedNodeName(t *testing.T) {
	ctx := context.Background()
	tn := newTestNet(t, 2, 12)
	n2 := tn.nodes[1]
	reg := tn.regs[0]
	reg.o.FormerNodes = func() []NodeInfo { return []NodeInfo{n2} }
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{n2.ID, 7443}}); err != nil {
		t.Fatal(err)
	}
	tn.mu.Lock()
	tn.nodes = tn.nodes[:1]
	tn.mu.Unlock()
	reg.Refresh()
	if b, err := reg.ResolveBackend("server2:7443"); err != nil || b.Node != n2.ID {
		t.Fatalf("by former name: %v, %v", b, err)
	}
	if name, member := reg.NodeName(n2.ID); name != "server2" || member {
		t.Fatalf("NodeName = %q, %v", name, member)
	}
	tn.mu.Lock()
	tn.nodes = append(tn.nodes, NodeInfo{ID: NodeID{9}, Name: "server2", Addr: n2.Addr})
	tn.mu.Unlock()
	if b, err := reg.ResolveBackend("server2:7443"); err != nil || b.Node != (NodeID{9}) {
		t.Fatalf("a member's name must take precedence: %v, %v", b, err)
	}
}
