package pebblestore

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dbOf returns s's database, read with s.mu held as the store's methods
// read it.
func dbOf(s *Store) *pebble.DB {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.db
}

// diskHarness runs the contract suite on a real directory, through an
// errorfs that fails the disk on demand.
func diskHarness(t *testing.T) storetest.Harness {
	dir := filepath.Join(t.TempDir(), "db")
	ctx := context.Background()
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errorfs.ErrInjected
		}
		return nil
	})}
	fs := errorfs.Wrap(vfs.Default, toggle)
	return storetest.Harness{
		Open: func(testing.TB) (crdt.Store, error) {
			toggle.Off()
			return Open(ctx, dir, &Options{FS: fs})
		},
		// The disk refuses the commit's log write.
		FailNextCommit: func(testing.TB, crdt.Store) { toggle.On() },
		CorruptRecord: func(t testing.TB, id crdt.ServiceID) {
			s, err := Open(ctx, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			v, closer, err := dbOf(s).Get(svcKey(id))
			if err != nil {
				t.Fatal(err)
			}
			v = bytes.Clone(v)
			closer.Close()
			v[len(v)/2] ^= 0x20
			if err := dbOf(s).Set(svcKey(id), v, nil); err != nil {
				t.Fatal(err)
			}
		},
		SetVersion: func(t testing.TB, v uint64) {
			s, err := Open(ctx, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := dbOf(s).Set(keyFormat, binary.AppendUvarint(nil, v), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		},
		UnknownVersion: FormatVersion + 1,
	}
}

func TestPebbleContract(t *testing.T) { storetest.Run(t, diskHarness) }

var testNet = crdt.NetworkID{0x70}

func key(i int) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{byte(0x30 + i)}, 32))
}

func open(t testing.TB, st crdt.Store) *crdt.Replica {
	t.Helper()
	r, err := crdt.Open(context.Background(), crdt.Config{Network: testNet, Signer: key(0), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func dump(r *crdt.Replica) string {
	var b strings.Builder
	for _, s := range r.Services() {
		enc, _ := r.EncodedSnapshot(s.ID)
		b.Write(enc)
	}
	return b.String()
}

func populate(t testing.TB, r *crdt.Replica, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := r.Edit(context.Background(), crdt.ServiceID{byte(i)}, crdt.NoRevision,
			crdt.Edit{Key: "name", Value: bytes.Repeat([]byte{'a' + byte(i)}, 300)}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCorruptFileFailsOpen flips bytes inside the sorted tables on disk:
// opening the replica fails with ErrCorrupt, and keeps failing (no reset).
func TestCorruptFileFailsOpen(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	st, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := open(t, st)
	populate(t, r, 20)
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	ssts, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(ssts) == 0 {
		t.Fatal("no sstable after flush")
	}
	for _, p := range ssts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 64; i < len(b)/2; i += 97 {
			b[i] ^= 0xff
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		st, err := Open(ctx, dir, nil)
		if err == nil {
			_, err = crdt.Open(ctx, crdt.Config{Network: testNet, Store: st})
			_ = st.Close()
		}
		if !errors.Is(err, crdt.ErrCorrupt) {
			t.Fatalf("open %d of a corrupted file: %v", i, err)
		}
		t.Logf("open %d: %v", i, err)
	}
}

// TestCrashDuringCommit makes the disk refuse the log write of a commit:
// the commit fails (pebble's fatal error becomes ErrFailed, the process
// lives), the replica keeps its old state, and the database recovered from
// what had been synced holds the old state too.
func TestCrashDuringCommit(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errorfs.ErrInjected
		}
		return nil
	})}
	st, err := Open(ctx, "db", &Options{FS: errorfs.Wrap(mem, toggle)})
	if err != nil {
		t.Fatal(err)
	}
	r := open(t, st)
	populate(t, r, 5)
	want := dump(r)
	toggle.On()
	_, err = r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: "x", Value: []byte("lost")})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("commit on a failing disk: %v", err)
	}
	if dump(r) != want {
		t.Fatal("failed commit changed the replica")
	}
	if _, err := r.Edit(ctx, crdt.ServiceID{1}, crdt.AnyRevision, crdt.Edit{Key: "y"}); !errors.Is(err, ErrFailed) {
		t.Fatalf("store not poisoned: %v", err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = r.Close()
	st2, err := Open(ctx, "db", &Options{FS: crashed})
	if err != nil {
		t.Fatal(err)
	}
	r2 := open(t, st2)
	defer r2.Close()
	if dump(r2) != want {
		t.Fatal("recovered database differs from the last committed state")
	}
}

func TestOpenRefusesUnversioned(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	st, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := dbOf(st).Delete(keyFormat, nil); err != nil {
		t.Fatal(err)
	}
	if err := dbOf(st).Set([]byte("m"), []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	if _, err := Open(ctx, dir, nil); !errors.Is(err, crdt.ErrCorrupt) {
		t.Fatalf("unversioned database: %v", err)
	}
}
