package pebblestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/vipkit/vipkit/crdt"
)

// format1Records returns the records of a replica with n services and
// the highest counter it signed.
func format1Records(t testing.TB, n int) (crdt.Records, uint64) {
	t.Helper()
	mem := crdt.NewMemStore()
	r := open(t, mem)
	populate(t, r, n)
	used := r.Counter(r.Author())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	recs, err := mem.Reopen().Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return recs, used
}

// writeFormat1 writes recs in dir as a format-1 store, as this package
// wrote it before the witness existed: the format record (1), the meta
// record and the service records, no sequence number and no witness,
// flushed to a sorted table.
func writeFormat1(t testing.TB, fs vfs.FS, dir string, recs crdt.Records) {
	t.Helper()
	if err := fs.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, Logger: fatalLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set(keyFormat, binary.AppendUvarint(nil, 1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	_ = b.Set(keyMeta, recs.Meta, nil)
	for _, r := range recs.Services {
		_ = b.Set(svcKey(r.Service), r.Data, nil)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// rawFormat reads the format record of the database in dir with pebble
// alone (no witness check, no upgrade).
func rawFormat(t testing.TB, dir string) uint64 {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{FS: vfs.Default, Logger: fatalLogger{}, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, closer, err := db.Get(keyFormat)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	ver, _ := binary.Uvarint(v)
	return ver
}

// upgradedState builds in dir a format-1 store of 12 services in a sorted
// table, upgrades it by opening it, and edits 8 more services into the
// log only. It returns the acknowledged state and the highest counter
// signed, as matrixState does.
func upgradedState(t *testing.T, dir string) (string, uint64) {
	t.Helper()
	ctx := context.Background()
	recs, _ := format1Records(t, 12)
	writeFormat1(t, vfs.Default, dir, recs)
	st, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := open(t, st)
	if n := len(r.Services()); n != 12 {
		t.Fatalf("the upgraded store holds %d services, want 12", n)
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

func copyDir(t testing.TB, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

// TestFormat1BesideWitness puts the witness of an upgraded store beside a
// copy of the same store at format 1 (what a log that lost the upgrade
// leaves): a witness that records acknowledged commits, or a damaged one,
// makes Open fail with ErrCorrupt naming the witness and the log, every
// time, and leaves the witness as it was; a witness at sequence 0 is an
// upgrade cut short, and the upgrade is done again.
func TestFormat1BesideWitness(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	recs, used1 := format1Records(t, 12)
	v1 := filepath.Join(tmp, "v1")
	writeFormat1(t, vfs.Default, v1, recs)
	state1 := func() string {
		copyDir(t, v1, filepath.Join(tmp, "peek"))
		st, err := Open(ctx, filepath.Join(tmp, "peek"), nil)
		if err != nil {
			t.Fatal(err)
		}
		r := open(t, st)
		defer r.Close()
		return dump(r)
	}()
	// The witness of an upgrade that acknowledged nothing yet, and of one
	// that acknowledged 3 commits.
	witnessAfter := func(name string, edits int) ([]byte, uint64) {
		dir := filepath.Join(tmp, name)
		copyDir(t, v1, dir)
		st, err := Open(ctx, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := open(t, st)
		for i := range edits {
			if _, err := r.Edit(ctx, crdt.ServiceID{byte(i)}, crdt.AnyRevision, crdt.Edit{Key: fmt.Sprint("k", i)}); err != nil {
				t.Fatal(err)
			}
		}
		used := r.Counter(r.Author())
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, WitnessFile))
		if err != nil {
			t.Fatal(err)
		}
		return b, used
	}
	w0, _ := witnessAfter("up0", 0)
	w3, used3 := witnessAfter("up3", 3)
	tornW0 := bytes.Clone(w0)
	tornW0[witnessSlot+5] ^= 0x01

	for _, c := range []struct {
		name    string
		witness []byte
		used    uint64 // the highest counter signed before
		corrupt bool
	}{
		{"acknowledged commits", w3, used3, true},
		{"sequence 0", w0, used1, false},
		{"sequence 0, a slot damaged", tornW0, used1, true},
		{"both slots damaged", make([]byte, witnessSize), used1, true},
		{"short", w0[:witnessSlot], used1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db")
			copyDir(t, v1, dir)
			wpath := filepath.Join(dir, WitnessFile)
			if err := os.WriteFile(wpath, c.witness, 0o600); err != nil {
				t.Fatal(err)
			}
			for i := range 2 { // twice: a refusal resets nothing
				st, err := Open(ctx, dir, nil)
				if c.corrupt {
					if err == nil {
						r := open(t, st)
						n := len(r.Services())
						fs, err := r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: "after"})
						_ = r.Close()
						t.Fatalf("open %d: opened a format-1 store beside that witness (%d services); its next edit signs %v (%v), counters up to %d were used",
							i, n, fs, err, c.used)
					}
					if !errors.Is(err, crdt.ErrCorrupt) || !strings.Contains(err.Error(), wpath) {
						t.Fatalf("open %d: %v, want ErrCorrupt naming %s", i, err, wpath)
					}
					t.Logf("open %d: %v", i, err)
					if b, _ := os.ReadFile(wpath); !bytes.Equal(b, c.witness) {
						t.Fatalf("open %d: the refused open changed the witness", i)
					}
					continue
				}
				if err != nil {
					t.Fatalf("open %d: %v", i, err)
				}
				r := open(t, st)
				got := dump(r)
				fs, err := r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: fmt.Sprint("after", i)})
				_ = r.Close()
				if got != state1 {
					t.Fatalf("open %d: the upgrade done again lost the format-1 state", i)
				}
				if err != nil || fs[0].Counter <= c.used {
					t.Fatalf("open %d: edit %v (counters up to %d used) %v", i, fs, c.used, err)
				}
				if v := rawFormat(t, dir); v != FormatVersion {
					t.Fatalf("format %d after the upgrade", v)
				}
				return
			}
		})
	}
}

// TestUpgradeDurableBeforeOpen: once Open of a format-1 store returns,
// the format marker no longer depends on the log, so that a log lost
// after the upgrade is a loss the witness sees (a format-2 database
// behind its witness), not a database back at format 1.
func TestUpgradeDurableBeforeOpen(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	recs, _ := format1Records(t, 4)
	writeFormat1(t, vfs.Default, dir, recs)
	st, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		if err := os.Remove(l); err != nil {
			t.Fatal(err)
		}
	}
	if v := rawFormat(t, dir); v != FormatVersion {
		t.Fatalf("without its log (%d files removed) the upgraded store is at format %d", len(logs), v)
	}
	w, err := readWitness(vfs.Default, filepath.Join(dir, WitnessFile))
	if err != nil || w.seq != 0 || w.torn {
		t.Fatalf("witness after the upgrade: %+v %v", w, err)
	}
}

// TestCrashDuringUpgrade upgrades a format-1 store on a crashable
// in-memory disk and runs a few edits, taking at every sync the disk a
// crash at that instant would leave (as TestCrashAtEverySync does). Every
// such disk opens (a crash during the upgrade leaves a store that is
// upgraded again), holds the state after a prefix of the edits that
// contains every acknowledged one, and its replica's next counter is
// above every counter signed before.
func TestCrashDuringUpgrade(t *testing.T) {
	const seed = 23
	ctx := context.Background()
	v1 := vfs.NewCrashableMem()
	recs, used1 := format1Records(t, 6)
	writeFormat1(t, v1, "db", recs)
	// The format-1 store as far as it was synced: the disk that is
	// upgraded.
	mem := v1.CrashClone(vfs.CrashCloneCfg{})
	rng := rand.New(rand.NewPCG(seed, 1))
	var (
		mu     sync.Mutex
		points []crashPoint
		acked  atomic.Int64
		rep    atomic.Pointer[crdt.Replica]
	)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			mu.Lock()
			a := int(acked.Load())
			spent := used1
			if r := rep.Load(); r != nil {
				spent = r.Counter(r.Author())
			}
			name := fmt.Sprintf("sync %s after %d edits", op.Path, a)
			points = append(points, crashPoint{fs: mem.CrashClone(vfs.CrashCloneCfg{}), acked: a, spent: spent, op: name},
				crashPoint{fs: mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}), acked: a, spent: spent, op: name + " (torn)"})
			mu.Unlock()
		}
		return nil
	})
	st, err := Open(ctx, "db", &Options{FS: errorfs.Wrap(mem, inj)})
	if err != nil {
		t.Fatal(err)
	}
	r := open(t, st)
	mu.Lock()
	upgradePoints := len(points)
	mu.Unlock()
	rep.Store(r)
	states := []string{dump(r)}
	const edits = 4
	for i := range edits {
		if _, err := r.Edit(ctx, crdt.ServiceID{byte(i)}, crdt.AnyRevision,
			crdt.Edit{Key: fmt.Sprint("k", i), Value: []byte(fmt.Sprint("v", i))}); err != nil {
			t.Fatal(err)
		}
		states = append(states, dump(r))
		acked.Add(1)
	}
	_ = r.Close()
	mu.Lock()
	defer mu.Unlock()
	if upgradePoints < 2 || len(points) < upgradePoints+2*edits {
		t.Fatalf("only %d sync points (%d in the upgrade)", len(points), upgradePoints)
	}
	t.Logf("seed %d: %d crash points, %d in the upgrade", seed, len(points), upgradePoints)
	for _, p := range points {
		st, err := Open(ctx, "db", &Options{FS: p.fs})
		if err != nil {
			t.Fatalf("seed %d, crash at %s: open: %v", seed, p.op, err)
		}
		r, err := crdt.Open(ctx, crdt.Config{Network: testNet, Signer: key(0), Store: st})
		if err != nil {
			_ = st.Close()
			t.Fatalf("seed %d, crash at %s: replica: %v", seed, p.op, err)
		}
		got := dump(r)
		if got != states[p.acked] && (p.acked == edits || got != states[p.acked+1]) {
			_ = r.Close()
			t.Fatalf("seed %d, crash at %s: state is not that after %d or %d edits", seed, p.op, p.acked, p.acked+1)
		}
		fs, err := r.Edit(ctx, crdt.ServiceID{9}, crdt.NoRevision, crdt.Edit{Key: "after"})
		if err != nil || fs[0].Counter <= p.spent {
			_ = r.Close()
			t.Fatalf("seed %d, crash at %s: edit after reopen: %v (counters up to %d signed) %v", seed, p.op, fs, p.spent, err)
		}
		_ = r.Close()
	}
}
