package crdt

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testNet = NetworkID{0x6e, 0x65, 0x74}

// testKey returns a deterministic key for author number i.
func testKey(i int) ed25519.PrivateKey {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(i)+1)
	seed[31] = 0x5a
	return ed25519.NewKeyFromSeed(seed[:])
}

func authorOf(k ed25519.PrivateKey) AuthorID {
	var a AuthorID
	copy(a[:], k.Public().(ed25519.PublicKey))
	return a
}

func testMembers(n int) []AuthorID {
	out := make([]AuthorID, n)
	for i := range out {
		out[i] = authorOf(testKey(i))
	}
	return out
}

func testSvc(i int) ServiceID {
	var id ServiceID
	binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
	id[0] = 0x5e
	return id
}

// mkField signs a field by author number a.
func mkField(a int, svc ServiceID, key string, val string, lamport, counter uint64) Field {
	f := Field{Network: testNet, Service: svc, Key: key, Lamport: lamport, Counter: counter}
	if val != "\x00none" {
		f.HasValue, f.Value = true, []byte(val)
	}
	Sign(testKey(a), &f)
	return f
}

func openReplica(t testing.TB, signer int, members int, store Store) *Replica {
	t.Helper()
	cfg := Config{Network: testNet, Members: testMembers(members), Store: store}
	if signer >= 0 {
		cfg.Signer = testKey(signer)
	}
	r, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func mustIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}

// stateOf returns every held service's encoded snapshot, in id order.
func stateOf(r *Replica) [][]byte {
	var out [][]byte
	for _, s := range r.Services() {
		b, _ := r.EncodedSnapshot(s.ID)
		out = append(out, b)
	}
	return out
}

// failStore wraps a Store and fails the commits it is told to: the store
// keeps its old content, as a disk that refused the write would.
type failStore struct {
	Store
	fail int // the next fail commits fail
}

func (s *failStore) Commit(ctx context.Context, b Batch) error {
	if s.fail > 0 {
		s.fail--
		return errors.New("crdt test: injected commit failure")
	}
	return s.Store.Commit(ctx, b)
}

// corruptMem flips a byte of the record of service id in s (the meta
// record when id is zero) and reports whether there was such a record.
func corruptMem(s *MemStore, id ServiceID) bool {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	rec := s.d.meta
	if id != (ServiceID{}) {
		rec = s.d.services[id]
	}
	if len(rec) == 0 {
		return false
	}
	rec[len(rec)/2] ^= 0x5a
	return true
}

// setMemVersion sets the format version s records.
func setMemVersion(s *MemStore, v uint32) {
	s.d.mu.Lock()
	s.d.version = v
	s.d.mu.Unlock()
}
