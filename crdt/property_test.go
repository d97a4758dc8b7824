package crdt

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

// pool is a random set of signed fields over a few services, keys and
// authors, with colliding Lamport clocks and occasional tombstones.
func pool(rng *rand.Rand, n int, tombP float64) []Field {
	var out []Field
	for i := 0; i < n; i++ {
		svc := testSvc(rng.IntN(4))
		a := rng.IntN(3)
		lam := uint64(1 + rng.IntN(6))
		key := fmt.Sprint("k", rng.IntN(5))
		val := fmt.Sprint(rng.IntN(3))
		if rng.IntN(5) == 0 {
			val = "\x00none"
		}
		if rng.Float64() < tombP {
			key, val = TombstoneKey, "\x00none"
		}
		out = append(out, mkField(a, svc, key, val, lam, uint64(rng.IntN(1000))))
	}
	return out
}

// model is the naive merge: per register the Compare-greatest field; a
// service with a tombstone holds only its greatest tombstone.
func model(fields []Field) map[ServiceID][]byte {
	type reg struct{ f Field }
	regs := map[ServiceID]map[string]*reg{}
	for _, f := range fields {
		m := regs[f.Service]
		if m == nil {
			m = map[string]*reg{}
			regs[f.Service] = m
		}
		if cur := m[f.Key]; cur == nil || Compare(&f, &cur.f) > 0 {
			m[f.Key] = &reg{f}
		}
	}
	out := map[ServiceID][]byte{}
	for id, m := range regs {
		var fs []Field
		if t := m[TombstoneKey]; t != nil {
			fs = []Field{t.f}
		} else {
			for _, r := range m {
				fs = append(fs, r.f)
			}
		}
		sortFields(fs)
		s := Snapshot{Network: testNet, Service: id, Fields: fs}
		out[id] = s.Encode()
	}
	return out
}

func sortFields(fs []Field) {
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && fs[j].Key < fs[j-1].Key; j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
}

func checkModel(t *testing.T, r *Replica, fields []Field) {
	t.Helper()
	want := model(fields)
	got := r.Services()
	if len(got) != len(want) {
		t.Fatalf("%d services, model %d", len(got), len(want))
	}
	for _, s := range got {
		b, _ := r.EncodedSnapshot(s.ID)
		if !bytes.Equal(b, want[s.ID]) {
			t.Fatalf("service %s differs from the model", s.ID)
		}
		if s.Deleted && r.Fields(s.ID) != nil {
			t.Fatal("deleted service exposes fields")
		}
	}
}

func mergeAll(t *testing.T, r *Replica, fs []Field) {
	t.Helper()
	if _, err := r.MergeFields(context.Background(), fs); err != nil {
		t.Fatal(err)
	}
}

func exportAll(r *Replica) [][]byte { return stateOf(r) }

func fresh(t *testing.T) *Replica {
	r, err := Open(context.Background(), Config{Network: testNet, Members: testMembers(3)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestPropertyMergeLaws: merge is commutative, associative and idempotent,
// and agrees with the naive model, over seeded random field sets.
func TestPropertyMergeLaws(t *testing.T) {
	rng := rand.New(rand.NewPCG(testenv.Seed(t, 1), 0))
	ctx := context.Background()
	iters := 25
	if testenv.Long() {
		iters = 3000
	}
	for it := 0; it < iters; it++ {
		a, b, c := pool(rng, 12, 0.05), pool(rng, 12, 0.05), pool(rng, 12, 0.05)
		// Commutative: A then B equals B then A.
		ab, ba := fresh(t), fresh(t)
		mergeAll(t, ab, a)
		mergeAll(t, ab, b)
		mergeAll(t, ba, b)
		mergeAll(t, ba, a)
		if !equalState(stateOf(ab), stateOf(ba)) {
			t.Fatalf("iteration %d: not commutative", it)
		}
		checkModel(t, ab, append(append([]Field{}, a...), b...))
		// Associative: (A·B)·C equals A·(B·C), states merged as snapshots.
		bc := fresh(t)
		mergeAll(t, bc, b)
		mergeAll(t, bc, c)
		left, right := fresh(t), fresh(t)
		if _, err := left.MergeSnapshots(ctx, exportAll(ab)); err != nil {
			t.Fatal(err)
		}
		mergeAll(t, left, c)
		mergeAll(t, right, a)
		if _, err := right.MergeSnapshots(ctx, exportAll(bc)); err != nil {
			t.Fatal(err)
		}
		if !equalState(stateOf(left), stateOf(right)) {
			t.Fatalf("iteration %d: not associative", it)
		}
		// Idempotent: merging again changes nothing.
		before := stateOf(left)
		res, err := left.MergeSnapshots(ctx, exportAll(right))
		if err != nil || len(res.Changed) != 0 || !equalState(before, stateOf(left)) {
			t.Fatalf("iteration %d: not idempotent: %+v %v", it, res, err)
		}
		mergeAll(t, left, c)
		if !equalState(before, stateOf(left)) {
			t.Fatalf("iteration %d: re-merging fields changed state", it)
		}
	}
}

// TestPropertyConvergence: N replicas receive the same fields in random
// orders, with duplicates and losses; a round of periodic snapshots repairs
// the losses; all end byte-identical and equal to the model.
func TestPropertyConvergence(t *testing.T) {
	rng := rand.New(rand.NewPCG(testenv.Seed(t, 2), 0))
	ctx := context.Background()
	iters := 8
	if testenv.Long() {
		iters = 1000
	}
	const n = 5
	for it := 0; it < iters; it++ {
		fields := pool(rng, 40, 0.03)
		reps := make([]*Replica, n)
		for i := range reps {
			reps[i] = fresh(t)
		}
		// Each replica gets its own delivery queue: every field zero (lost),
		// one or two (duplicated) times, in a shuffled order. A field's
		// origin replica always has it, so repair can find it.
		for ri, r := range reps {
			var queue []Field
			for fi, f := range fields {
				copies := 1 + rng.IntN(2)
				if fi%n != ri && rng.IntN(10) < 3 {
					copies = 0
				}
				for k := 0; k < copies; k++ {
					queue = append(queue, f)
				}
			}
			rng.Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })
			for len(queue) > 0 { // in random-sized batches
				k := min(len(queue), 1+rng.IntN(4))
				mergeAll(t, r, queue[:k])
				queue = queue[k:]
			}
		}
		// Periodic snapshots repair the losses.
		for _, src := range reps {
			snaps := exportAll(src)
			for _, dst := range reps {
				if dst != src {
					if _, err := dst.MergeSnapshots(ctx, snaps); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		for i := 1; i < n; i++ {
			if !equalState(stateOf(reps[0]), stateOf(reps[i])) {
				t.Fatalf("iteration %d: replica %d differs", it, i)
			}
		}
		checkModel(t, reps[0], fields)
	}
}

// TestPropertyConvergenceShuffled delivers fields in a different random
// order to each replica (not only with losses) and checks byte-identical
// state without any repair.
func TestPropertyConvergenceShuffled(t *testing.T) {
	rng := rand.New(rand.NewPCG(testenv.Seed(t, 3), 0))
	iters := 10
	if testenv.Long() {
		iters = 1000
	}
	for it := 0; it < iters; it++ {
		fields := pool(rng, 30, 0.05)
		var first [][]byte
		for ri := 0; ri < 4; ri++ {
			r := fresh(t)
			perm := rng.Perm(len(fields))
			for _, p := range perm {
				mergeAll(t, r, []Field{fields[p]})
				if rng.IntN(4) == 0 {
					mergeAll(t, r, []Field{fields[p]})
				}
			}
			if ri == 0 {
				first = stateOf(r)
				checkModel(t, r, fields)
			} else if !equalState(first, stateOf(r)) {
				t.Fatalf("iteration %d: replica %d differs", it, ri)
			}
		}
	}
}

// TestPropertyTombstoneWins: whatever the order and Lamport clocks, a
// service with a tombstone ends deleted with no other field.
func TestPropertyTombstoneWins(t *testing.T) {
	rng := rand.New(rand.NewPCG(testenv.Seed(t, 4), 0))
	svc := testSvc(0)
	iters := 15
	if testenv.Long() {
		iters = 2000
	}
	for it := 0; it < iters; it++ {
		var fields []Field
		for i := 0; i < 10; i++ {
			fields = append(fields, mkField(rng.IntN(3), svc, fmt.Sprint("k", i%4), "v", uint64(1+rng.IntN(100)), uint64(i)))
		}
		tomb := mkField(rng.IntN(3), svc, TombstoneKey, "\x00none", uint64(1+rng.IntN(50)), 999)
		pos := rng.IntN(len(fields) + 1)
		fields = append(fields[:pos], append([]Field{tomb}, fields[pos:]...)...)
		r := fresh(t)
		for _, f := range fields {
			mergeAll(t, r, []Field{f})
		}
		info, ok := r.Service(svc)
		if !ok || !info.Deleted || info.Fields != 0 || r.Fields(svc) != nil {
			t.Fatalf("iteration %d: tombstone at %d did not win: %+v", it, pos, info)
		}
		checkModel(t, r, fields)
	}
}
