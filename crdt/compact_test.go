package crdt

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"slices"
	"strings"
	"testing"
)

// ackAll gathers the acknowledgements of c from rs (errors fail the test).
func ackAll(t testing.TB, c Compaction, rs ...*Replica) Certificate {
	t.Helper()
	cert := Certificate{Compaction: c}
	for _, r := range rs {
		a, err := r.Acknowledge(context.Background(), c)
		if err != nil {
			t.Fatalf("acknowledge by %s: %v", r.Author(), err)
		}
		cert.Acks = append(cert.Acks, a)
	}
	slices.SortFunc(cert.Acks, func(a, b Ack) int { return bytes.Compare(a.Author[:], b.Author[:]) })
	return cert
}

// churn creates and deletes n services on r, publishing to rs.
func churn(t testing.TB, r *Replica, n int, rs []*Replica) []ServiceID {
	t.Helper()
	ctx := context.Background()
	var ids []ServiceID
	for i := 0; i < n; i++ {
		id, err := createService(ctx, r, "x")
		if err != nil {
			t.Fatal(err)
		}
		publish(t, r, id, rs)
		if _, err := r.Delete(ctx, id, AnyRevision); err != nil {
			t.Fatal(err)
		}
		publish(t, r, id, rs)
		ids = append(ids, id)
	}
	return ids
}

// TestCompactionStallNamesMember: a member that never acknowledges stalls
// compaction; the full history's error names it; removing it from the
// member set unblocks compaction.
func TestCompactionStallNamesMember(t *testing.T) {
	ctx := context.Background()
	lim := Limits{MaxTombstones: 8}
	open := func(i int) *Replica {
		r, err := Open(ctx, Config{Network: testNet, Signer: testKey(i), Members: testMembers(3), Limits: lim})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	rs := []*Replica{open(0), open(1), open(2)}
	low := lowest(rs)
	var silent *Replica
	for _, r := range rs {
		if r != low {
			silent = r
			break
		}
	}
	churn(t, low, 8, rs)
	c, ok, err := low.Propose()
	if err != nil || !ok {
		t.Fatalf("propose: %v %v", ok, err)
	}
	var others []*Replica
	for _, r := range rs {
		if r != silent {
			others = append(others, r)
		}
	}
	cert := ackAll(t, c, others...)
	res, err := low.AddCertificate(ctx, cert)
	if err != nil || res.Applied || len(res.Missing) != 1 || res.Missing[0] != silent.Author() {
		t.Fatalf("stalled certificate: %+v %v", res, err)
	}
	_, err = createService(ctx, low, "y")
	if err != nil {
		t.Fatal(err)
	}
	id := low.Services()[0].ID
	for _, in := range low.Services() {
		if !in.Deleted {
			id = in.ID
		}
	}
	_, err = low.Delete(ctx, id, AnyRevision)
	if !errors.Is(err, ErrTombstoneLimit) || !strings.Contains(err.Error(), silent.Author().String()) {
		t.Fatalf("deletion past the cap: %v; want ErrTombstoneLimit naming %s", err, silent.Author())
	}
	t.Logf("refused as wanted: %v", err)
	if o := low.OverLimit(); !strings.Contains(o.Err.Error(), silent.Author().String()) {
		t.Fatalf("OverLimit does not name the member: %v", o.Err)
	}
	// The reload removes the silent member: it no longer counts, and the
	// next proposal completes without it.
	var keep []AuthorID
	for _, r := range others {
		keep = append(keep, r.Author())
	}
	for _, r := range others {
		if err := r.SetMembers(ctx, keep); err != nil {
			t.Fatal(err)
		}
	}
	c, ok, err = low.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	res, err = low.AddCertificate(ctx, ackAll(t, c, others...))
	if err != nil || !res.Applied {
		t.Fatalf("after removal: %+v %v", res, err)
	}
	if n := low.OverLimit().Tombstones; n != 0 {
		t.Fatalf("%d markers held after compaction", n)
	}
	if _, err := low.Delete(ctx, id, AnyRevision); err != nil {
		t.Fatalf("deletion after compaction: %v", err)
	}
}

// TestCompactionReturningAndJoining: a member away during a compaction
// returns holding a deleted service live and stale tombstones; a node that
// joins later verifies the certificate made before it joined. Neither
// revives anything, and replays of every field are refused.
func TestCompactionReturningAndJoining(t *testing.T) {
	ctx := context.Background()
	members := testMembers(4) // number 3 joins later
	open := func(i int, m []AuthorID, st Store) *Replica {
		r, err := Open(ctx, Config{Network: testNet, Signer: testKey(i), Members: m, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	rs := []*Replica{open(0, members[:3], nil), open(1, members[:3], nil), open(2, members[:3], nil)}
	low := lowest(rs)
	var away *Replica
	for _, r := range rs {
		if r != low {
			away = r
		}
	}
	// A service that away holds live, deleted while away is away.
	keep, err := createService(ctx, low, "keep")
	if err != nil {
		t.Fatal(err)
	}
	publish(t, low, keep, rs)
	doomed, err := createService(ctx, low, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	publish(t, low, doomed, rs)
	var all [][]byte // every snapshot ever published
	snap, _ := low.EncodedSnapshot(doomed)
	all = append(all, snap)
	ids := churn(t, low, 20, rs)
	for _, id := range ids {
		s, _ := low.EncodedSnapshot(id)
		all = append(all, s)
	}
	var here []*Replica
	for _, r := range rs {
		if r != away {
			here = append(here, r)
		}
	}
	if _, err := low.Delete(ctx, doomed, AnyRevision); err != nil {
		t.Fatal(err)
	}
	publish(t, low, doomed, here)
	s, _ := low.EncodedSnapshot(doomed)
	all = append(all, s)
	// away must acknowledge; it can't while it holds doomed live.
	c, ok, err := low.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := away.Acknowledge(ctx, c); !errors.Is(err, ErrCompaction) {
		t.Fatalf("away acknowledged a compaction that deletes what it holds live: %v", err)
	}
	// The reload drops away; the others compact.
	for _, r := range here {
		if err := r.SetMembers(ctx, []AuthorID{here[0].Author(), here[1].Author()}); err != nil {
			t.Fatal(err)
		}
	}
	c, _, _ = low.Propose()
	cert := ackAll(t, c, here...)
	for _, r := range here {
		if res, err := r.AddCertificate(ctx, cert); err != nil || !res.Applied {
			t.Fatal(res, err)
		}
	}
	// away returns (re-added) and gets the certificate: doomed goes at once.
	back := []AuthorID{here[0].Author(), here[1].Author(), away.Author()}
	for _, r := range rs {
		if err := r.SetMembers(ctx, back); err != nil {
			t.Fatal(err)
		}
	}
	res, err := away.AddCertificate(ctx, cert)
	if err != nil || !res.Applied || !slices.Contains(res.Dropped, doomed) {
		t.Fatalf("returning member: %+v %v", res, err)
	}
	if _, ok := away.Service(doomed); ok {
		t.Fatal("doomed still held by the returning member")
	}
	// The next compaction names the returned member again.
	c, ok, err = low.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	cert = ackAll(t, c, rs...)
	for _, r := range rs {
		if res, err := r.AddCertificate(ctx, cert); err != nil || !res.Applied {
			t.Fatal(res, err)
		}
	}
	// A node that joins now verifies the certificate made before it
	// joined, and refuses every replay.
	joined := open(3, append(back, members[3]), nil)
	if res, err := joined.AddCertificate(ctx, cert); err != nil || !res.Applied {
		t.Fatalf("joining node: %+v %v", res, err)
	}
	ksnap, _ := low.EncodedSnapshot(keep)
	for _, r := range []*Replica{away, joined, low} {
		r.MergeSnapshots(ctx, all)
		if _, err := r.MergeSnapshot(ctx, ksnap); err != nil {
			t.Fatal(err)
		}
		for _, in := range r.Services() {
			if in.ID != keep {
				t.Fatalf("service %s (deleted %v) held after replays", in.ID, in.Deleted)
			}
		}
		if r.Refused().Deleted == 0 {
			t.Fatal("replays not counted")
		}
	}
	// A hostile member signs fresh fields for doomed: refused.
	fresh := mkField(1, doomed, "name", "back", 1<<40, 1<<40)
	if _, err := joined.MergeFields(ctx, []Field{fresh}); !errors.Is(err, ErrDeleted) {
		t.Fatalf("fresh field for a compacted id: %v", err)
	}
}

// TestCompactionEpochBounds: a compaction's epoch at MaxClock-1, MaxClock
// and past it.
func TestCompactionEpochBounds(t *testing.T) {
	ctx := context.Background()
	// The step rule (TestCompactionEpochStep) would take 2^31 rounds to
	// get here; lift it to test the bound itself.
	step := maxEpochStep
	maxEpochStep = MaxClock
	t.Cleanup(func() { maxEpochStep = step })
	a := openReplica(t, 0, 1, nil)
	churn(t, a, 2, nil)
	c, ok, err := a.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for _, tc := range []struct {
		epoch uint64
		ok    bool
	}{{MaxClock - 1, true}, {MaxClock, true}, {MaxClock + 1, false}} {
		c.Epoch = tc.epoch
		_, err := a.Acknowledge(ctx, c)
		if tc.ok != (err == nil) {
			t.Fatalf("epoch %d: %v", tc.epoch, err)
		}
		if !tc.ok {
			mustIs(t, err, ErrCompaction)
		}
	}
	c.Epoch = MaxClock
	cert := ackAll(t, c, a)
	if res, err := a.AddCertificate(ctx, cert); err != nil || !res.Applied {
		t.Fatal(res, err)
	}
	churn(t, a, 1, nil)
	if _, _, err := a.Propose(); !errors.Is(err, ErrLamportRange) {
		t.Fatalf("propose past the epoch bound: %v", err)
	}
	// The encoding refuses an epoch past the bound.
	c.Epoch = MaxClock + 1
	if _, err := DecodeCertificate((&Certificate{Compaction: c}).Encode()); !errors.Is(err, ErrCompaction) {
		t.Fatalf("decode: %v", err)
	}
}

// TestCompactionPersists: the certificate and the acknowledged compaction
// are in the store; a reopened replica refuses replays as before, and
// never acknowledges a lower epoch.
func TestCompactionPersists(t *testing.T) {
	ctx := context.Background()
	st := NewMemStore()
	a := openReplica(t, 0, 1, st)
	churn(t, a, 3, nil)
	var snaps [][]byte
	for _, in := range a.Services() {
		s, _ := a.EncodedSnapshot(in.ID)
		snaps = append(snaps, s)
	}
	c, _, _ := a.Propose()
	cert := ackAll(t, c, a)
	if res, err := a.AddCertificate(ctx, cert); err != nil || !res.Applied {
		t.Fatal(res, err)
	}
	_ = a.Close()
	b := openReplica(t, 0, 1, st.Reopen())
	if len(b.Services()) != 0 {
		t.Fatal("markers back after reopen")
	}
	b.MergeSnapshots(ctx, snaps)
	if len(b.Services()) != 0 || b.Refused().Deleted != uint64(2*len(snaps)) {
		t.Fatalf("replays after reopen: %d held, %d refused", len(b.Services()), b.Refused().Deleted)
	}
	if _, err := b.Acknowledge(ctx, c); !errors.Is(err, ErrCompaction) && err != nil {
		t.Fatal(err)
	}
	old := c
	old.Epoch = 0
	if _, err := b.Acknowledge(ctx, old); !errors.Is(err, ErrCompaction) {
		t.Fatalf("epoch 0: %v", err)
	}
}

// TestCertificateHostile: acknowledgements by non-members, bad
// signatures, and malformed encodings are refused and counted.
func TestCertificateHostile(t *testing.T) {
	ctx := context.Background()
	rs := []*Replica{openReplica(t, 0, 2, nil), openReplica(t, 1, 2, nil)}
	churn(t, rs[0], 2, rs)
	c, _, _ := lowest(rs).Propose()
	cert := ackAll(t, c, rs...)
	bad := cert
	bad.Acks = slices.Clone(cert.Acks)
	bad.Acks[0].Signature = bytes.Clone(bad.Acks[0].Signature)
	bad.Acks[0].Signature[3] ^= 1
	if _, err := rs[0].AddCertificate(ctx, bad); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("bad signature: %v", err)
	}
	outsider := Certificate{Compaction: c, Acks: []Ack{{Author: authorOf(testKey(5)), Signature: ed25519.Sign(testKey(5), ackMessage(c.Hash()))}}}
	if _, err := rs[0].AddCertificate(ctx, outsider); !errors.Is(err, ErrNotMember) {
		t.Fatalf("outsider: %v", err)
	}
	if r := rs[0].Refused(); r.Signature != 1 || r.NotMember != 1 {
		t.Fatalf("not counted: %+v", r)
	}
	enc := cert.Encode()
	for i := range enc {
		if _, err := DecodeCertificate(enc[:i]); err == nil {
			t.Fatalf("truncation at %d decoded", i)
		}
	}
	if _, err := DecodeCertificate(append(enc, 0)); err == nil {
		t.Fatal("trailing byte decoded")
	}
	// A hostile proposal that lists a deleted service live is not
	// acknowledged by a member that holds its tombstone.
	if res, err := rs[0].AddCertificate(ctx, cert); err != nil || !res.Applied {
		t.Fatal(res, err)
	}
}

// TestCompactionEpochStep: a member acknowledges a compaction at most
// maxEpochStep past its last epoch, so one validly signed proposal at
// MaxClock cannot end compaction for the whole network.
func TestCompactionEpochStep(t *testing.T) {
	ctx := context.Background()
	a := openReplica(t, 0, 1, nil)
	churn(t, a, 2, nil)
	c, ok, err := a.Propose()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	c.Epoch = MaxClock
	if _, err := a.Acknowledge(ctx, c); !errors.Is(err, ErrCompaction) {
		t.Fatalf("a jump from epoch 0 to MaxClock: %v, want ErrCompaction", err)
	}
	for _, tc := range []struct {
		epoch uint64
		ok    bool
	}{{maxEpochStep + 1, false}, {maxEpochStep, true}, {2 * maxEpochStep, true}, {3*maxEpochStep + 1, false}} {
		c.Epoch = tc.epoch
		_, err := a.Acknowledge(ctx, c)
		if tc.ok != (err == nil) {
			t.Fatalf("epoch %d: %v", tc.epoch, err)
		}
	}
	if _, ok, err := a.Propose(); err != nil || !ok {
		t.Fatalf("propose after the steps: %v %v", ok, err)
	}
}
