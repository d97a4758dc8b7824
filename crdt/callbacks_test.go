package crdt

import (
	"context"
	"errors"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

// reentrantStore is a Store whose Close calls back into its replica, as a
// store that reports its shutdown through the application might.
type reentrantStore struct {
	*MemStore
	r    *Replica
	errs []error
}

func (s *reentrantStore) Close() error {
	ctx := context.Background()
	_, err := s.r.MergeFields(ctx, []Field{mkField(0, testSvc(1), "a", "", 1, 1)})
	s.errs = append(s.errs, err)
	_, err = s.r.Edit(ctx, testSvc(1), AnyRevision, Edit{Key: "a"})
	s.errs = append(s.errs, err)
	_ = s.r.Lamport()
	return s.MemStore.Close()
}

// TestStoreCloseMayCallReplica pins that Replica.Close closes its store
// with no replica lock held: a Store.Close that calls the replica gets
// ErrClosed instead of deadlocking on the write lock.
func TestStoreCloseMayCallReplica(t *testing.T) {
	st := &reentrantStore{MemStore: NewMemStore()}
	r, err := Open(context.Background(), Config{Network: testNet, Signer: testKey(0), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	st.r = r
	testenv.Within(t, "Replica.Close with a Store.Close that calls the replica", func() { err = r.Close() })
	if err != nil {
		t.Fatal(err)
	}
	if len(st.errs) != 2 {
		t.Fatalf("store saw %d calls, want 2", len(st.errs))
	}
	for _, err := range st.errs {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("call from Store.Close: %v, want ErrClosed", err)
		}
	}
}
