package pebblestore

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// fullRecords returns the store records of n full services (192 fields of
// about 250 bytes each), as a replica commits them.
func fullRecords(b *testing.B, n int) crdt.Batch {
	ctx := context.Background()
	mem := crdt.NewMemStore()
	r, err := crdt.Open(ctx, crdt.Config{Network: testNet, Signer: key(0), Store: mem})
	if err != nil {
		b.Fatal(err)
	}
	var snaps [][]byte
	for s := 0; s < n; s++ {
		id := crdt.ServiceID{0xbe, byte(s)}
		snap := crdt.Snapshot{Network: testNet, Service: id}
		for k := 0; k < crdt.DefaultMaxFieldsPerService; k++ {
			f := crdt.Field{Network: testNet, Service: id, Key: fmt.Sprintf("l/%d/b/%03d", k/32, k), HasValue: true,
				Value: []byte(fmt.Sprintf("backend node-%02d:%05d weight=%03d check=on inte", k%32, 6000+k, k)), Lamport: 1, Counter: uint64(s*1000 + k)}
			crdt.Sign(key(1), &f)
			snap.Fields = append(snap.Fields, f)
		}
		snaps = append(snaps, snap.Encode())
	}
	if err := r.SetMembers(ctx, []crdt.AuthorID{crdt.AuthorID(key(1).Public().(ed25519.PublicKey))}); err != nil {
		b.Fatal(err)
	}
	if _, err := r.MergeSnapshots(ctx, snaps); err != nil {
		b.Fatal(err)
	}
	_ = r.Close()
	recs, err := mem.Reopen().Load(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return crdt.Batch{Meta: recs.Meta, Put: recs.Services}
}

// BenchmarkPebbleCommitFullSnapshot commits, synced, the records of full
// services (one full snapshot, and the full 64-service state) to a pebble
// store on the local disk. MB/s counts record bytes.
func BenchmarkPebbleCommitFullSnapshot(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			batch := fullRecords(b, n)
			size := len(batch.Meta)
			for _, r := range batch.Put {
				size += len(r.Data)
			}
			ctx := context.Background()
			st, err := Open(ctx, filepath.Join(b.TempDir(), "db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := st.Commit(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(size), "record-bytes")
		})
	}
}

// BenchmarkEditFullServicePebble is a local edit of one field of a full
// (192-field) service on a pebble store: sign, merge, re-encode the 36 KiB
// snapshot and commit it with the counter, synced.
func BenchmarkEditFullServicePebble(b *testing.B) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(b.TempDir(), "db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	batch := fullRecords(b, 1)
	if err := st.Commit(ctx, batch); err != nil {
		b.Fatal(err)
	}
	r, err := crdt.Open(ctx, crdt.Config{Network: testNet, Signer: key(1), Store: st})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	id := batch.Put[0].Service
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := r.Edit(ctx, id, crdt.AnyRevision, crdt.Edit{Key: "l/0/b/000", Value: []byte(fmt.Sprint(i))}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchAuthors is how many members sign the benchmark state, as in crdt's
// own benchmarks.
const benchAuthors = 8

func benchMembers() []crdt.AuthorID {
	out := make([]crdt.AuthorID, benchAuthors)
	for i := range out {
		out[i] = crdt.AuthorID(key(i + 1).Public().(ed25519.PublicKey))
	}
	return out
}

// maxState returns n full-limit encoded snapshots: 192 fields each,
// signed by 8 members, about 250 bytes a field (the state of crdt's
// BenchmarkVerifyMergeMaxSnapshot).
func maxState(n int) [][]byte {
	var out [][]byte
	for s := 0; s < n; s++ {
		id := crdt.ServiceID{0x5e, byte(s)}
		snap := crdt.Snapshot{Network: testNet, Service: id}
		for k := 0; k < crdt.DefaultMaxFieldsPerService; k++ {
			val := fmt.Sprintf("backend node-%02d:%05d weight=%03d check=on interval=3000", k%32, 6000+k, k)
			f := crdt.Field{Network: testNet, Service: id, Key: fmt.Sprintf("l/%d/b/%03d", k/32, k), HasValue: true,
				Value: []byte(val[:48]), Lamport: uint64(1 + k%7), Counter: uint64(s*1000 + k)}
			crdt.Sign(key(1+(s+k)%benchAuthors), &f)
			snap.Fields = append(snap.Fields, f)
		}
		out = append(out, snap.Encode())
	}
	return out
}

// BenchmarkVerifyMergeMaxSnapshotPebble is crdt's
// BenchmarkVerifyMergeMaxSnapshot on a pebble store: decode, batch
// verification, merge and the synced commit of the whole state.
func BenchmarkVerifyMergeMaxSnapshotPebble(b *testing.B) {
	all := maxState(crdt.DefaultMaxServices)
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				b.StopTimer()
				i++
				st, err := Open(ctx, filepath.Join(b.TempDir(), fmt.Sprint("db", i)), nil)
				if err != nil {
					b.Fatal(err)
				}
				r, err := crdt.Open(ctx, crdt.Config{Network: testNet, Members: benchMembers(), Store: st})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				res, err := r.MergeSnapshots(ctx, all[:n])
				if err != nil || res.Accepted != n*crdt.DefaultMaxFieldsPerService {
					b.Fatalf("merge: %+v %v", res, err)
				}
				b.StopTimer()
				_ = r.Close()
				b.StartTimer()
			}
		})
	}
}

// BenchmarkReMergeHeldSnapshotPebble merges again a full-limit state a
// pebble-backed replica already holds byte-identical.
func BenchmarkReMergeHeldSnapshotPebble(b *testing.B) {
	all := maxState(crdt.DefaultMaxServices)
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ctx := context.Background()
			st, err := Open(ctx, filepath.Join(b.TempDir(), "db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			r, err := crdt.Open(ctx, crdt.Config{Network: testNet, Members: benchMembers(), Store: st})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			if _, err := r.MergeSnapshots(ctx, all[:n]); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				res, err := r.MergeSnapshots(ctx, all[:n])
				if err != nil || res.Identical != n*crdt.DefaultMaxFieldsPerService {
					b.Fatalf("re-merge: %+v %v", res, err)
				}
			}
		})
	}
}
