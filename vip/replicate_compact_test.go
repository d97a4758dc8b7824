package vip

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
)

// settle advances the simulated clock until every node holds the same
// services or the periods run out.
func (m *simMesh) settle(periods int) {
	for i := 0; i < periods; i++ {
		m.clock.Advance(DefaultRotation)
	}
}

// TestMeshLifetimeDeletions: a three-member network in sync, over
// replicators on the simulated network, creates and deletes services one
// after another far past Limits.MaxTombstones; compaction by the
// replicators keeps the markers held at or below it. On the code before
// compaction deletion #1025 was refused ("tombstone history full"). 3,000
// deletions by default, 20,000 with VIPKIT_LONG=1.
func TestMeshLifetimeDeletions(t *testing.T) {
	n := 3000
	if testenv.Long() {
		n = 20_000
	}
	m := newSimMesh(t, 3, testenv.Seed(t, 37), 0, true)
	ctx := context.Background()
	most := 0
	for i := 0; i < n; i++ {
		reg := m.tn.regs[i%3]
		name := fmt.Sprintf("s%d", i)
		v, err := reg.Create(ctx, name)
		if err != nil {
			t.Fatalf("create #%d: %v", i+1, err)
		}
		m.clock.Advance(DefaultRotation / 20) // the published snapshot arrives
		if err := reg.Remove(ctx, v.ID.String(), ""); err != nil {
			t.Fatalf("deletion #%d refused: %v", i+1, err)
		}
		m.clock.Advance(DefaultRotation / 20)
		if (i+1)%200 == 0 {
			m.settle(2)
		}
		for _, r := range m.tn.regs {
			if h := r.Replica().OverLimit().Tombstones; h > most {
				most = h
			}
		}
		if most > crdt.DefaultMaxTombstones {
			t.Fatalf("after deletion #%d a node holds %d markers, bound %d", i+1, most, crdt.DefaultMaxTombstones)
		}
	}
	var applied uint64
	for _, r := range m.reps {
		applied += r.Stats().CertApplied
	}
	t.Logf("%d deletions over replicators: at most %d markers held; %d certificates applied", n, most, applied)
	if applied == 0 {
		t.Fatal("no certificate applied")
	}
}

// TestMeshCompactionStallsOnSilentMember: a member whose frames never
// arrive stalls compaction; the full history's error names it; removing
// it by reload unblocks compaction.
func TestMeshCompactionStallsOnSilentMember(t *testing.T) {
	m := newSimMesh(t, 3, testenv.Seed(t, 41), 0, true)
	ctx := context.Background()
	// The silent member: not the proposer (the lowest key).
	low := 0
	for i := range m.tn.regs {
		a, b := m.tn.regs[i].Replica().Author(), m.tn.regs[low].Replica().Author()
		if string(a[:]) < string(b[:]) {
			low = i
		}
	}
	silent := (low + 1) % 3
	m.sim[silent].Close()
	reg := m.tn.regs[low]
	var err error
	for i := 0; i < crdt.DefaultMaxTombstones+1 && err == nil; i++ {
		var v ServiceView
		if v, err = reg.Create(ctx, fmt.Sprintf("s%d", i)); err != nil {
			t.Fatal(err)
		}
		err = reg.Remove(ctx, v.ID.String(), "")
		if i%100 == 0 {
			m.settle(1)
		}
	}
	m.settle(2)
	silentKey := m.tn.regs[silent].Replica().Author()
	if err == nil || !strings.Contains(err.Error(), "tombstone history full") || !strings.Contains(err.Error(), silentKey.String()) {
		t.Fatalf("deletion past the cap: %v; want the full history naming %s", err, silentKey)
	}
	t.Logf("refused as wanted: %v", err)
	// The reload removes the silent member on the others.
	var keep []crdt.AuthorID
	for i, r := range m.tn.regs {
		if i != silent {
			keep = append(keep, r.Replica().Author())
		}
	}
	for i, r := range m.tn.regs {
		if i != silent {
			if err := r.Replica().SetMembers(ctx, keep); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.settle(3)
	if h := reg.Replica().OverLimit().Tombstones; h >= crdt.DefaultMaxTombstones {
		t.Fatalf("%d markers held after the silent member was removed", h)
	}
	v, err := reg.Create(ctx, "after")
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Remove(ctx, v.ID.String(), ""); err != nil {
		t.Fatalf("deletion after removal: %v", err)
	}
}
