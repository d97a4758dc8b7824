package crdt_test

import (
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/storetest"
)

func TestMemStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		var cur *crdt.MemStore
		return storetest.Harness{
			Open: func(testing.TB) (crdt.Store, error) {
				if cur == nil {
					cur = crdt.NewMemStore()
				} else {
					cur = cur.Reopen()
				}
				return cur, nil
			},
			FailNextCommit: func(_ testing.TB, s crdt.Store) { s.(*crdt.MemStore).FailNextCommit(1) },
			CorruptRecord: func(t testing.TB, id crdt.ServiceID) {
				if !cur.CorruptForTest(id) {
					t.Fatal("no record to corrupt")
				}
			},
			SetVersion:     func(_ testing.TB, v uint64) { cur.SetVersionForTest(uint32(v)) },
			UnknownVersion: 2,
		}
	})
}
