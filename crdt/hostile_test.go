package crdt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
)

// TestMaxClockPinsOnlyItsKey: a member signs one field at MaxClock. Every
// other key, every other service, creation and deletion still work on
// every replica; only that key is pinned, and deleting its service
// recovers.
func TestMaxClockPinsOnlyItsKey(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 2, nil)
	if _, err := r.Edit(ctx, testSvc(1), NoRevision, Edit{Key: "name", Value: []byte("a")}, Edit{Key: "port", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Edit(ctx, testSvc(2), NoRevision, Edit{Key: "name", Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.MergeFields(ctx, []Field{mkField(1, testSvc(1), "name", "pinned", MaxClock, 1)}); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		if _, err := r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "port", Value: []byte(fmt.Sprint(round))}); err != nil {
			t.Fatalf("round %d: other key of the pinned service: %v", round, err)
		}
		if _, err := r.Edit(ctx, testSvc(2), AnyRevision, Edit{Key: "name", Value: []byte(fmt.Sprint(round))}); err != nil {
			t.Fatalf("round %d: another service: %v", round, err)
		}
		if _, err := r.Edit(ctx, testSvc(10+round), NoRevision, Edit{Key: "name", Value: []byte("new")}); err != nil {
			t.Fatalf("round %d: create: %v", round, err)
		}
		if _, err := r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "name", Value: []byte("x")}); !errors.Is(err, ErrLamportRange) {
			t.Fatalf("round %d: the pinned key: %v", round, err)
		}
		// After a restart too.
		st := r.store.(*MemStore)
		_ = r.Close()
		r = openReplica(t, 0, 2, st.Reopen())
	}
	if _, err := r.Delete(ctx, testSvc(2), AnyRevision); err != nil {
		t.Fatalf("delete another service: %v", err)
	}
	if _, err := r.Delete(ctx, testSvc(1), AnyRevision); err != nil {
		t.Fatalf("delete the pinned service: %v", err)
	}
}

// TestClockBoundaries: clocks and counters at MaxClock-1 and MaxClock are
// accepted, above it (MaxClock+1, MaxUint64) refused.
func TestClockBoundaries(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		lamport, counter uint64
		ok               bool
	}{
		{MaxClock - 1, 1, true}, {MaxClock, 1, true}, {MaxClock + 1, 1, false}, {math.MaxUint64, 1, false},
		{1, MaxClock - 1, true}, {1, MaxClock, true}, {1, MaxClock + 1, false}, {1, math.MaxUint64, false},
	} {
		r := openReplica(t, 0, 2, nil)
		_, err := r.MergeFields(ctx, []Field{mkField(1, testSvc(1), "k", "v", tc.lamport, tc.counter)})
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, ErrLamportRange)) {
			t.Fatalf("lamport %d counter %d: %v", tc.lamport, tc.counter, err)
		}
		if want := map[bool]uint64{true: 0, false: 1}[tc.ok]; r.Refused().ClockRange != want || r.Refused().Total() != want {
			t.Fatalf("lamport %d counter %d: refusals %+v", tc.lamport, tc.counter, r.Refused())
		}
		// An honest edit of another key of that service works either way.
		if _, err := r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "other"}); err != nil {
			t.Fatalf("lamport %d counter %d: edit after: %v", tc.lamport, tc.counter, err)
		}
	}
}

// TestOwnCounterBoundaries: the local author's counter at MaxClock-1 signs
// once more (MaxClock) and then refuses, naming the author; it never wraps.
func TestOwnCounterBoundaries(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 2, nil)
	// Our own field, signed elsewhere with our key near the bound.
	if _, err := r.MergeFields(ctx, []Field{mkField(0, testSvc(1), "k", "v", 1, MaxClock-1)}); err != nil {
		t.Fatal(err)
	}
	fs, err := r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "a"})
	if err != nil || fs[0].Counter != MaxClock {
		t.Fatalf("edit at MaxClock-1: %v %v", fs, err)
	}
	if _, err := r.Edit(ctx, testSvc(2), NoRevision, Edit{Key: "a"}); !errors.Is(err, ErrLamportRange) {
		t.Fatalf("edit past MaxClock: %v", err)
	}
}

// TestSchemaHooks: Check refuses a field (counted, the rest of the snapshot
// merges); Rank outranks the clock.
func TestSchemaHooks(t *testing.T) {
	ctx := context.Background()
	bad := errors.New("schema: no")
	r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(2),
		Check: func(f *Field) error {
			if string(f.Value) == "bad" {
				return bad
			}
			return nil
		},
		Rank: func(f *Field) uint64 { return uint64(len(f.Value)) }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	res, err := r.MergeSnapshot(ctx, snapOf(mkField(1, testSvc(1), "a", "bad", 1, 1), mkField(1, testSvc(1), "b", "ok", 1, 2)))
	if !errors.Is(err, bad) || !errors.Is(err, ErrInvalidField) || res.Accepted != 1 || res.Refused.Schema != 1 || r.Refused().Schema != 1 {
		t.Fatalf("check: %+v %v", res, err)
	}
	// A longer value (higher rank) wins over a later clock, both ways.
	long, late := mkField(1, testSvc(1), "b", "longer", 2, 3), mkField(1, testSvc(1), "b", "ok2", 9, 4)
	for _, order := range [][]Field{{long, late}, {late, long}} {
		r2 := openReplica(t, 0, 2, nil)
		r2.rank = r.rank
		for _, f := range order {
			if _, err := r2.MergeFields(ctx, []Field{f}); err != nil {
				t.Fatal(err)
			}
		}
		if got := r2.Fields(testSvc(1)); len(got) != 1 || string(got[0].Value) != "longer" {
			t.Fatalf("rank: %v", got)
		}
	}
}
