package pebblestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/crdt"
)

// damage is one way a disk can change a file.
type damage struct {
	name string
	fn   func([]byte) []byte
}

func flipAt(pos func(n int) int) func([]byte) []byte {
	return func(b []byte) []byte {
		if len(b) == 0 {
			return b
		}
		b = bytes.Clone(b)
		b[pos(len(b))] ^= 0x10
		return b
	}
}

var damages = []damage{
	{"flip-start", flipAt(func(int) int { return 0 })},
	{"flip-mid", flipAt(func(n int) int { return n / 2 })},
	{"flip-end", flipAt(func(n int) int { return n - 1 })},
	{"truncate-half", func(b []byte) []byte { return bytes.Clone(b[:len(b)/2]) }},
	{"truncate-zero", func([]byte) []byte { return nil }},
	{"zero-fill", func(b []byte) []byte { return make([]byte, len(b)) }},
	{"delete", nil},
}

// matrixState builds a store in dir with some services flushed to a sorted
// table and more in the log only, and returns the acknowledged state and
// the highest counter signed.
func matrixState(t *testing.T, dir string) (string, uint64) {
	t.Helper()
	ctx := context.Background()
	st, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := open(t, st)
	populate(t, r, 12)
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 12; i < matrixServices; i++ {
		if _, err := r.Edit(ctx, crdt.ServiceID{byte(i)}, crdt.NoRevision,
			crdt.Edit{Key: "name", Value: bytes.Repeat([]byte{'A' + byte(i)}, 300)}); err != nil {
			t.Fatal(err)
		}
	}
	want, used := dump(r), r.Counter(r.Author())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return want, used
}

func filesOf(t *testing.T, dir string) map[string][]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string][]string{}
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasSuffix(n, ".log"):
			kinds["WAL"] = append(kinds["WAL"], n)
		case strings.HasPrefix(n, "MANIFEST-"):
			kinds["MANIFEST"] = append(kinds["MANIFEST"], n)
		case strings.HasPrefix(n, "OPTIONS-"):
			kinds["OPTIONS"] = append(kinds["OPTIONS"], n)
		case strings.HasSuffix(n, ".sst"):
			kinds["SST"] = append(kinds["SST"], n)
		case n == WitnessFile:
			kinds["WITNESS"] = append(kinds["WITNESS"], n)
		}
	}
	for _, v := range kinds {
		sort.Strings(v)
	}
	return kinds
}

// matrixServices is the number of services of a matrix state.
const matrixServices = 20

// TestCorruptionMatrix damages each pebble file of a store in each way,
// for a store created at the current format ("fresh") and for one
// upgraded from format 1 ("upgraded"): every case either opens with
// exactly the last acknowledged state or fails with ErrCorrupt (naming a
// file), never an older or empty state; a replica that opens signs no
// counter twice; and a failed open leaves no goroutine behind.
func TestCorruptionMatrix(t *testing.T) {
	for _, b := range []struct {
		name  string
		build func(*testing.T, string) (string, uint64)
	}{{"fresh", matrixState}, {"upgraded", upgradedState}} {
		t.Run(b.name, func(t *testing.T) { runMatrix(t, b.build) })
	}
}

func runMatrix(t *testing.T, build func(*testing.T, string) (string, uint64)) {
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "base")
	want, used0 := build(t, base)
	kinds := filesOf(t, base)
	for _, kind := range []string{"WAL", "MANIFEST", "OPTIONS", "SST", "WITNESS"} {
		if len(kinds[kind]) == 0 {
			t.Fatalf("no %s file in %v", kind, kinds)
		}
		// Every file of the kind: the ones in use and any older one
		// pebble keeps (an older sorted table of an upgraded store holds
		// its format-1 records).
		for _, file := range kinds[kind] {
			for _, d := range damages {
				t.Run(kind+"/"+file+"/"+d.name, func(t *testing.T) {
					damageAndReopen(t, ctx, base, file, d, want, used0)
				})
			}
		}
	}
}

// damageAndReopen copies the store in base, damages file in it with d and
// opens it twice (see TestCorruptionMatrix).
func damageAndReopen(t *testing.T, ctx context.Context, base, file string, d damage, want string, used uint64) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := filepath.Join(t.TempDir(), "db")
	if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, file)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if d.fn == nil {
		err = os.Remove(p)
	} else {
		err = os.WriteFile(p, d.fn(b), 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // twice: a refusal resets nothing
		st, err := Open(ctx, dir, nil)
		var r *crdt.Replica
		if err == nil {
			r, err = crdt.Open(ctx, crdt.Config{Network: testNet, Signer: key(0), Store: st})
			if err != nil {
				_ = st.Close()
			}
		}
		if err != nil {
			if !errors.Is(err, crdt.ErrCorrupt) {
				t.Fatalf("open %d: %v, want ErrCorrupt", i, err)
			}
			t.Logf("open %d: %v", i, err)
			continue
		}
		got := dump(r)
		if got != want {
			// Show what the replica would do with that state.
			n := len(r.Services())
			fs, err := r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: "rolled-back"})
			_ = r.Close()
			t.Fatalf("open %d: opened with another state than the last acknowledged (%d services of %d); its next edit signs %v (%v), counters up to %d were used",
				i, n, matrixServices, fs, err, used)
		}
		fs, err := r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: fmt.Sprint("after", i)})
		if err != nil || fs[0].Counter <= used {
			_ = r.Close()
			t.Fatalf("edit after open %d: counter %v (used before %d) %v", i, fs, used, err)
		}
		// And across one more reopen: the counter moves on again.
		want2 := dump(r)
		_ = r.Close()
		st, err = Open(ctx, dir, nil)
		if err != nil {
			t.Fatalf("reopen after the edit: %v", err)
		}
		r, err = crdt.Open(ctx, crdt.Config{Network: testNet, Signer: key(0), Store: st})
		if err != nil {
			_ = st.Close()
			t.Fatalf("reopen after the edit: %v", err)
		}
		if dump(r) != want2 {
			_ = r.Close()
			t.Fatal("the reopened store lost the edit")
		}
		fs2, err := r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: "again"})
		if err != nil || fs2[0].Counter <= fs[0].Counter {
			_ = r.Close()
			t.Fatalf("edit after the second open: %v (first %d) %v", fs2, fs[0].Counter, err)
		}
		_ = r.Close()
		return // the state changed; the second open is not a refusal check
	}
}
