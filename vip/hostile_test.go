package vip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// hostileField signs a field for service id by member i of tn, with the
// given clock and the next counter.
func (tn *testNet) hostileField(i int, id ServiceID, key string, value []byte, lamport uint64) crdt.Field {
	tn.hostileCtr++
	f := crdt.Field{Network: tn.netID, Service: crdt.ServiceID(id), Key: key, HasValue: value != nil, Value: value,
		Lamport: lamport, Counter: tn.hostileCtr}
	crdt.Sign(tn.keys[i], &f)
	return f
}

// mergeInto merges fields into registry j's replica and refreshes it.
func (tn *testNet) mergeInto(j int, fs ...crdt.Field) (crdt.MergeResult, error) {
	res, err := tn.regs[j].Replica().MergeFields(context.Background(), fs)
	var ids []ServiceID
	for _, id := range res.Changed {
		ids = append(ids, ServiceID(id))
	}
	tn.regs[j].Merged(ids)
	return res, err
}

// TestHugeGenerationDoesNotKillPort: a listener register signed with
// generation 2^64-1 (or at the bound) must not make a port silently carry
// no backends while PortAdd reports success.
func TestHugeGenerationDoesNotKillPort(t *testing.T) {
	for _, tc := range []struct {
		gen     uint64
		backend bool // the hostile field is a backend key of that generation
	}{{math.MaxUint64, true}, {math.MaxUint64, false}, {MaxGeneration + 1, true}, {MaxGeneration, true}, {MaxGeneration, false}, {MaxGeneration - 1, true}} {
		gen := tc.gen
		t.Run(fmt.Sprint(gen, tc.backend), func(t *testing.T) {
			tn := newTestNet(t, 2, 5)
			ctx := context.Background()
			r := tn.regs[0]
			v, err := r.Create(ctx, "api")
			if err != nil {
				t.Fatal(err)
			}
			pk := PortKey{TCP, 443}
			hf := tn.hostileField(1, v.ID, listenerKey(pk), encodeListener(gen, true), 5)
			if tc.backend {
				hf = tn.hostileField(1, v.ID, backendKey(pk, gen, Backend{tn.nodes[1].ID, 1}), nil, 5)
			}
			_, merr := tn.mergeInto(0, hf)
			b := Backend{tn.nodes[0].ID, 8443}
			v, err = r.PortAdd(ctx, "api", pk, []Backend{b})
			if err == nil {
				l, ok := v.Listener(pk)
				if !ok || len(l.Backends) != 1 || !v.Routable {
					t.Fatalf("gen %d: PortAdd succeeded but the port carries %+v (routable %v, err %q)", gen, l, v.Routable, v.Err)
				}
			} else if !errors.Is(err, ErrLimit) || gen < MaxGeneration {
				t.Fatalf("gen %d: PortAdd: %v", gen, err)
			}
			if gen > MaxGeneration && !errors.Is(merr, crdt.ErrLamportRange) && !errors.Is(merr, ErrSchema) {
				t.Fatalf("gen %d beyond the bound accepted: %v", gen, merr)
			}
			// Any other port of the service still works.
			if v, err = r.PortAdd(ctx, "api", PortKey{TCP, 80}, []Backend{b}); err != nil || !v.Routable {
				t.Fatalf("gen %d: another port: %v %+v", gen, err, v)
			}
		})
	}
}

// TestPortRecreatedAfterManyRemovals: the backend fields of removed
// listeners no longer count against the field limit.
func TestPortRecreatedAfterManyRemovals(t *testing.T) {
	tn := newTestNet(t, 1, 6)
	ctx := context.Background()
	r := tn.regs[0]
	if _, err := r.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	backs := make([]Backend, 32)
	for i := range backs {
		backs[i] = Backend{tn.nodes[0].ID, uint16(8000 + i)}
	}
	for round := range 7 {
		for p := range 5 {
			pk := PortKey{TCP, uint16(100 + p)}
			if _, err := r.PortAdd(ctx, "api", pk, backs); err != nil {
				t.Fatalf("round %d add %s: %v", round, pk, err)
			}
			if _, err := r.PortRemove(ctx, "api", pk); err != nil {
				t.Fatalf("round %d remove %s: %v", round, pk, err)
			}
		}
	}
	v, err := r.PortAdd(ctx, "api", PortKey{TCP, 443}, backs)
	if err != nil {
		t.Fatalf("add after removals: %v", err)
	}
	if l, _ := v.Listener(PortKey{TCP, 443}); len(l.Backends) != 32 || !v.Routable {
		t.Fatalf("listener after removals: %d backends, routable %v", len(l.Backends), v.Routable)
	}
	if v, err = r.PortAdd(ctx, "api", PortKey{TCP, 100}, backs[:3]); err != nil || !v.Routable {
		t.Fatalf("recreate a removed port: %v", err)
	}
	if l, _ := v.Listener(PortKey{TCP, 100}); len(l.Backends) != 3 {
		t.Fatalf("recreated port has %d backends, want 3 (old ones came back?)", len(l.Backends))
	}
}

// TestListenerRemovalIsFinal: once a listener generation is removed, no
// field, whatever its clock, makes it live again with its old backends.
func TestListenerRemovalIsFinal(t *testing.T) {
	tn := newTestNet(t, 2, 7)
	ctx := context.Background()
	r := tn.regs[0]
	if _, err := r.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	pk := PortKey{TCP, 443}
	v, err := r.PortAdd(ctx, "api", pk, []Backend{{tn.nodes[0].ID, 1}, {tn.nodes[1].ID, 2}})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := v.Listener(pk)
	if v, err = r.PortRemove(ctx, "api", pk); err != nil {
		t.Fatal(err)
	}
	// A member writes the removed generation live again, far ahead.
	if _, err := tn.mergeInto(0, tn.hostileField(1, v.ID, listenerKey(pk), encodeListener(l.Generation, false), 1<<40)); err != nil {
		t.Logf("merge: %v", err)
	}
	v, _ = r.ByID(v.ID)
	if _, ok := v.Listener(pk); ok {
		t.Fatalf("removed listener is live again: %+v", v.Listeners)
	}
	for _, f := range r.Replica().Fields(crdt.ServiceID(v.ID)) {
		if strings.Contains(f.Key, "/b/") {
			t.Fatalf("backend field of the removed generation still held: %s", f.Key)
		}
	}
}

// TestMergeRefusesControlCharacters: a name field with terminal escapes is
// refused on merge and never reaches the registry's views.
func TestMergeRefusesControlCharacters(t *testing.T) {
	tn := newTestNet(t, 2, 8)
	ctx := context.Background()
	r := tn.regs[0]
	v, err := r.Create(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"evil\x1b[2J\x1b]0;pwned\x07", "tab\tname", "UPPER", "nul\x00", "del\x7f", strings.Repeat("a", 64)}
	defer func() {
		if got := r.Replica().Refused().Schema; got != uint64(len(names)) {
			t.Fatalf("%d schema refusals counted, want %d", got, len(names))
		}
	}()
	for _, name := range names {
		_, err := tn.mergeInto(0, tn.hostileField(1, v.ID, keyName, []byte(name), 1<<20))
		if !errors.Is(err, ErrSchema) {
			t.Fatalf("name %q: merge %v, want ErrSchema", name, err)
		}
		got, _ := r.ByID(v.ID)
		if got.Name != "api" {
			t.Fatalf("name %q reached the registry: %q", name, got.Name)
		}
	}
}

// TestRoutedSetConvergesPastServiceLimit: members publish more services
// than the limit to different replicas in different orders; after
// anti-entropy every registry routes the same services (the lowest ids)
// and reports the others, naming their author.
func TestRoutedSetConvergesPastServiceLimit(t *testing.T) {
	const seed = 21
	tn := newTestNet(t, 3, seed)
	rng := rand.New(rand.NewPCG(seed, 9))
	total := crdt.DefaultMaxServices + 6
	for s := range total {
		var id ServiceID
		binary.BigEndian.PutUint64(id[8:], rng.Uint64())
		f := tn.hostileField(s%3, id, keyName, []byte(fmt.Sprint("svc", s)), 1)
		if _, err := tn.mergeInto(rng.IntN(3), f); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	for range 2 {
		for _, i := range rng.Perm(3) {
			for _, j := range rng.Perm(3) {
				if i != j {
					tn.sync(i, j)
				}
			}
		}
	}
	routedSet := func(r *Registry) (string, int) {
		var s string
		over := 0
		for _, v := range r.List() {
			if v.Routable {
				s += v.ID.String()[:6] + " "
			} else if errors.Is(v.Error(), crdt.ErrServiceLimit) && strings.Contains(v.Err, "fields by ") {
				over++
			}
		}
		return s, over
	}
	want, wantOver := routedSet(tn.regs[0])
	for i, r := range tn.regs {
		got, over := routedSet(r)
		if got != want || over != total-crdt.DefaultMaxServices || over != wantOver {
			t.Fatalf("seed %d: registry %d routes %s (%d over), registry 0 %s (%d over)", seed, i, got, over, want, wantOver)
		}
	}
}

// TestHostileFloor: a member's port floor past MaxGeneration is refused
// at merge and changes nothing; one at the bound empties the service's
// listeners, and a new listener is then refused with ErrLimit rather than
// accepted and dropped; one below the bound leaves room above it.
func TestHostileFloor(t *testing.T) {
	for _, fl := range []uint64{math.MaxUint64, MaxGeneration + 1, MaxGeneration, MaxGeneration - 1} {
		t.Run(fmt.Sprint(fl), func(t *testing.T) {
			tn := newTestNet(t, 2, 5)
			ctx := context.Background()
			r := tn.regs[0]
			b := Backend{tn.nodes[0].ID, 8443}
			v, err := r.Create(ctx, "api")
			if err != nil {
				t.Fatal(err)
			}
			if _, err = r.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{b}); err != nil {
				t.Fatal(err)
			}
			_, merr := tn.mergeInto(0, tn.hostileField(1, v.ID, keyFloor, encodeFloor(fl), 5))
			v, err = r.PortAdd(ctx, "api", PortKey{TCP, 80}, []Backend{b})
			switch {
			case fl > MaxGeneration:
				if merr == nil {
					t.Fatalf("floor %d accepted", fl)
				}
				if err != nil || !v.Routable || len(v.Listeners) != 2 {
					t.Fatalf("floor %d refused, yet the service changed: %v %+v", fl, err, v)
				}
			case fl == MaxGeneration:
				if !errors.Is(err, ErrLimit) {
					t.Fatalf("a listener above a floor at the bound: %v %+v, want ErrLimit", err, v)
				}
			default:
				if err != nil {
					t.Fatalf("floor %d: a new listener: %v", fl, err)
				}
				if l, ok := v.Listener(PortKey{TCP, 80}); !ok || len(l.Backends) != 1 {
					t.Fatalf("floor %d: the new listener carries %+v", fl, l)
				}
			}
		})
	}
}
