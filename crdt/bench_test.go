package crdt

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

// benchAuthors is how many members sign the benchmark state.
const benchAuthors = 8

var (
	benchOnce  sync.Once
	benchSnaps [][]byte // DefaultMaxServices full services, DefaultMaxFieldsPerService fields each
)

// fullState returns the encoded snapshots of a full-limit state: 64
// services × 192 fields, each field signed by one of 8 members, values of
// 48 bytes (about 250 bytes a field, 48 KiB a snapshot).
func fullState(tb testing.TB) [][]byte {
	benchOnce.Do(func() {
		for s := 0; s < DefaultMaxServices; s++ {
			benchSnaps = append(benchSnaps, fullSnapshot(s))
		}
	})
	for _, b := range benchSnaps {
		if len(b) > DefaultMaxSnapshotBytes {
			tb.Fatalf("bench snapshot of %d bytes over the frame limit", len(b))
		}
	}
	return benchSnaps
}

// fullSnapshot is service s of the full-limit state.
func fullSnapshot(s int) []byte {
	snap := Snapshot{Network: testNet, Service: testSvc(s)}
	for k := 0; k < DefaultMaxFieldsPerService; k++ {
		a := (s + k) % benchAuthors
		val := fmt.Sprintf("backend node-%02d:%05d weight=%03d check=on interval=3000", k%32, 6000+k, k)
		snap.Fields = append(snap.Fields, mkField(a, snap.Service, fmt.Sprintf("l/%d/b/%03d", k/32, k), val[:48], uint64(1+k%7), uint64(s*1000+k)))
	}
	return snap.Encode()
}

// BenchmarkEd25519Verify is one crypto/ed25519 verification of a field's
// signing message: the unit the merge goal is stated in.
func BenchmarkEd25519Verify(b *testing.B) {
	f := mkField(0, testSvc(0), "l/0/b/000", "backend node-00:06000 weight=000 check=on inter", 1, 1)
	msg := f.AppendSigningMessage(nil)
	pub := ed25519.PublicKey(f.Author[:])
	b.ReportAllocs()
	for b.Loop() {
		if !ed25519.Verify(pub, msg, f.Signature) {
			b.Fatal("verify failed")
		}
	}
}

// verifyNs measures one crypto/ed25519 verification in ns (the mean of n),
// for the ratios. The benchmarks call it between their timed operations,
// so that both see the same machine load.
func verifyNs(n int) float64 {
	f := mkField(0, testSvc(0), "k", "v", 1, 1)
	msg := f.AppendSigningMessage(nil)
	pub := ed25519.PublicKey(f.Author[:])
	start := time.Now()
	for i := 0; i < n; i++ {
		ed25519.Verify(pub, msg, f.Signature)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

// cpuVerifyNs is verifyNs in CPU time.
func cpuVerifyNs(n int) float64 {
	start := cpuNow()
	verifyNs(n)
	return float64(cpuNow()-start) / float64(n)
}

// BenchmarkVerifyMergeMaxSnapshot merges a full-limit state (services ×
// 192 fields) into an empty in-memory replica: decode, ZIP-215 batch
// verification, merge, commit. Metrics: ns/field, and ratio = merge time /
// (fields × one crypto/ed25519 verify measured between the merges), and
// cpu-ratio, the same in CPU time (the work of all cores, so parallel
// verification does not lower it; it is robust to a loaded machine). The
// goal is ratio ≤ 0.7 at services=64.
func BenchmarkVerifyMergeMaxSnapshot(b *testing.B) {
	all := fullState(b)
	for _, n := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			snaps := all[:n]
			fields := n * DefaultMaxFieldsPerService
			ctx := context.Background()
			var vsum, cpuVsum float64
			var cpuMerge time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				b.StopTimer()
				r, err := Open(ctx, Config{Network: testNet, Members: testMembers(benchAuthors)})
				if err != nil {
					b.Fatal(err)
				}
				vsum += verifyNs(max(32, fields/16))
				cpuVsum += cpuVerifyNs(max(32, fields/16))
				c0 := cpuNow()
				b.StartTimer()
				res, err := r.MergeSnapshots(ctx, snaps)
				cpuMerge += cpuNow() - c0
				if err != nil || res.Accepted != fields {
					b.Fatalf("merge: %+v %v", res, err)
				}
				b.StopTimer()
				_ = r.Close()
				b.StartTimer()
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			vns := vsum / float64(b.N)
			b.ReportMetric(perOp/float64(fields), "ns/field")
			b.ReportMetric(vns, "ns/ed25519-verify")
			b.ReportMetric(perOp/(float64(fields)*vns), "ratio-vs-fields×verify")
			cpuV := cpuVsum / float64(b.N)
			b.ReportMetric(float64(cpuMerge.Nanoseconds())/float64(b.N)/(float64(fields)*cpuV), "cpu-ratio")
		})
	}
}

// BenchmarkReMergeHeldSnapshot merges again a full-limit state the replica
// already holds byte-identical: no verification. ratio-vs-first-merge is
// its time over a first merge measured in the same process (goal ≤ 0.05).
func BenchmarkReMergeHeldSnapshot(b *testing.B) {
	all := fullState(b)
	ctx := context.Background()
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			snaps := all[:n]
			var first time.Duration
			var r *Replica
			for i := 0; i < 3; i++ {
				var err error
				if r != nil {
					_ = r.Close()
				}
				r, err = Open(ctx, Config{Network: testNet, Members: testMembers(benchAuthors)})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if _, err := r.MergeSnapshots(ctx, snaps); err != nil {
					b.Fatal(err)
				}
				if d := time.Since(start); i == 0 || d < first {
					first = d
				}
			}
			defer r.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				res, err := r.MergeSnapshots(ctx, snaps)
				if err != nil || res.Identical != n*DefaultMaxFieldsPerService {
					b.Fatalf("re-merge: %+v %v", res, err)
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(float64(first.Nanoseconds()), "first-merge-ns")
			b.ReportMetric(perOp/float64(first.Nanoseconds()), "ratio-vs-first-merge")
		})
	}
}

// TestReMergeAllocs: re-merging a held full snapshot allocates a bounded
// number of times, independent of its 192 fields (nothing per field).
func TestReMergeAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	ctx := context.Background()
	snap := [][]byte{fullSnapshot(0)}
	r, err := Open(ctx, Config{Network: testNet, Members: testMembers(benchAuthors)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.MergeSnapshots(ctx, snap); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		if res, err := r.MergeSnapshots(ctx, snap); err != nil || res.Identical != DefaultMaxFieldsPerService {
			t.Fatalf("re-merge: %+v %v", res, err)
		}
	})
	t.Logf("re-merge of a held %d-field snapshot: %.0f allocations", DefaultMaxFieldsPerService, allocs)
	if allocs > 24 {
		t.Fatalf("re-merge allocates %.0f times, want ≤ 24 (nothing per field)", allocs)
	}
}
