package crdt

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
)

// fuzzReader takes decisions from the fuzzer's bytes (zeros once they run
// out), so that every input is a valid program of signed fields.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) n(n int) int { return int(r.byte()) % n }

func (r *fuzzReader) bytes(max int) []byte {
	k := r.n(max + 1)
	out := make([]byte, 0, k)
	for range k {
		out = append(out, r.byte())
	}
	return out
}

// hostileClock picks a clock or counter, biased to the boundaries.
func (r *fuzzReader) hostileClock() uint64 {
	switch r.n(8) {
	case 0:
		return MaxClock
	case 1:
		return MaxClock - 1
	case 2:
		return MaxClock + 1
	case 3:
		return math.MaxUint64
	case 4:
		return 0
	}
	var b [8]byte
	for i := range b[:1+r.n(8)] {
		b[i] = r.byte()
	}
	return binary.LittleEndian.Uint64(b[:])
}

// The services the fuzzer's fields may name; the honest services are
// never among them.
func fuzzSvc(i int) ServiceID   { return testSvc(1000 + i) }
func honestSvc(i int) ServiceID { return testSvc(2000 + i) }

var fuzzKeys = []string{"name", "addr", "k", "\x00deleted", "\x00other", "L/tcp/443", "L/tcp/443/1/b/x", "", "\xff\x1b[2J"}

// FuzzMergeSigned is a structure-aware fuzzer that holds member keys: the
// input is a program of fields (service, key, value, clocks, author) that
// it signs with a member's key (or a non-member's, or breaks the
// signature), merged in snapshots and live updates into a replica that
// already holds honest services. Invariants: no panic; the replica holds
// no more than its hard caps; every held snapshot fits the frame limit and
// decodes; and afterwards an honest member's edit within the limits
// succeeds on every honest service, and a new one can be created.
func FuzzMergeSigned(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5})
	f.Add([]byte{9, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Add([]byte{3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 2, 2, 2, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		ctx := context.Background()
		lim := Limits{MaxServices: 6, MaxTombstones: 4, MaxFieldsPerService: 6, MaxSnapshotBytes: 4096}
		r, err := Open(ctx, Config{Network: testNet, Signer: testKey(0), Members: testMembers(3), Limits: lim})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for i := range 3 {
			if _, err := r.Edit(ctx, honestSvc(i), NoRevision, Edit{Key: "name", Value: []byte("honest")}); err != nil {
				t.Fatal(err)
			}
		}
		fr := &fuzzReader{b: in}
		var batch []Field
		for steps := 0; len(fr.b) > 0 && steps < 200; steps++ {
			fl := Field{Network: testNet, Service: fuzzSvc(fr.n(16))}
			if fr.n(16) == 0 {
				fl.Network = NetworkID{0xba, 0xd}
			}
			if k := fr.n(len(fuzzKeys) + 1); k < len(fuzzKeys) {
				fl.Key = fuzzKeys[k]
			} else {
				fl.Key = string(fr.bytes(12))
			}
			if fr.n(3) > 0 {
				fl.HasValue, fl.Value = true, fr.bytes(40)
			}
			fl.Lamport, fl.Counter = fr.hostileClock(), fr.hostileClock()
			// Members 1 and 2 (0 is the replica's own key, which no one else
			// holds); 3 and 4 are not members.
			author := 1 + fr.n(4)
			if fl.Key == "" {
				fl.Key = "e"
			}
			Sign(testKey(author), &fl)
			if fr.n(32) == 0 && len(fl.Signature) > 0 {
				fl.Signature[fr.n(len(fl.Signature))] ^= 1
			}
			batch = append(batch, fl)
			if fr.n(4) == 0 {
				if fr.n(2) == 0 {
					_, _ = r.MergeFields(ctx, batch)
				} else {
					var snaps [][]byte
					for _, g := range batch {
						snaps = append(snaps, (&Snapshot{Network: g.Network, Service: g.Service, Fields: []Field{g}}).Encode())
					}
					_, _ = r.MergeSnapshots(ctx, snaps)
				}
				batch = nil
			}
		}
		_, _ = r.MergeFields(ctx, batch)
		active, tombs := 0, 0
		for _, s := range r.Services() {
			if s.Deleted {
				tombs++
			} else {
				active++
			}
			if s.SnapshotBytes > lim.MaxSnapshotBytes || s.Fields > 2*lim.MaxFieldsPerService {
				t.Fatalf("service %s holds %d fields in %d bytes", s.ID, s.Fields, s.SnapshotBytes)
			}
			b, _ := r.EncodedSnapshot(s.ID)
			if _, err := DecodeSnapshot(b, &lim); err != nil {
				t.Fatalf("held snapshot of %s does not decode: %v", s.ID, err)
			}
		}
		if active > 2*lim.MaxServices || tombs > 2*lim.MaxTombstones {
			t.Fatalf("%d active and %d deleted services held", active, tombs)
		}
		for i := range 3 {
			if _, err := r.Edit(ctx, honestSvc(i), AnyRevision, Edit{Key: "name", Value: []byte(fmt.Sprint("edited", i))}); err != nil {
				t.Fatalf("honest edit of %s: %v", honestSvc(i), err)
			}
			if info, _ := r.Service(honestSvc(i)); info.Err != nil && active <= lim.MaxServices {
				t.Fatalf("honest service %s: %v", honestSvc(i), info.Err)
			}
		}
		if active < lim.MaxServices {
			if _, err := r.Edit(ctx, honestSvc(9), NoRevision, Edit{Key: "name"}); err != nil {
				t.Fatalf("honest create: %v", err)
			}
		}
	})
}
