package crdt

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

// Authors of the former-member tests: A, B and N are testKey(0..2), the
// members of a replica opened with openReplica(t, _, 3, _); D is
// testKey(3), a member that leaves.
const (
	authA = 0
	authD = 3
)

// trapFields is the trap's history: D creates service S (name, counter
// 1), A adds a field to it (counter 1), D deletes it (counter 2). It
// returns the stale snapshot (before the deletion) and the tombstone's.
func trapFields() (stale, tomb []byte) {
	svc := testSvc(7)
	name := mkField(authD, svc, "name", "api", 1, 1)
	addr := mkField(authA, svc, "addr", "10.0.0.1", 1, 1)
	del := mkField(authD, svc, TombstoneKey, "\x00none", 2, 2)
	return snapOf(name, addr), snapOf(del)
}

// peerWithD is a replica that saw the whole history while D was a member,
// then saw D leave: its former list holds D.
func peerWithD(t *testing.T) *Replica {
	t.Helper()
	ctx := context.Background()
	stale, tomb := trapFields()
	p := openReplica(t, 1, 4, nil) // members A, B, N, D
	for _, s := range [][]byte{stale, tomb} {
		if _, err := p.MergeSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.SetMembers(ctx, testMembers(3)); err != nil {
		t.Fatal(err)
	}
	return p
}

func deleted(r *Replica, id ServiceID) (held, isDeleted bool) {
	in, ok := r.Service(id)
	return ok, in.Deleted
}

// TestFormerTrap is the former-member trap: N joins after D left, with
// members {A, B, N}. It refuses D's tombstone, and a replay of S's other
// fields from a stale peer then brings the deleted service back at N. With
// the former list (taken from a peer, as joining does) S never comes
// back, in either order of tombstone and replay once the list arrived;
// and a tombstone refused before the list came deletes S for good when it
// comes again.
func TestFormerTrap(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(7)
	stale, tomb := trapFields()
	p := peerWithD(t)
	if got := p.Former(); len(got) != 1 || got[0] != (FormerMember{authorOf(testKey(authD)), 2}) {
		t.Fatalf("peer's former list %+v, want D at 2", got)
	}
	for _, tc := range []struct {
		name  string
		order []string
	}{
		{"list, tombstone, replay", []string{"list", "tomb", "replay"}},
		{"list, replay, tombstone", []string{"list", "replay", "tomb"}},
		{"tombstone, list, replay, tombstone", []string{"tomb", "list", "replay", "tomb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := openReplica(t, 2, 3, nil) // N: members A, B, N
			seenTomb := false
			for _, step := range tc.order {
				switch step {
				case "list":
					if _, err := n.MergeFormer(ctx, p.Former()); err != nil {
						t.Fatal(err)
					}
				case "tomb":
					_, err := n.MergeSnapshot(ctx, tomb)
					if held, del := deleted(n, svc); held && del {
						seenTomb = true
					} else if err == nil {
						t.Fatalf("tombstone neither held nor refused")
					}
				case "replay":
					if _, err := n.MergeSnapshot(ctx, stale); err != nil && !errors.Is(err, ErrNotMember) {
						t.Fatal(err)
					}
				}
				if held, del := deleted(n, svc); held && !del && (seenTomb || step == "tomb") {
					t.Fatalf("after %s: deleted service S is active at N (fields %v)", step, n.Fields(svc))
				}
			}
			if held, del := deleted(n, svc); !held || !del {
				t.Fatalf("S at N: held %v, deleted %v; want deleted", held, del)
			}
			if !slices.EqualFunc(stateOf(n), stateOf(p), bytes.Equal) {
				t.Fatal("N and the peer differ")
			}
		})
	}
}

// TestFormerPastLastRefused: a former member's field past its last
// counter (or at counter 0) is refused with ErrFormerMember and counted,
// while the rest of its snapshot merges; up to the last it is accepted.
func TestFormerPastLastRefused(t *testing.T) {
	ctx := context.Background()
	p := peerWithD(t) // D former at 2
	svc := testSvc(8)
	res, err := p.MergeSnapshot(ctx, snapOf(mkField(authD, svc, "late", "x", 1, 3), mkField(authA, svc, "ok", "y", 1, 5)))
	mustIs(t, err, ErrFormerMember)
	if res.Accepted != 1 || res.Rejected != 1 || res.Refused.Former != 1 || len(p.Fields(svc)) != 1 {
		t.Fatalf("past last: %+v", res)
	}
	if _, err := p.MergeFields(ctx, []Field{mkField(authD, svc, "zero", "x", 1, 0)}); !errors.Is(err, ErrFormerMember) {
		t.Fatalf("counter 0: %v", err)
	}
	if got := p.Refused().Former; got != 2 {
		t.Fatalf("Refused().Former %d, want 2", got)
	}
	res, err = p.MergeFields(ctx, []Field{mkField(authD, svc, "old", "x", 1, 2)})
	if err != nil || res.Accepted != 1 {
		t.Fatalf("at last counter: %+v %v", res, err)
	}
	// A non-member that never was one keeps its own error.
	if _, err := p.MergeFields(ctx, []Field{mkField(9, svc, "k", "x", 1, 1)}); !errors.Is(err, ErrNotMember) || errors.Is(err, ErrFormerMember) {
		t.Fatalf("never a member: %v", err)
	}
}

// TestFormerBoundaries: last counters at MaxClock-1 and MaxClock, an entry
// above MaxClock, and fields at and past the last.
func TestFormerBoundaries(t *testing.T) {
	ctx := context.Background()
	d := authorOf(testKey(authD))
	svc := testSvc(9)
	for _, last := range []uint64{MaxClock - 1, MaxClock} {
		r := openReplica(t, 0, 3, nil)
		if ch, err := r.MergeFormer(ctx, []FormerMember{{d, last}}); err != nil || !ch {
			t.Fatalf("last %d: %v %v", last, ch, err)
		}
		if _, err := r.MergeFields(ctx, []Field{mkField(authD, svc, "a", "x", 1, last)}); err != nil {
			t.Fatalf("field at last %d: %v", last, err)
		}
		_, err := r.MergeFields(ctx, []Field{mkField(authD, svc, "b", "x", 1, last+1)})
		want := ErrFormerMember
		if last == MaxClock {
			want = ErrLamportRange // past MaxClock is out of range for everyone
		}
		mustIs(t, err, want)
	}
	r := openReplica(t, 0, 3, nil)
	_, err := r.MergeFormer(ctx, []FormerMember{{authorOf(testKey(4)), 5}, {d, MaxClock + 1}})
	mustIs(t, err, ErrLamportRange)
	if len(r.Former()) != 0 || r.Refused().Former != 1 {
		t.Fatalf("refused list changed state: %+v %+v", r.Former(), r.Refused())
	}
}

// TestFormerSelfContinues: a member re-added with a fresh store continues
// its counters past the last the list holds, across a restart too; at
// MaxClock it can sign nothing more.
func TestFormerSelfContinues(t *testing.T) {
	ctx := context.Background()
	d := authorOf(testKey(authD))
	store := NewMemStore()
	r := openReplica(t, authD, 4, store)
	if _, err := r.MergeFormer(ctx, []FormerMember{{d, 500}}); err != nil {
		t.Fatal(err)
	}
	if r.Counter(d) != 500 {
		t.Fatalf("counter %d after the list, want 500", r.Counter(d))
	}
	fs, err := r.Edit(ctx, testSvc(1), NoRevision, Edit{Key: "k"})
	if err != nil || fs[0].Counter != 501 {
		t.Fatalf("edit after the list: %+v %v", fs, err)
	}
	// A lower entry changes nothing.
	if ch, err := r.MergeFormer(ctx, []FormerMember{{d, 400}}); err != nil || ch || r.Counter(d) != 501 {
		t.Fatalf("lower entry: %v %v %d", ch, err, r.Counter(d))
	}
	_ = r.Close()
	r2 := openReplica(t, authD, 4, store.Reopen())
	fs, err = r2.Edit(ctx, testSvc(2), NoRevision, Edit{Key: "k"})
	if err != nil || fs[0].Counter <= 501 {
		t.Fatalf("edit after restart: %+v %v", fs, err)
	}
	_ = r2.Close()

	for _, tc := range []struct {
		last uint64
		ok   bool
	}{{MaxClock - 1, true}, {MaxClock, false}} {
		r := openReplica(t, authD, 4, nil)
		if _, err := r.MergeFormer(ctx, []FormerMember{{d, tc.last}}); err != nil {
			t.Fatal(err)
		}
		fs, err := r.Edit(ctx, testSvc(3), NoRevision, Edit{Key: "k"})
		if tc.ok {
			if err != nil || fs[0].Counter != MaxClock {
				t.Fatalf("last %d: %+v %v", tc.last, fs, err)
			}
			_, err = r.Edit(ctx, testSvc(4), NoRevision, Edit{Key: "k"})
		}
		mustIs(t, err, ErrLamportRange)
	}
}

// TestFormerOnOpen: an agent restarted with a config that lacks D records
// D as former, with the last counter of D's held fields; a version-1
// store takes the config's members and rewrites its meta record.
func TestFormerOnOpen(t *testing.T) {
	ctx := context.Background()
	store := NewMemStore()
	r := openReplica(t, 0, 4, store) // A, B, N, D
	stale, tomb := trapFields()
	for _, s := range [][]byte{stale, tomb} {
		if _, err := r.MergeSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	_ = r.Close()
	r = openReplica(t, 0, 3, store.Reopen()) // config lacks D
	want := []FormerMember{{authorOf(testKey(authD)), 2}}
	if got := r.Former(); !slices.Equal(got, want) || len(r.Members()) != 3 {
		t.Fatalf("after restart without D: former %+v, members %d", got, len(r.Members()))
	}
	_ = r.Close()
	// Persisted: a third start sees the same without D's fields' help.
	r = openReplica(t, 0, 3, store.Reopen())
	if got := r.Former(); !slices.Equal(got, want) {
		t.Fatalf("after a second restart: %+v", got)
	}
	_ = r.Close()

	// Version 1: members are the config's, no former list, rewritten.
	v1 := NewMemStore()
	m := meta{network: testNet, lamport: 2, counter: map[AuthorID]uint64{}}
	if err := v1.Commit(ctx, Batch{Meta: encodeMetaV1(&m)}); err != nil {
		t.Fatal(err)
	}
	r = openReplica(t, 0, 4, v1)
	if len(r.Former()) != 0 || len(r.Members()) != 4 || r.Lamport() != 2 {
		t.Fatalf("version 1: former %+v, members %d", r.Former(), len(r.Members()))
	}
	_ = r.Close()
	recs, _ := v1.Reopen().Load(ctx)
	got, err := decodeMeta(recs.Meta)
	if err != nil || got.version != metaVersion || len(got.members) != 4 {
		t.Fatalf("version 1 record not rewritten: %+v %v", got, err)
	}
	r = openReplica(t, 0, 3, v1.Reopen())
	if got := r.Former(); len(got) != 1 || got[0].Author != authorOf(testKey(authD)) || got[0].LastCounter != 0 {
		t.Fatalf("after upgrade, restart without D: %+v", got)
	}
}

// TestSetMembersCommits: SetMembers commits before it returns, and a
// failed commit changes nothing.
func TestSetMembersCommits(t *testing.T) {
	ctx := context.Background()
	fs := &failStore{Store: NewMemStore()}
	r := openReplica(t, 0, 4, fs)
	fs.fail = 1
	if err := r.SetMembers(ctx, testMembers(3)); err == nil {
		t.Fatal("SetMembers with a failing commit returned nil")
	}
	if len(r.Members()) != 4 || len(r.Former()) != 0 {
		t.Fatalf("failed SetMembers changed state: %d members, former %+v", len(r.Members()), r.Former())
	}
	if err := r.SetMembers(ctx, testMembers(3)); err != nil {
		t.Fatal(err)
	}
	recs, _ := fs.Store.Load(ctx)
	got, err := decodeMeta(recs.Meta)
	if err != nil || len(got.members) != 3 || len(got.former) != 1 {
		t.Fatalf("committed meta: %+v %v", got, err)
	}
}

// formerModel is the list that merging every entry of lists must give:
// the highest counter per author, the lowest limit authors.
func formerModel(lists [][]FormerMember, limit int) []FormerMember {
	m := map[AuthorID]uint64{}
	for _, l := range lists {
		for _, e := range l {
			if old, ok := m[e.Author]; !ok || e.LastCounter > old {
				m[e.Author] = e.LastCounter
			}
		}
	}
	capFormer(m, limit)
	var out []FormerMember
	for _, a := range sortedAuthors(m) {
		out = append(out, FormerMember{a, m[a]})
	}
	return out
}

// TestFormerMergeProperties: at the cap, merging former lists is
// commutative, associative and idempotent: replicas that merge the same
// lists in random orders and groupings (some through each other) hold the
// model's list, and the drops are counted.
func TestFormerMergeProperties(t *testing.T) {
	ctx := context.Background()
	seed := testenv.Seed(t, 29)
	rng := rand.New(rand.NewPCG(seed, 29))
	const limit = 8
	for round := 0; round < 40; round++ {
		lists := make([][]FormerMember, 2+rng.IntN(5))
		for i := range lists {
			for range 1 + rng.IntN(10) {
				lists[i] = append(lists[i], FormerMember{authorOf(testKey(10 + rng.IntN(20))), uint64(rng.IntN(6))})
			}
		}
		want := formerModel(lists, limit)
		var reps []*Replica
		for range 3 {
			r, err := Open(ctx, Config{Network: testNet, Members: testMembers(2), Limits: Limits{MaxFormerMembers: limit}})
			if err != nil {
				t.Fatal(err)
			}
			reps = append(reps, r)
			order := rng.Perm(len(lists))
			for _, i := range order {
				l := slices.Clone(lists[i])
				rng.Shuffle(len(l), func(a, b int) { l[a], l[b] = l[b], l[a] })
				if _, err := r.MergeFormer(ctx, l); err != nil {
					t.Fatal(err)
				}
				if rng.IntN(3) == 0 { // a repeat changes nothing
					if ch, err := r.MergeFormer(ctx, l); err != nil || ch {
						t.Fatalf("seed %d: repeated list changed the state: %v %v", seed, ch, err)
					}
				}
			}
		}
		// Grouping: a fresh replica that takes another's whole list.
		via, err := Open(ctx, Config{Network: testNet, Members: testMembers(2), Limits: Limits{MaxFormerMembers: limit}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := via.MergeFormer(ctx, reps[0].Former()); err != nil {
			t.Fatal(err)
		}
		if _, err := via.MergeFormer(ctx, lists[rng.IntN(len(lists))]); err != nil {
			t.Fatal(err)
		}
		reps = append(reps, via)
		for i, r := range reps {
			if got := r.Former(); !slices.Equal(got, want) {
				t.Fatalf("seed %d round %d: replica %d holds %+v, model %+v", seed, round, i, got, want)
			}
			n := map[AuthorID]bool{}
			for _, l := range lists {
				for _, e := range l {
					n[e.Author] = true
				}
			}
			if i < 3 && len(n) > limit && r.OverLimit().FormerDropped == 0 {
				t.Fatalf("seed %d round %d: %d authors, limit %d, none counted dropped", seed, round, len(n), limit)
			}
			_ = r.Close()
		}
	}
}

// TestSetMembersCap: authors that leave past MaxFormerMembers keep the
// lowest ids and count the rest dropped.
func TestSetMembersCap(t *testing.T) {
	ctx := context.Background()
	all := testMembers(6)
	r, err := Open(ctx, Config{Network: testNet, Members: all, Limits: Limits{MaxFormerMembers: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.SetMembers(ctx, all[:2]); err != nil {
		t.Fatal(err)
	}
	left := memberSet(all[2:])
	got := r.Former()
	if len(got) != 2 || got[0].Author != left[0] || got[1].Author != left[1] || r.OverLimit().FormerDropped != 2 {
		t.Fatalf("former %+v, dropped %d", got, r.OverLimit().FormerDropped)
	}
}
