package crdt

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func snapOf(fields ...Field) []byte {
	s := Snapshot{Network: fields[0].Network, Service: fields[0].Service, Fields: fields}
	return s.Encode()
}

func TestVerificationRejects(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(1)
	// signWith signs f correctly except for the domain.
	signWith := func(domain string, f Field) Field {
		Sign(testKey(0), &f) // sets the author
		f.Signature = ed25519.Sign(testKey(0), signingMessage(nil, domain, f.appendUnsigned(nil)))
		return f
	}
	otherNet := mkField(0, svc, "k", "v", 1, 1)
	otherNet.Network[0] ^= 1
	Sign(testKey(0), &otherNet)
	withValueTomb := mkField(0, svc, TombstoneKey, "v", 1, 1)
	cases := []struct {
		name string
		f    Field
		want error
	}{
		{"wrong-network", otherNet, ErrWrongNetwork},
		{"no-domain", signWith("", Field{Network: testNet, Service: svc, Key: "k", Lamport: 1, Counter: 1}), ErrWrongDomain},
		{"domain-without-nul", signWith("tsunagi-vip-field/v1", Field{Network: testNet, Service: svc, Key: "k", Lamport: 1, Counter: 1}), ErrWrongDomain},
		{"other-version", signWith("tsunagi-vip-field/v2\x00", Field{Network: testNet, Service: svc, Key: "k", Lamport: 1, Counter: 1}), ErrWrongDomain},
		{"non-member", mkField(7, svc, "k", "v", 1, 1), ErrNotMember},
		{"reserved-key", mkField(0, svc, "\x00x", "v", 1, 1), ErrReservedKey},
		{"tombstone-with-value", withValueTomb, ErrBadTombstone},
		{"lamport-range", mkField(0, svc, "k", "v", MaxClock+1, 1), ErrLamportRange},
		{"counter-range", mkField(0, svc, "k", "v", 1, MaxClock+1), ErrLamportRange},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := openReplica(t, -1, 3, nil)
			if _, err := r.MergeSnapshot(ctx, snapOf(tc.f)); !errors.Is(err, tc.want) {
				t.Fatalf("snapshot: %v, want %v", err, tc.want)
			}
			if _, err := r.MergeFields(ctx, []Field{tc.f}); !errors.Is(err, tc.want) {
				t.Fatalf("fields: %v, want %v", err, tc.want)
			}
			if len(r.Services()) != 0 || r.Lamport() != 0 {
				t.Fatal("state changed")
			}
		})
	}
}

// TestTamperAnyByte changes each byte of a signed field in turn: every
// change is refused (by the decoder or by verification) and changes
// nothing.
func TestTamperAnyByte(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(1)
	f := mkField(1, svc, "listener/tcp/443", "backend-a:6443", 5, 3)
	good := snapOf(f)
	r := openReplica(t, -1, 3, nil)
	hdr := len(good) - f.EncodedLen()
	for i := hdr; i < len(good); i++ {
		for _, x := range []byte{0x01, 0x80} {
			b := bytes.Clone(good)
			b[i] ^= x
			res, err := r.MergeSnapshot(ctx, b)
			if err == nil || res.Accepted != 0 || len(r.Services()) != 0 {
				t.Fatalf("byte %d ^ %#x accepted: %+v %v", i-hdr, x, res, err)
			}
		}
	}
	// Untampered, it is accepted.
	if res, err := r.MergeSnapshot(ctx, good); err != nil || res.Accepted != 1 {
		t.Fatalf("good: %+v %v", res, err)
	}
}

// TestBatchFailureNamesBadFields: one bad signature among many refuses the
// snapshot, and the error names exactly the bad field.
func TestBatchFailureNamesBadFields(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(1)
	var fs []Field
	for i := 0; i < 40; i++ {
		fs = append(fs, mkField(i%3, svc, fmt.Sprintf("k%02d", i), "v", 1, uint64(i)))
	}
	fs[17].Signature = bytes.Clone(fs[17].Signature)
	fs[17].Signature[5] ^= 1
	r := openReplica(t, -1, 3, nil)
	_, err := r.MergeSnapshot(ctx, snapOf(fs...))
	mustIs(t, err, ErrBadSignature)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Key != "k17" {
		t.Fatalf("error does not name k17: %v", err)
	}
	if strings.Count(err.Error(), "bad signature") != 1 {
		t.Fatalf("more than one field named: %v", err)
	}
	if len(r.Services()) != 0 {
		t.Fatal("refused snapshot changed state")
	}
}

// TestMembershipLater: a non-member's field is not stored; once the
// author becomes a member, the same snapshot is accepted.
func TestMembershipLater(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(1)
	snap := snapOf(mkField(0, svc, "a", "1", 1, 1), mkField(5, svc, "b", "2", 1, 1))
	r := openReplica(t, -1, 1, nil)
	res, err := r.MergeSnapshot(ctx, snap)
	mustIs(t, err, ErrNotMember)
	if res.Accepted != 1 || res.Rejected != 1 || len(r.Fields(svc)) != 1 {
		t.Fatalf("non-member field: %+v", res)
	}
	if err := r.SetMembers(ctx, append(testMembers(1), authorOf(testKey(5)))); err != nil {
		t.Fatal(err)
	}
	if len(r.Members()) != 2 {
		t.Fatal("members")
	}
	res, err = r.MergeSnapshot(ctx, snap)
	if err != nil || res.Accepted != 1 || res.Identical != 1 || len(r.Fields(svc)) != 2 {
		t.Fatalf("after membership: %+v %v", res, err)
	}
	// Removing a member keeps what is held but refuses its new fields:
	// it is a former member, its last counter the 1 of its held field.
	if err := r.SetMembers(ctx, testMembers(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.MergeFields(ctx, []Field{mkField(5, svc, "c", "3", 2, 2)}); !errors.Is(err, ErrFormerMember) {
		t.Fatalf("removed member: %v", err)
	}
	if len(r.Fields(svc)) != 2 {
		t.Fatal("held fields dropped with the member")
	}
}

func TestMergeOrder(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(1)
	lo, hi := 0, 1
	if bytes.Compare(authorOf(testKey(0)).slice(), authorOf(testKey(1)).slice()) > 0 {
		lo, hi = 1, 0
	}
	cases := []struct {
		name      string
		win, lose Field
	}{
		{"lamport", mkField(lo, svc, "k", "new", 9, 1), mkField(hi, svc, "k", "old", 8, 50)},
		{"author", mkField(hi, svc, "k", "b", 9, 1), mkField(lo, svc, "k", "a", 9, 99)},
		{"bytes", mkField(lo, svc, "k", "b", 9, 1), mkField(lo, svc, "k", "a", 9, 1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if Compare(&tc.win, &tc.lose) <= 0 || Compare(&tc.lose, &tc.win) >= 0 || Compare(&tc.win, &tc.win) != 0 {
				t.Fatal("Compare disagrees")
			}
			for _, order := range [][]Field{{tc.win, tc.lose}, {tc.lose, tc.win}} {
				r := openReplica(t, -1, 2, nil)
				for _, f := range order {
					if _, err := r.MergeFields(ctx, []Field{f}); err != nil {
						t.Fatal(err)
					}
				}
				got := r.Fields(svc)
				if len(got) != 1 || !got[0].Equal(&tc.win) {
					t.Fatalf("winner %v, want %v", got, &tc.win)
				}
			}
		})
	}
}

func (a AuthorID) slice() []byte { return a[:] }

func TestEditLamportAndCounters(t *testing.T) {
	ctx := context.Background()
	st := NewMemStore()
	svc := testSvc(1)
	r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(2), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.MergeFields(ctx, []Field{mkField(1, svc, "x", "1", 100, 1)}); err != nil {
		t.Fatal(err)
	}
	info, _ := r.Service(svc)
	fs, err := r.Edit(ctx, svc, info.Revision, Edit{Key: "x", Value: []byte("2")}, Edit{Key: "y", Clear: true})
	if err != nil {
		t.Fatal(err)
	}
	if fs[0].Lamport != 101 || fs[0].Counter != 1 || fs[1].Counter != 2 || fs[1].HasValue {
		t.Fatalf("edit fields %v %v", &fs[0], &fs[1])
	}
	if got := r.Fields(svc); string(got[0].Value) != "2" {
		t.Fatal("local edit did not win")
	}
	_ = r.Close()

	// Reopen: the counter and the Lamport clock continue.
	r, err = Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(2), Store: st.Reopen()})
	if err != nil {
		t.Fatal(err)
	}
	info, _ = r.Service(svc)
	fs, err = r.Edit(ctx, svc, info.Revision, Edit{Key: "x", Value: []byte("3")})
	if err != nil {
		t.Fatal(err)
	}
	// Counters reserved before the restart are skipped.
	if fs[0].Counter <= 2 || fs[0].Lamport != 102 {
		t.Fatalf("after reopen: counter %d lamport %d", fs[0].Counter, fs[0].Lamport)
	}
	last := fs[0].Counter
	_ = r.Close()

	// A replica that lost its store learns its own counter back from a
	// snapshot and never reuses it.
	fresh := openReplica(t, 0, 2, nil)
	snap, _ := func() ([]byte, bool) {
		r, _ := Open(ctx, Config{Network: testNet, Store: st.Reopen()})
		defer r.Close()
		return r.EncodedSnapshot(svc)
	}()
	if _, err := fresh.MergeSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if fresh.Counter(authorOf(testKey(0))) != last {
		t.Fatalf("own counter %d, want %d", fresh.Counter(authorOf(testKey(0))), last)
	}
	info, _ = fresh.Service(svc)
	fs, err = fresh.Edit(ctx, svc, info.Revision, Edit{Key: "z", Value: nil})
	if err != nil || fs[0].Counter != last+1 {
		t.Fatalf("counter after restore: %v %v", fs, err)
	}
}

func TestEditErrors(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, 0, 2, nil)
	ro := openReplica(t, -1, 2, nil)
	svc := testSvc(1)
	if _, err := ro.Edit(ctx, svc, NoRevision, Edit{Key: "a"}); !errors.Is(err, ErrNoSigner) {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edits []Edit
		want  error
	}{
		{nil, ErrBadEdit},
		{[]Edit{{Key: "a"}, {Key: "a"}}, ErrBadEdit},
		{[]Edit{{Key: ""}}, ErrEmptyKey},
		{[]Edit{{Key: TombstoneKey}}, ErrReservedKey},
		{[]Edit{{Key: strings.Repeat("k", 257)}}, ErrKeyTooLong},
		{[]Edit{{Key: "a", Value: make([]byte, 8193)}}, ErrValueTooLarge},
	} {
		if _, err := r.Edit(ctx, svc, NoRevision, tc.edits...); !errors.Is(err, tc.want) {
			t.Fatalf("%v: %v, want %v", tc.edits, err, tc.want)
		}
	}
	if _, err := r.Edit(ctx, svc, NoRevision, Edit{Key: "a", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	info, _ := r.Service(svc)
	if _, err := r.Edit(ctx, svc, NoRevision, Edit{Key: "a"}); !errors.Is(err, ErrStaleRevision) {
		t.Fatalf("stale draft: %v", err)
	}
	if _, err := r.Edit(ctx, svc, info.Revision, Edit{Key: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Edit(ctx, svc, info.Revision, Edit{Key: "c"}); !errors.Is(err, ErrStaleRevision) {
		t.Fatalf("stale draft after change: %v", err)
	}
	if _, err := r.Edit(ctx, svc, AnyRevision, Edit{Key: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Delete(ctx, testSvc(9), AnyRevision); !errors.Is(err, ErrUnknownService) {
		t.Fatalf("delete unknown: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Edit(cctx, svc, AnyRevision, Edit{Key: "d"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

func TestTombstone(t *testing.T) {
	ctx := context.Background()
	a := openReplica(t, 0, 2, nil)
	b := openReplica(t, 1, 2, nil)
	svc := testSvc(1)
	if _, err := a.Edit(ctx, svc, NoRevision, Edit{Key: "name", Value: []byte("api")}, Edit{Key: "port", Value: []byte("443")}); err != nil {
		t.Fatal(err)
	}
	old, _ := a.EncodedSnapshot(svc)
	if _, err := b.MergeSnapshot(ctx, old); err != nil {
		t.Fatal(err)
	}
	// b edits concurrently with a's deletion, with a higher Lamport clock.
	for i := 0; i < 3; i++ {
		if _, err := b.Edit(ctx, svc, AnyRevision, Edit{Key: "port", Value: []byte(fmt.Sprint(8000 + i))}); err != nil {
			t.Fatal(err)
		}
	}
	later, _ := b.EncodedSnapshot(svc)
	tomb, err := a.Delete(ctx, svc, AnyRevision)
	if err != nil || !tomb.IsTombstone() {
		t.Fatalf("delete: %v", err)
	}
	info, _ := a.Service(svc)
	if !info.Deleted || info.Fields != 0 || a.Fields(svc) != nil {
		t.Fatalf("deleted service holds fields: %+v", info)
	}
	// Replays and later edits never resurrect it.
	for _, s := range [][]byte{old, later} {
		res, err := a.MergeSnapshot(ctx, s)
		if err != nil || res.Ignored == 0 || len(res.Changed) != 0 {
			t.Fatalf("replay: %+v %v", res, err)
		}
	}
	if _, err := a.Edit(ctx, svc, AnyRevision, Edit{Key: "x"}); !errors.Is(err, ErrDeleted) {
		t.Fatalf("edit deleted: %v", err)
	}
	// b receives the tombstone: its fields go, and both hold the same.
	ts, _ := a.EncodedSnapshot(svc)
	if _, err := b.MergeSnapshot(ctx, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := b.MergeSnapshot(ctx, later); err != nil {
		t.Fatal(err)
	}
	if !equalState(stateOf(a), stateOf(b)) {
		t.Fatal("replicas differ after deletion")
	}
	if bi, _ := b.Service(svc); !bi.Deleted {
		t.Fatal("b did not delete")
	}
	// A recreated service takes a fresh id.
	id, err := NewServiceID(nil)
	if err != nil || id == svc {
		t.Fatal(err)
	}
	if _, err := a.Edit(ctx, id, NoRevision, Edit{Key: "name", Value: []byte("api")}); err != nil {
		t.Fatal(err)
	}
}

func TestLimits(t *testing.T) {
	ctx := context.Background()
	lim := Limits{MaxServices: 2, MaxTombstones: 1, MaxFieldsPerService: 3, MaxSnapshotBytes: 2048}
	r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(2), Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := 0; i < 2; i++ {
		if _, err := r.Edit(ctx, testSvc(i), NoRevision, Edit{Key: "n"}); err != nil {
			t.Fatal(err)
		}
	}
	// Active services: a local creation past the limit is refused.
	if _, err := r.Edit(ctx, testSvc(2), NoRevision, Edit{Key: "n"}); !errors.Is(err, ErrServiceLimit) {
		t.Fatalf("service limit: %v", err)
	}
	// Deleted services do not count toward the active limit.
	if _, err := r.Delete(ctx, testSvc(0), AnyRevision); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Edit(ctx, testSvc(2), NoRevision, Edit{Key: "n"}); err != nil {
		t.Fatalf("after delete: %v", err)
	}
	// Tombstones: a full history is an error; nothing is evicted.
	if _, err := r.Delete(ctx, testSvc(1), AnyRevision); !errors.Is(err, ErrTombstoneLimit) {
		t.Fatalf("tombstone limit: %v", err)
	}
	if info, _ := r.Service(testSvc(1)); info.Deleted {
		t.Fatal("refused deletion applied")
	}
	if info, _ := r.Service(testSvc(0)); !info.Deleted {
		t.Fatal("tombstone evicted")
	}
	if o := r.OverLimit(); !errors.Is(o.Err, ErrTombstoneLimit) || o.Tombstones != 1 || o.Authors[authorOf(testKey(0))] != 1 {
		t.Fatalf("full history not reported: %+v", o)
	}
	// A merged service past the limit is held, reported and not routed.
	remote := snapOf(mkField(1, testSvc(3), "n", "", 1, 1))
	if _, err := r.MergeSnapshot(ctx, remote); err != nil {
		t.Fatalf("remote service past the limit: %v", err)
	}
	if err := r.ServiceError(testSvc(3)); !errors.Is(err, ErrServiceLimit) || !strings.Contains(err.Error(), authorOf(testKey(1)).String()[:16]) {
		t.Fatalf("remote service past the limit: error state %v", err)
	}
	if o := r.OverLimit(); len(o.Services) != 1 || o.Services[0] != testSvc(3) || !errors.Is(o.Err, ErrServiceLimit) {
		t.Fatalf("over limit: %+v", o)
	}
	// Fields per service: a local edit past the limit is refused; a merge
	// past it is held up to the hard cap (6) and reported.
	svc := testSvc(1)
	if _, err := r.Edit(ctx, svc, AnyRevision, Edit{Key: "a"}, Edit{Key: "b"}, Edit{Key: "c"}); !errors.Is(err, ErrFieldLimit) {
		t.Fatalf("field limit: %v", err)
	}
	if _, err := r.Edit(ctx, svc, AnyRevision, Edit{Key: "a"}, Edit{Key: "b"}); err != nil {
		t.Fatal(err)
	}
	big := snapOf(mkField(1, svc, "x", "", 50, 1), mkField(1, svc, "y", "", 50, 2))
	if _, err := r.MergeSnapshot(ctx, big); err != nil {
		t.Fatalf("remote fields past the limit: %v", err)
	}
	if err := r.ServiceError(svc); !errors.Is(err, ErrFieldLimit) || len(r.Fields(svc)) != 5 {
		t.Fatalf("service error state: %v, %d fields", err, len(r.Fields(svc)))
	}
	bigger := snapOf(mkField(1, svc, "z1", "", 50, 3), mkField(1, svc, "z2", "", 50, 4))
	if _, err := r.MergeSnapshot(ctx, bigger); !errors.Is(err, ErrFieldLimit) {
		t.Fatalf("remote fields past the hard cap: %v", err)
	}
	if len(r.Fields(svc)) != 5 {
		t.Fatal("refused merge changed the service")
	}
	// An edit that does not add fields still works on it.
	if _, err := r.Edit(ctx, svc, AnyRevision, Edit{Key: "a", Clear: true}); err != nil {
		t.Fatalf("edit of a service past the limit: %v", err)
	}
	// Control frame limit, on edit and on receipt.
	if _, err := r.Edit(ctx, testSvc(2), AnyRevision, Edit{Key: "v", Value: make([]byte, 2100)}); !errors.Is(err, ErrSnapshotTooLarge) {
		t.Fatalf("frame limit on edit: %v", err)
	}
	huge := snapOf(mkField(1, testSvc(2), "v", strings.Repeat("x", 2100), 60, 9))
	if _, err := r.MergeSnapshot(ctx, huge); !errors.Is(err, ErrSnapshotTooLarge) {
		t.Fatalf("frame limit on receipt: %v", err)
	}
	if _, err := Open(ctx, Config{Limits: Limits{MaxServices: -1}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad limits: %v", err)
	}
}

func TestObsoleteAndServiceError(t *testing.T) {
	ctx := context.Background()
	// The schema: "gen" holds the listener generation; "b/<gen>/..." are
	// backend fields of that generation; older generations are obsolete.
	obs := func(_ ServiceID, fs []Field) []string {
		gen := ""
		for _, f := range fs {
			if f.Key == "gen" {
				gen = string(f.Value)
			}
		}
		var drop []string
		for _, f := range fs {
			if strings.HasPrefix(f.Key, "b/") && !strings.HasPrefix(f.Key, "b/"+gen+"/") {
				drop = append(drop, f.Key)
			}
		}
		return drop
	}
	r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(2), Obsolete: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	svc := testSvc(1)
	if _, err := r.Edit(ctx, svc, NoRevision, Edit{Key: "gen", Value: []byte("1")}, Edit{Key: "b/1/x", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	old, _ := r.EncodedSnapshot(svc)
	if _, err := r.Edit(ctx, svc, AnyRevision, Edit{Key: "gen", Value: []byte("2")}, Edit{Key: "b/2/y", Value: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	keys := func() (out []string) {
		for _, f := range r.Fields(svc) {
			out = append(out, f.Key)
		}
		return out
	}
	if got := strings.Join(keys(), ","); got != "b/2/y,gen" {
		t.Fatalf("fields %s", got)
	}
	// Replaying the old generation's backend does not bring it back.
	if _, err := r.MergeSnapshot(ctx, old); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(keys(), ","); got != "b/2/y,gen" {
		t.Fatalf("after replay %s", got)
	}
	schemaErr := errors.New("vip: too many backends")
	r.SetServiceError(svc, schemaErr)
	if info, _ := r.Service(svc); !errors.Is(info.Err, schemaErr) {
		t.Fatal("service error not held")
	}
	r.SetServiceError(svc, nil)
	if r.ServiceError(svc) != nil {
		t.Fatal("service error not cleared")
	}
}

func TestCommitFailureLeavesState(t *testing.T) {
	ctx := context.Background()
	mem := NewMemStore()
	st := &failStore{Store: mem}
	r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(2), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Edit(ctx, testSvc(1), NoRevision, Edit{Key: "a", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	before, lam, ctr := stateOf(r), r.Lamport(), r.Counter(r.Author())
	snaps := [][]byte{snapOf(mkField(1, testSvc(2), "x", "", 5, 1)), snapOf(mkField(1, testSvc(3), "y", "", 5, 2))}
	st.fail = 1
	if _, err := r.MergeSnapshots(ctx, snaps); err == nil {
		t.Fatal("commit failure not reported")
	}
	st.fail = 1
	if _, err := r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "a", Value: []byte("2")}); err == nil {
		t.Fatal("edit commit failure not reported")
	}
	if !equalState(stateOf(r), before) || r.Lamport() != lam {
		t.Fatal("failed commit changed the replica")
	}
	if r.Counter(r.Author()) != ctr+1 {
		t.Fatalf("the failed edit's counter is not spent: %d, was %d", r.Counter(r.Author()), ctr)
	}
	_ = r.Close()
	r2, err := Open(ctx, Config{Network: testNet, Store: mem.Reopen()})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if !equalState(stateOf(r2), before) {
		t.Fatal("failed commit changed the store")
	}
}

func TestOpenRefusesBadStore(t *testing.T) {
	ctx := context.Background()
	mk := func() *MemStore {
		st := NewMemStore()
		r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Store: st})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Edit(ctx, testSvc(1), NoRevision, Edit{Key: "a", Value: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		_ = r.Close()
		return st.Reopen()
	}
	for _, tc := range []struct {
		name   string
		damage func(*MemStore)
		net    NetworkID
		want   error
	}{
		{"corrupt-service", func(s *MemStore) { corruptMem(s, testSvc(1)) }, testNet, ErrCorrupt},
		{"corrupt-meta", func(s *MemStore) { corruptMem(s, ServiceID{}) }, testNet, ErrCorrupt},
		{"unknown-version", func(s *MemStore) { setMemVersion(s, 9) }, testNet, ErrUnknownVersion},
		{"other-network", func(*MemStore) {}, NetworkID{9}, ErrWrongNetwork},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := mk()
			tc.damage(st)
			_, err := Open(ctx, Config{Network: tc.net, Store: st})
			mustIs(t, err, tc.want)
			// Nothing was reset: undamaged, it opens with its content.
			if tc.name == "other-network" {
				r, err := Open(ctx, Config{Network: testNet, Store: st.Reopen()})
				if err != nil || len(r.Services()) != 1 {
					t.Fatalf("store reset: %v", err)
				}
				_ = r.Close()
			}
		})
	}
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, err := r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "a"}); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, err := r.MergeFields(ctx, []Field{mkField(0, testSvc(1), "a", "", 1, 1)}); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

// TestConcurrentUse runs edits, merges and reads at once (for -race).
func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	a := openReplica(t, 0, 3, nil)
	b := openReplica(t, 1, 3, nil)
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				svc := testSvc(i % 4)
				src, dst := a, b
				if w == 1 {
					src, dst = b, a
				}
				if w == 2 {
					_ = a.Services()
					_ = b.Fields(svc)
					_, _ = a.EncodedSnapshot(svc)
					a.SetServiceError(svc, nil)
					continue
				}
				if _, err := src.Edit(ctx, svc, AnyRevision, Edit{Key: fmt.Sprint("k", i%5), Value: []byte{byte(i)}}); err != nil {
					t.Error(err)
					return
				}
				s, _ := src.EncodedSnapshot(svc)
				if _, err := dst.MergeSnapshot(ctx, s); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := 0; i < 4; i++ {
		s, _ := a.EncodedSnapshot(testSvc(i))
		if _, err := b.MergeSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
		s, _ = b.EncodedSnapshot(testSvc(i))
		if _, err := a.MergeSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if !equalState(stateOf(a), stateOf(b)) {
		t.Fatal("replicas differ")
	}
}

// TestMissingFieldIsNotDeletion: a snapshot without a held field leaves it.
func TestMissingFieldIsNotDeletion(t *testing.T) {
	ctx := context.Background()
	svc := testSvc(1)
	r := openReplica(t, -1, 2, nil)
	a, b := mkField(0, svc, "a", "1", 1, 1), mkField(1, svc, "b", "2", 1, 1)
	if _, err := r.MergeSnapshot(ctx, snapOf(a, b)); err != nil {
		t.Fatal(err)
	}
	a2 := mkField(1, svc, "a", "3", 2, 2)
	res, err := r.MergeSnapshot(ctx, snapOf(a2))
	if err != nil || res.Accepted != 1 {
		t.Fatal(res, err)
	}
	got := r.Fields(svc)
	if len(got) != 2 || !got[0].Equal(&a2) || !got[1].Equal(&b) {
		t.Fatalf("fields after partial snapshot: %v", got)
	}
}

// TestMergeSnapshotsIndependent: in one call, a refused snapshot does not
// stop the others, and all accepted ones commit together.
func TestMergeSnapshotsIndependent(t *testing.T) {
	ctx := context.Background()
	r := openReplica(t, -1, 2, nil)
	good1 := snapOf(mkField(0, testSvc(1), "a", "1", 1, 1))
	good2 := snapOf(mkField(1, testSvc(2), "a", "1", 1, 1))
	bad := mkField(0, testSvc(3), "a", "1", 1, 1)
	bad.Signature = bytes.Clone(bad.Signature)
	bad.Signature[0] ^= 1
	res, err := r.MergeSnapshots(ctx, [][]byte{good1, []byte("garbage"), snapOf(bad), good2})
	mustIs(t, err, ErrBadSignature)
	mustIs(t, err, ErrUnknownVersion)
	if len(res.Changed) != 2 || res.Changed[0] != testSvc(1) || res.Changed[1] != testSvc(2) || len(r.Services()) != 2 {
		t.Fatalf("result %+v", res)
	}
}
