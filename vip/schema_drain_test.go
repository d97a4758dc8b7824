package vip

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// TestCheckFieldBackendValue pins the backend value's encoding
// (docs/backend-drain.md): empty serves, 0x01 0x01 drains, anything else
// is refused.
func TestCheckFieldBackendValue(t *testing.T) {
	key := backendKey(PortKey{TCP, 443}, 1, Backend{NodeID{1}, 80})
	for _, tc := range []struct {
		v  []byte
		ok bool
	}{
		{[]byte{}, true}, {[]byte{1, 1}, true},
		{[]byte{1, 0}, false}, {[]byte{1, 2}, false}, {[]byte{1, 3}, false}, {[]byte{2, 1}, false},
		{[]byte{1}, false}, {[]byte{1, 1, 0}, false}, {[]byte{0}, false},
	} {
		err := CheckField(&crdt.Field{Key: key, Value: tc.v, HasValue: true})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrSchema)) {
			t.Errorf("backend value %x: %v, want ok=%v", tc.v, err, tc.ok)
		}
	}
}

// TestBackendDrainFields: draining and undraining rewrite the backend's
// own field (no field is added), replicate, and are idempotent; removal
// of a draining backend ends its drain, also by a whole-draft save that
// leaves a stale drain entry.
func TestBackendDrainFields(t *testing.T) {
	ctx := context.Background()
	tn := newTestNet(t, 2, 21)
	r := tn.regs[0]
	if _, err := r.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	k := PortKey{TCP, 443}
	b1, b2 := Backend{tn.nodes[0].ID, 80}, Backend{tn.nodes[1].ID, 80}
	v, err := r.PortAdd(ctx, "api", k, []Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	fields := len(r.Replica().Fields(crdt.ServiceID(v.ID)))
	if v, err = r.BackendDrain(ctx, "api", k, b2, true); err != nil {
		t.Fatal(err)
	}
	if n := len(r.Replica().Fields(crdt.ServiceID(v.ID))); n != fields {
		t.Fatalf("drain: %d fields, want %d (the flag lives in the backend's field)", n, fields)
	}
	rev := v.Revision
	if v, err = r.BackendDrain(ctx, "api", k, b2, true); err != nil || v.Revision != rev {
		t.Fatalf("draining again: %v, revision %s → %s", err, rev, v.Revision)
	}
	tn.sync(0, 1)
	w, _ := tn.regs[1].Get("api")
	if l, _ := w.Listener(k); !l.Draining(b2) || l.Draining(b1) || len(l.Backends) != 2 {
		t.Fatalf("replicated listener %+v, want b2 draining", l)
	}
	if _, err := tn.regs[1].BackendDrain(ctx, "api", k, Backend{tn.nodes[1].ID, 81}, true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("draining a backend the listener lacks: %v", err)
	}
	if v, err = tn.regs[1].BackendDrain(ctx, "api", k, b2, false); err != nil {
		t.Fatal(err)
	}
	tn.sync(1, 0)
	w, _ = r.Get("api")
	if l, _ := w.Listener(k); len(l.Drain) != 0 {
		t.Fatalf("after undrain: %+v", l)
	}
	if _, err = r.BackendDrain(ctx, "api", k, b1, true); err != nil {
		t.Fatal(err)
	}
	if v, err = r.BackendRemove(ctx, "api", k, b1); err != nil {
		t.Fatal(err)
	}
	if l, _ := v.Listener(k); len(l.Drain) != 0 || len(l.Backends) != 1 {
		t.Fatalf("after removing the draining backend: %+v", l)
	}
	// An editor that removes a draining backend but leaves its drain
	// entry (the web UI keeps the list as it read it) saves the removal.
	if v, err = r.BackendDrain(ctx, "api", k, b2, true); err != nil {
		t.Fatal(err)
	}
	draft := v.Service.Clone()
	draft.Listeners[0].Backends = nil
	if v, err = r.Save(ctx, draft, v.Revision); err != nil {
		t.Fatalf("removing a draining backend by a whole-draft save: %v", err)
	}
	if l, _ := v.Listener(k); len(l.Backends) != 0 || len(l.Drain) != 0 {
		t.Fatalf("after the save: %+v", l)
	}
}

// oldCheckField is CheckField as agents built before drain had it for
// backend fields: only an empty value.
func oldCheckField(f *crdt.Field) error {
	if pk, err := parseKey(f.Key); err == nil && pk.kind == 'b' && f.HasValue && len(f.Value) != 0 {
		return fmt.Errorf("%w: backend value of %d bytes", ErrSchema, len(f.Value))
	}
	return CheckField(f)
}

// TestBackendDrainOlderAgent: an agent built before drain refuses the
// drained backend's field, keeps the serving one it held (so it would go
// on making new bindings to it: docs/backend-drain.md), merges the other
// fields of the snapshot, and agrees again once the backend is undrained.
func TestBackendDrainOlderAgent(t *testing.T) {
	ctx := context.Background()
	tn := newTestNet(t, 2, 22)
	rep, err := crdt.Open(ctx, crdt.Config{Network: tn.netID, Signer: tn.keys[1], Members: tn.members, Store: crdt.NewMemStore(), Obsolete: Obsolete, Check: oldCheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	old, err := NewRegistry(RegistryOptions{Network: "home", Prefix: tn.prefix, Replica: rep, Nodes: tn.nodeList})
	if err != nil {
		t.Fatal(err)
	}
	tn.regs[1] = old
	r := tn.regs[0]
	if _, err := r.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	k := PortKey{UDP, 53}
	b1, b2 := Backend{tn.nodes[0].ID, 53}, Backend{tn.nodes[1].ID, 53}
	if _, err := r.PortAdd(ctx, "api", k, []Backend{b1, b2}); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	if _, err := r.BackendDrain(ctx, "api", k, b2, true); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PortSet(ctx, "api", k, PortSettings{IdleTimeout: ptr(Duration(60e9))}); err != nil {
		t.Fatal(err)
	}
	src := r.Replica()
	for _, in := range src.Services() {
		snap, _ := src.EncodedSnapshot(in.ID)
		if _, err := rep.MergeSnapshot(ctx, snap); !errors.Is(err, crdt.ErrInvalidField) {
			t.Fatalf("the older agent's merge: %v, want the drained field refused", err)
		}
		old.Merged([]ServiceID{ServiceID(in.ID)})
	}
	w, _ := old.Get("api")
	l, _ := w.Listener(k)
	if len(l.Backends) != 2 || len(l.Drain) != 0 || l.IdleTimeout != Duration(60e9) || !w.Routable {
		t.Fatalf("older agent holds %+v (routable %v), want both backends serving and the new idle timeout", l, w.Routable)
	}
	if _, err := r.BackendDrain(ctx, "api", k, b2, false); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	w, _ = old.Get("api")
	v, _ := r.Get("api")
	if w.Revision == "" || fmt.Sprint(w.Listeners) != fmt.Sprint(v.Listeners) {
		t.Fatalf("after undrain the older agent holds %+v, the current one %+v", w.Listeners, v.Listeners)
	}
}

func ptr[T any](v T) *T { return &v }
