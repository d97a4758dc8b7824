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
				return &storetest.FaultStore{Store: cur}, nil
			},
			FailNextCommit: func(_ testing.TB, s crdt.Store) { s.(*storetest.FaultStore).FailNextCommit() },
			CorruptRecord: func(t testing.TB, id crdt.ServiceID) {
				if !crdt.CorruptMemForTest(cur, id) {
					t.Fatal("no record to corrupt")
				}
			},
			SetVersion:     func(_ testing.TB, v uint64) { crdt.SetMemVersionForTest(cur, uint32(v)) },
			UnknownVersion: 2,
		}
	})
}
