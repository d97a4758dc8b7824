package pebblestore

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// BenchmarkPebbleCommitSmall commits, synced, one small service record
// and the meta record: the commit of a one-field edit, where a store's
// fixed cost per commit (pebble's log sync, and the witness's) shows.
func BenchmarkPebbleCommitSmall(b *testing.B) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(b.TempDir(), "db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	batch := crdt.Batch{Meta: make([]byte, 80), Put: []crdt.Record{{Service: crdt.ServiceID{1}, Data: make([]byte, 300)}}}
	b.ReportAllocs()
	for b.Loop() {
		if err := st.Commit(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}
