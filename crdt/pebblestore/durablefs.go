package pebblestore

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// manifestDirSyncFS is the file system pebble is given. It syncs the
// directory right after pebble creates a MANIFEST file, before pebble
// writes anything else.
//
// Pebble creates a new manifest, then a marker file naming it, and syncs
// the directory once after both. A file system that persists directory
// entries in any order (which POSIX allows, and which a crash of an
// unjournaled or reordering file system can leave) may keep the marker
// and lose the manifest it names: a database that no longer opens. With
// the manifest's entry synced first, a crash keeps either the old marker
// or a marker whose manifest exists. The cost is one directory sync per
// manifest, which pebble creates at open and on rotation.
type manifestDirSyncFS struct {
	vfs.FS
}

// Create creates name and, when it is a manifest, syncs its directory.
func (fs manifestDirSyncFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !strings.HasPrefix(fs.FS.PathBase(name), "MANIFEST-") {
		return f, err
	}
	if err := syncDir(fs.FS, fs.FS.PathDir(name)); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// Unwrap returns the file system below, for pebble's own checks.
func (fs manifestDirSyncFS) Unwrap() vfs.FS { return fs.FS }
