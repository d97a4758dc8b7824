// Package storetest is the contract suite every crdt.Store implementation
// passes: crdt.MemStore and pebblestore.Store run the same test bodies.
//
// An implementation's test calls Run with a Harness that opens the store
// over durable data that outlives each opened store (a directory, a
// MemStore's content) and can damage that data. Faults come from what the
// harness passes in, never from hooks on the store itself: a file system
// that fails or crashes (pebble's errorfs and crashable vfs for
// pebblestore), or FaultStore, which wraps any Store and fails chosen
// commits.
package storetest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/syncx"
)

// Harness gives the suite one store implementation. Every function is
// called with the store closed unless it says otherwise.
type Harness struct {
	// Open opens the store over the harness's durable data: the first
	// call sees an empty store, later calls what was committed (a restart).
	// A store that checks its format on open returns the refusal here.
	Open func(t testing.TB) (crdt.Store, error)
	// FailNextCommit makes the next Commit of the open store s fail midway
	// (after part of its batch was written, before it was committed).
	FailNextCommit func(t testing.TB, s crdt.Store)
	// CorruptRecord changes bytes of the stored record of service id.
	CorruptRecord func(t testing.TB, id crdt.ServiceID)
	// SetVersion records format version v in the stored data.
	SetVersion func(t testing.TB, v uint64)
	// UnknownVersion is a version SetVersion can write that the store must
	// refuse.
	UnknownVersion uint64
}

// FaultStore wraps a crdt.Store and fails the commits it is told to fail,
// without calling the wrapped store: it keeps its old content, as a disk
// that refused the write would. Harnesses of stores that have no fault
// injection of their own (such as crdt.MemStore) use it for
// Harness.FailNextCommit.
type FaultStore struct {
	crdt.Store
	// mu guards fail.
	mu syncx.Mutex
	// fail is the number of commits still to fail.
	// +checklocks:mu
	fail int
}

// FailNextCommit makes the next Commit fail.
func (s *FaultStore) FailNextCommit() {
	s.mu.Lock()
	s.fail++
	s.mu.Unlock()
}

// Commit fails when told to and otherwise commits to the wrapped store.
func (s *FaultStore) Commit(ctx context.Context, b crdt.Batch) error {
	s.mu.Lock()
	fail := s.fail > 0
	if fail {
		s.fail--
	}
	s.mu.Unlock()
	if fail {
		return errors.New("storetest: injected commit failure")
	}
	return s.Store.Commit(ctx, b)
}

var net = crdt.NetworkID{0x73, 0x74}

func key(i int) ed25519.PrivateKey {
	seed := bytes.Repeat([]byte{byte(i + 1)}, 32)
	return ed25519.NewKeyFromSeed(seed)
}

func member(i int) crdt.AuthorID {
	var a crdt.AuthorID
	copy(a[:], key(i).Public().(ed25519.PublicKey))
	return a
}

func svc(i int) crdt.ServiceID { return crdt.ServiceID{0xee, byte(i)} }

func mustOpen(t testing.TB, h Harness) crdt.Store {
	t.Helper()
	st, err := h.Open(t)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	return st
}

func open(t testing.TB, st crdt.Store, signer int) *crdt.Replica {
	t.Helper()
	r, err := crdt.Open(context.Background(), crdt.Config{
		Network: net, Signer: key(signer), Members: []crdt.AuthorID{member(0), member(1)}, Store: st})
	if err != nil {
		t.Fatalf("crdt.Open: %v", err)
	}
	return r
}

// state is everything observable of a replica but the local author's
// counter, which only ever grows (a restart skips the reserved ones).
func state(r *crdt.Replica) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "lamport %d\n", r.Lamport())
	for _, s := range r.Services() {
		enc, _ := r.EncodedSnapshot(s.ID)
		fmt.Fprintf(&b, "%s deleted=%v rev=%d %x\n", s.ID, s.Deleted, s.Revision, enc)
	}
	return b.String()
}

// populate makes a few services, one deleted, and a merged remote edit.
func populate(t testing.TB, r *crdt.Replica) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := r.Edit(ctx, svc(i), crdt.NoRevision,
			crdt.Edit{Key: "name", Value: []byte(fmt.Sprint("svc", i))}, crdt.Edit{Key: "port", Value: []byte("443")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Delete(ctx, svc(2), crdt.AnyRevision); err != nil {
		t.Fatal(err)
	}
	f := crdt.Field{Network: net, Service: svc(0), Key: "remote", HasValue: true, Value: []byte("x"), Lamport: 40, Counter: 7}
	crdt.Sign(key(1), &f)
	if _, err := r.MergeFields(ctx, []crdt.Field{f}); err != nil {
		t.Fatal(err)
	}
}

// Run runs the contract suite.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	ctx := context.Background()
	t.Run("Empty", func(t *testing.T) {
		h := newHarness(t)
		st := mustOpen(t, h)
		recs, err := st.Load(ctx)
		if err != nil || recs.Meta != nil || len(recs.Services) != 0 {
			t.Fatalf("empty store: %+v %v", recs, err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Records", func(t *testing.T) {
		h := newHarness(t)
		st := mustOpen(t, h)
		b := crdt.Batch{Meta: []byte("m1"), Put: []crdt.Record{{Service: svc(2), Data: []byte("two")}, {Service: svc(1), Data: []byte("one")}}}
		if err := st.Commit(ctx, b); err != nil {
			t.Fatal(err)
		}
		b.Put[0].Data[0] = 'X' // the store keeps its own copy
		if err := st.Commit(ctx, crdt.Batch{Put: []crdt.Record{{Service: svc(3), Data: []byte("three")}}, Delete: []crdt.ServiceID{svc(2)}}); err != nil {
			t.Fatal(err)
		}
		check := func(st crdt.Store) {
			recs, err := st.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if string(recs.Meta) != "m1" || len(recs.Services) != 2 ||
				recs.Services[0].Service != svc(1) || string(recs.Services[0].Data) != "one" ||
				recs.Services[1].Service != svc(3) || string(recs.Services[1].Data) != "three" {
				t.Fatalf("records: %+v", recs)
			}
		}
		check(st)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Load(ctx); !errors.Is(err, crdt.ErrClosed) {
			t.Fatalf("load after close: %v", err)
		}
		if err := st.Commit(ctx, crdt.Batch{}); !errors.Is(err, crdt.ErrClosed) {
			t.Fatalf("commit after close: %v", err)
		}
		st = mustOpen(t, h)
		check(st)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := st.Commit(cctx, crdt.Batch{Meta: []byte("m2")}); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled commit: %v", err)
		}
		check(st)
		_ = st.Close()
	})
	t.Run("ReopenSameState", func(t *testing.T) {
		h := newHarness(t)
		r := open(t, mustOpen(t, h), 0)
		populate(t, r)
		want, used := state(r), r.Counter(member(0))
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		r = open(t, mustOpen(t, h), 0)
		if got := state(r); got != want {
			t.Fatalf("reopened state differs:\n got %s\nwant %s", got, want)
		}
		// The counter continues past every counter used before.
		fs, err := r.Edit(ctx, svc(1), crdt.AnyRevision, crdt.Edit{Key: "more"})
		if err != nil || fs[0].Counter != r.Counter(member(0)) || fs[0].Counter <= used {
			t.Fatalf("counter after reopen: %v (used before %d) %v", fs, used, err)
		}
		_ = r.Close()
	})
	t.Run("FailedCommitKeepsOldState", func(t *testing.T) {
		h := newHarness(t)
		st := mustOpen(t, h)
		r := open(t, st, 0)
		populate(t, r)
		// Reserve counters first, so that the failing commit is the edit's.
		if _, err := r.Edit(ctx, svc(1), crdt.AnyRevision, crdt.Edit{Key: "warm"}); err != nil {
			t.Fatal(err)
		}
		want, used := state(r), r.Counter(member(0))
		h.FailNextCommit(t, st)
		_, err := r.Edit(ctx, svc(0), crdt.AnyRevision, crdt.Edit{Key: "a"}, crdt.Edit{Key: "b"})
		if err == nil {
			t.Fatal("failed commit reported success")
		}
		if got := state(r); got != want {
			t.Fatal("failed commit changed the replica")
		}
		spent := r.Counter(member(0))
		if spent != used+2 {
			t.Fatalf("counters of the failed edit not spent: %d, was %d", spent, used)
		}
		_ = r.Close()
		r = open(t, mustOpen(t, h), 0)
		if got := state(r); got != want {
			t.Fatalf("failed commit changed the store:\n got %s\nwant %s", got, want)
		}
		// The signatures of the failed edit were never published, but
		// their counters are not used again either.
		fs, err := r.Edit(ctx, svc(0), crdt.AnyRevision, crdt.Edit{Key: "a"})
		if err != nil || fs[0].Counter <= spent {
			t.Fatalf("counter after a failed commit: %v %v", fs, err)
		}
		_ = r.Close()
	})
	t.Run("CorruptRecordFailsOpen", func(t *testing.T) {
		h := newHarness(t)
		r := open(t, mustOpen(t, h), 0)
		populate(t, r)
		_ = r.Close()
		h.CorruptRecord(t, svc(1))
		st := mustOpen(t, h)
		_, err := crdt.Open(ctx, crdt.Config{Network: net, Store: st})
		if !errors.Is(err, crdt.ErrCorrupt) {
			t.Fatalf("open of a corrupt record: %v", err)
		}
		_ = st.Close()
		// Still refused: nothing was reset.
		st = mustOpen(t, h)
		if _, err := crdt.Open(ctx, crdt.Config{Network: net, Store: st}); !errors.Is(err, crdt.ErrCorrupt) {
			t.Fatalf("second open: %v", err)
		}
		_ = st.Close()
	})
	t.Run("UnknownVersionFailsOpen", func(t *testing.T) {
		h := newHarness(t)
		r := open(t, mustOpen(t, h), 0)
		populate(t, r)
		_ = r.Close()
		h.SetVersion(t, h.UnknownVersion)
		st, err := h.Open(t)
		if err == nil {
			_, err = crdt.Open(ctx, crdt.Config{Network: net, Store: st})
			_ = st.Close()
		}
		if !errors.Is(err, crdt.ErrUnknownVersion) {
			t.Fatalf("unknown version: %v", err)
		}
	})
}
