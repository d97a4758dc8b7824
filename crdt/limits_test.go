package crdt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// limitNet is n replicas of the same network with small limits.
type limitNet struct {
	reps []*Replica
}

func newLimitNet(t *testing.T, n int, lim Limits) *limitNet {
	t.Helper()
	ln := &limitNet{}
	for i := range n {
		r, err := Open(context.Background(), Config{Network: testNet, Signer: testKey(i), Members: testMembers(n + 2), Limits: lim})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		ln.reps = append(ln.reps, r)
	}
	return ln
}

// antiEntropy has every replica merge every other's snapshots, in random
// orders, until nothing changes.
func (ln *limitNet) antiEntropy(t *testing.T, rng *rand.Rand) {
	t.Helper()
	ctx := context.Background()
	for round := 0; ; round++ {
		if round == 50 {
			t.Fatal("anti-entropy does not settle")
		}
		changed := false
		for _, i := range rng.Perm(len(ln.reps)) {
			for _, j := range rng.Perm(len(ln.reps)) {
				if i == j {
					continue
				}
				var snaps [][]byte
				for _, s := range ln.reps[i].Services() {
					b, _ := ln.reps[i].EncodedSnapshot(s.ID)
					snaps = append(snaps, b)
				}
				rng.Shuffle(len(snaps), func(a, b int) { snaps[a], snaps[b] = snaps[b], snaps[a] })
				for len(snaps) > 0 { // in random batches
					k := 1 + rng.IntN(len(snaps))
					res, _ := ln.reps[j].MergeSnapshots(ctx, snaps[:k])
					snaps = snaps[k:]
					changed = changed || len(res.Changed) > 0
				}
			}
		}
		if !changed {
			return
		}
	}
}

// routed is the set of services a replica would route: active and without
// an error state.
func routed(r *Replica) string {
	var s string
	for _, info := range r.Services() {
		if !info.Deleted && info.Err == nil {
			s += info.ID.String()[28:] + " "
		}
	}
	return s
}

// overState is what a replica reports beyond its limits (Dropped aside).
func overState(r *Replica) string {
	o := r.OverLimit()
	es := ""
	if o.Err != nil {
		es = o.Err.Error()
	}
	return fmt.Sprintf("services %v fields %v tombstones %d authors %v err %q", o.Services, o.Fields, o.Tombstones, o.Authors, es)
}

// TestServiceLimitConverges: more services than the limit, created on
// different replicas and delivered in different orders: every replica
// routes the same ones and reports the others.
func TestServiceLimitConverges(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 2))
		ln := newLimitNet(t, 3, Limits{MaxServices: 2, MaxTombstones: 3})
		for s := range 5 {
			r := ln.reps[s%3]
			_, _ = r.Edit(ctx, testSvc(s), NoRevision, Edit{Key: "name", Value: []byte(fmt.Sprint("svc", s))})
		}
		ln.antiEntropy(t, rng)
		want, wantOver := routed(ln.reps[0]), overState(ln.reps[0])
		for i, r := range ln.reps {
			if got := routed(r); got != want {
				t.Fatalf("seed %d: replica %d routes %s, replica 0 %s", seed, i, got, want)
			}
			if got := overState(r); got != wantOver || len(r.OverLimit().Services) == 0 {
				t.Fatalf("seed %d: replica %d reports %s, replica 0 %s", seed, i, got, wantOver)
			}
		}
	}
}

// TestTombstoneBurnConverges: a member burns more tombstones than the
// limit on random ids; every replica ends with the same state and reports
// the full history naming that member, and local deletions fail.
func TestTombstoneBurnConverges(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 3))
		ln := newLimitNet(t, 3, Limits{MaxServices: 4, MaxTombstones: 3})
		if _, err := ln.reps[0].Edit(ctx, testSvc(1), NoRevision, Edit{Key: "name"}); err != nil {
			t.Fatal(err)
		}
		var burns [][]byte
		for k := range 6 {
			burns = append(burns, snapOf(mkField(4, testSvc(100+k), TombstoneKey, "\x00none", 1, uint64(k+1))))
		}
		for i, r := range ln.reps {
			rng.Shuffle(len(burns), func(a, b int) { burns[a], burns[b] = burns[b], burns[a] })
			for _, b := range burns[:2+2*i] { // the last replica sees all six
				_, _ = r.MergeSnapshot(ctx, b)
			}
		}
		ln.antiEntropy(t, rng)
		want := stateOf(ln.reps[0])
		for i, r := range ln.reps {
			if !equalState(stateOf(r), want) {
				t.Fatalf("seed %d: replica %d holds %d services, replica 0 %d", seed, i, len(r.Services()), len(want))
			}
			o := r.OverLimit()
			if !errors.Is(o.Err, ErrTombstoneLimit) || o.Tombstones != 6 || o.Authors[authorOf(testKey(4))] != 6 {
				t.Fatalf("seed %d: replica %d reports %+v", seed, i, o)
			}
			if _, err := r.Delete(ctx, testSvc(1), AnyRevision); !errors.Is(err, ErrTombstoneLimit) {
				t.Fatalf("seed %d: replica %d: delete with a full history: %v", seed, i, err)
			}
		}
	}
}

// TestConvergenceAtLimits is the property: N replicas, signed fields of
// several members delivered to random replicas in random orders and
// batches, more services, tombstones and fields than the limits allow (up
// to the hard caps for tombstones and fields, and past the hard cap for
// services). After anti-entropy every replica holds the same state,
// routes the same services and reports the same over-limit state.
func TestConvergenceAtLimits(t *testing.T) {
	lim := Limits{MaxServices: 3, MaxTombstones: 4, MaxFieldsPerService: 4}
	for seed := uint64(1); seed <= 20; seed++ {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(seed, 4))
		n := 3 + rng.IntN(3)
		ln := newLimitNet(t, n, lim)
		var fields []Field
		ctr := map[int]uint64{}
		sign := func(a int, svc ServiceID, key, val string, lamport uint64) {
			ctr[a]++
			fields = append(fields, mkField(n+a%2, svc, key, val, lamport, ctr[a]))
		}
		for range 40 + rng.IntN(40) {
			svc := testSvc(rng.IntN(10)) // held cap 6: some services are not held
			switch x := rng.IntN(20); {
			case x == 0:
				sign(rng.IntN(2), svc, TombstoneKey, "\x00none", 1)
			case x == 1:
				sign(rng.IntN(2), testSvc(50+rng.IntN(6)), TombstoneKey, "\x00none", 1) // burns: 4 < held ≤ 8
			default:
				// 7 keys: past the limit (4), within the hard cap (8).
				sign(rng.IntN(2), svc, fmt.Sprint("k", rng.IntN(7)), fmt.Sprint(rng.IntN(3)), uint64(1+rng.IntN(4)))
			}
		}
		for _, f := range fields {
			for _, i := range rng.Perm(n)[:1+rng.IntN(n)] {
				_, _ = ln.reps[i].MergeFields(ctx, []Field{f})
			}
		}
		ln.antiEntropy(t, rng)
		want, wantRouted, wantOver := stateOf(ln.reps[0]), routed(ln.reps[0]), overState(ln.reps[0])
		for i, r := range ln.reps {
			if !equalState(stateOf(r), want) {
				t.Fatalf("seed %d: replica %d holds another state than replica 0", seed, i)
			}
			if got := routed(r); got != wantRouted {
				t.Fatalf("seed %d: replica %d routes %s, replica 0 %s", seed, i, got, wantRouted)
			}
			if got := overState(r); got != wantOver {
				t.Fatalf("seed %d: replica %d reports %s, replica 0 %s", seed, i, got, wantOver)
			}
			o := r.OverLimit()
			active := 0
			for _, s := range r.Services() {
				if !s.Deleted {
					active++
					if s.Fields > lim.MaxFieldsPerService && !errors.Is(s.Err, ErrFieldLimit) {
						t.Fatalf("seed %d: replica %d: service %s with %d fields not reported", seed, i, s.ID, s.Fields)
					}
				}
			}
			if (active > lim.MaxServices) != (len(o.Services) > 0) || (o.Tombstones >= lim.MaxTombstones) != errors.Is(o.Err, ErrTombstoneLimit) {
				t.Fatalf("seed %d: replica %d: %d active, report %+v", seed, i, active, o)
			}
			if active > lim.MaxServices && !slices.Equal(o.Services, activeIDs(r)[lim.MaxServices:]) {
				t.Fatalf("seed %d: replica %d: over-limit services are not the highest ids", seed, i)
			}
		}
	}
}

func activeIDs(r *Replica) []ServiceID {
	var ids []ServiceID
	for _, s := range r.Services() {
		if !s.Deleted {
			ids = append(ids, s.ID)
		}
	}
	return ids
}
