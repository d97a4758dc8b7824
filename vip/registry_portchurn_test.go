package vip

import (
	"context"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// TestChurnDistinctPorts adds and removes 10,000 distinct ports over one
// service's life, beside a listener that stays, and checks that the field
// count stays at what the live configuration needs. A replay of a removed
// port's recorded snapshot stays dropped.
func TestChurnDistinctPorts(t *testing.T) {
	tn := newTestNet(t, 1, 11)
	ctx := context.Background()
	r := tn.regs[0]
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
	// two backends. Port churn adds two fields of its own: the port floor
	// and the register of the latest removal (kept for agents without the
	// floor, see docs/crdt.md).
	const live, churn = 2 + 4, 2
	var recorded, recordedRemoved []byte
	var recordedPort PortKey
	const cycles = 10000
	for i := range cycles {
		pk := PortKey{Proto: TCP, Port: uint16(1000 + i)}
		if i%2 == 1 {
			pk.Proto = UDP
		}
		v, err := r.PortAdd(ctx, "api", pk, []Backend{{Node: node, Port: 7000}})
		if err != nil {
			t.Fatalf("cycle %d: add %s: %v", i, pk, err)
		}
		if i == 100 {
			recorded, _ = r.Replica().EncodedSnapshot(crdt.ServiceID(v.ID))
			recordedPort = pk
		}
		v, err = r.PortRemove(ctx, "api", pk)
		if err != nil {
			t.Fatalf("cycle %d: remove %s: %v", i, pk, err)
		}
		if i == 100 {
			recordedRemoved, _ = r.Replica().EncodedSnapshot(crdt.ServiceID(v.ID))
		}
		if n := len(r.Replica().Fields(crdt.ServiceID(v.ID))); n != live+churn {
			t.Fatalf("cycle %d: %d fields held, want %d (live %d + floor + latest removal)", i, n, live+churn, live)
		}
		if !v.Routable || len(v.Listeners) != 1 {
			t.Fatalf("cycle %d: routable %v, listeners %v, err %q", i, v.Routable, v.Listeners, v.Err)
		}
	}
	v, _ := r.Get("api")
	id := crdt.ServiceID(v.ID)
	before := v.Revision
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
	if n := len(r.Replica().Fields(id)); n != live+churn {
		t.Fatalf("after replay: %d fields, want %d", n, live+churn)
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
