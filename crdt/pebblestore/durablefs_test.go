package pebblestore

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestManifestEntrySyncedAtCreate: a crash right after pebble creates a
// manifest keeps the manifest's directory entry, so a marker written
// after it can never name a file the disk lost. Other files keep
// pebble's own directory syncs.
func TestManifestEntrySyncedAtCreate(t *testing.T) {
	mem := vfs.NewCrashableMem()
	if err := mem.MkdirAll("db", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(mem, ""); err != nil {
		t.Fatal(err)
	}
	fs := manifestDirSyncFS{mem}
	for _, name := range []string{"db/MANIFEST-000007", "db/000008.log"} {
		f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	if _, err := crashed.Stat("db/MANIFEST-000007"); err != nil {
		t.Fatalf("the manifest's entry did not survive a crash after its create: %v", err)
	}
	if _, err := crashed.Stat("db/000008.log"); err == nil {
		t.Fatal("a log's entry survived without a directory sync: the wrapper syncs more than manifests")
	}
}
