package crdt

import (
	"context"
	"errors"
	"testing"
)

func TestCreateBindsID(t *testing.T) {
	ctx := context.Background()
	a, b := openReplica(t, 0, 3, nil), openReplica(t, 1, 3, nil)
	id, fields, err := a.Create(ctx, func(id ServiceID) ([]Edit, error) {
		return []Edit{{Key: "name", Value: []byte("api")}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !fields[0].IsCreation() || id != CreatedID(testNet, a.Author(), fields[0].Counter) {
		t.Fatalf("id %s does not come from creation field %v", id, fields[0])
	}
	if got := a.Fields(id); len(got) != 1 || got[0].Key != "name" {
		t.Fatalf("Fields = %v, want the name alone", got)
	}
	snap, _ := a.EncodedSnapshot(id)
	if _, err := b.MergeSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if b2, _ := b.EncodedSnapshot(id); string(b2) != string(snap) {
		t.Fatal("replicas differ")
	}
	// A deletion keeps the creation field beside the tombstone.
	if _, err := a.Delete(ctx, id, AnyRevision); err != nil {
		t.Fatal(err)
	}
	s, _ := a.Snapshot(id)
	if len(s.Fields) != 2 || !s.Fields[0].IsTombstone() || !s.Fields[1].IsCreation() {
		t.Fatalf("deleted snapshot %v: want tombstone and creation field", s.Fields)
	}
	snap, _ = a.EncodedSnapshot(id)
	if _, err := b.MergeSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if in, _ := b.Service(id); !in.Deleted {
		t.Fatal("not deleted on b")
	}
	// The store reloads it.
	st := NewMemStore()
	c := openReplica(t, 2, 3, st)
	if _, err := c.MergeSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	c2 := openReplica(t, 2, 3, st.Reopen())
	if got, _ := c2.EncodedSnapshot(id); string(got) != string(snap) {
		t.Fatal("reload differs")
	}
}

// TestCreationFieldForged: a creation field that does not hash to its id
// (another author's, another counter, a value) is refused alone and
// counted; the rest of its snapshot merges.
func TestCreationFieldForged(t *testing.T) {
	ctx := context.Background()
	a := openReplica(t, 0, 3, nil)
	real := CreatedID(testNet, authorOf(testKey(1)), 5)
	for _, tc := range []struct {
		name string
		f    Field
	}{
		{"other author", mkField(2, real, CreationKey, "\x00none", 1, 5)},
		{"other counter", mkField(1, real, CreationKey, "\x00none", 1, 6)},
		{"a value", mkField(1, real, CreationKey, "x", 1, 5)},
	} {
		name := mkField(2, real, "name", "x", 1, 9)
		before := a.Refused().Creation
		_, err := a.MergeFields(ctx, []Field{tc.f, name})
		if !errors.Is(err, ErrBadCreation) {
			t.Fatalf("%s: error %v, want ErrBadCreation", tc.name, err)
		}
		if a.Refused().Creation != before+1 {
			t.Fatalf("%s: not counted", tc.name)
		}
		if got := a.Fields(real); len(got) != 1 {
			t.Fatalf("%s: the rest did not merge: %v", tc.name, got)
		}
	}
	if _, err := a.Edit(ctx, real, AnyRevision, Edit{Key: CreationKey}); !errors.Is(err, ErrReservedKey) {
		t.Fatalf("edit of the creation key: %v", err)
	}
}

// TestCreateCounterBounds: the creation counter at MaxClock-1, MaxClock
// and past it.
func TestCreateCounterBounds(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		used uint64
		ok   bool
	}{{MaxClock - 2, true}, {MaxClock - 1, false}, {MaxClock, false}} {
		a := openReplica(t, 0, 3, nil)
		// The own former entry moves the counter (as for a re-added member).
		if _, err := a.MergeFormer(ctx, []FormerMember{{Author: a.Author(), LastCounter: tc.used}}); err != nil {
			t.Fatal(err)
		}
		id, fields, err := a.Create(ctx, func(ServiceID) ([]Edit, error) { return []Edit{{Key: "name", Value: []byte("x")}}, nil })
		if tc.ok {
			if err != nil || fields[1].Counter != MaxClock || id != CreatedID(testNet, a.Author(), MaxClock-1) {
				t.Fatalf("used %d: %v %v", tc.used, err, fields)
			}
			if _, _, err := a.Create(ctx, nil); !errors.Is(err, ErrLamportRange) {
				t.Fatalf("create at the bound: %v", err)
			}
		} else if !errors.Is(err, ErrLamportRange) {
			t.Fatalf("used %d: error %v, want ErrLamportRange", tc.used, err)
		}
	}
	a := openReplica(t, 0, 3, nil)
	if _, err := a.MergeFormer(ctx, []FormerMember{{Author: a.Author(), LastCounter: MaxClock + 1}}); !errors.Is(err, ErrLamportRange) {
		t.Fatalf("entry past the bound: %v", err)
	}
}
