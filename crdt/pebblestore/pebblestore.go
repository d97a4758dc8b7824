// Package pebblestore is the on-disk crdt.Store: a pebble database holding
// a replica's meta record and one record per service, every Commit one
// synced pebble batch, and a witness file that lets Open prove that the
// database still holds every commit it acknowledged. It is a package of
// its own so that importers of crdt that need no disk store do not link
// pebble.
//
// Use:
//
//	st, err := pebblestore.Open(ctx, dir, nil)
//	r, err := crdt.Open(ctx, crdt.Config{Network: net, Signer: key, Store: st})
//	defer r.Close() // closes st
//
// # Guarantee
//
// When Commit returns nil, the batch is on stable storage and every later
// Open either sees it (and everything committed before it) or fails with
// crdt.ErrCorrupt naming the damaged file. Open never returns an older or
// an empty state in place of an acknowledged one. The only change Open
// tolerates silently is the loss of a commit that was never acknowledged
// (Commit did not return nil: a crash, or a torn tail of its log write).
// Since every reservation of author counters is such a commit, a replica
// opened on this store never signs a counter it may already have used.
//
// Pebble alone cannot give this: its log recovery stops at the first bad
// record and opens the database from what came before, so a flipped bit
// or a truncation in the log silently rolls the database back, and a
// zeroed log empties it. The witness closes that gap. Every commit carries
// a sequence number (the key "\x00seq"), and after the commit is synced
// the witness file (WitnessFile) records it, synced too, before Commit
// returns. Open compares the two: a database behind its witness has lost
// acknowledged commits and fails with crdt.ErrCorrupt naming the log; a
// witness more than one commit behind its database, missing or unreadable
// fails too, naming the witness. A database exactly one commit ahead is a
// crash between the two syncs: that commit was never acknowledged, is
// kept, and the witness catches up.
//
// Cost: one more small write and fdatasync per commit, to a file that
// never grows (about as much as pebble's own log sync; see
// BenchmarkPebbleCommitFullSnapshot).
//
// The witness cannot detect the loss of the whole directory, or its
// replacement by an older copy together with its witness (a restored
// backup): never restore a store from a backup; start an empty one, which
// merges the state back from the network, under a new key.
//
// # Formats
//
// The witness is two 4 KiB slots, one written per commit in turn: magic
// "vkw1", the sequence number (u64 little endian) and a CRC-32C of both,
// so that a write torn by a crash leaves the other slot intact.
//
// The database records a format version (FormatVersion). Opening a
// database of an unknown version fails with crdt.ErrUnknownVersion; a
// damaged one (pebble's checksums, missing or short files, crdt's record
// checks, the witness) fails with crdt.ErrCorrupt. Nothing is ever reset.
// A database of format 1 (written before the witness existed) is upgraded
// on Open, and Open returns only once the upgrade is durable: first the
// witness at sequence 0 (synced, with its directory), then format 2 and
// sequence 0 in one synced batch, flushed to a sorted table so that the
// format no longer depends on the log. A format-1 database beside a
// witness at sequence 0 (both slots intact) is an upgrade cut short by a
// crash, and is upgraded again. Beside a witness that records
// acknowledged commits it is a database whose log lost the upgrade and
// what came after it, and beside a damaged witness one that cannot be
// told apart from that: both fail with crdt.ErrCorrupt naming the witness
// (and the log), so that the store never falls back to format 1 and
// signs its counters again. A build that knows only format 1 refuses a
// format-2 database with its ErrUnknownVersion.
//
// Keys: "\x00format" holds the version as a varint; "\x00seq" the commit
// sequence number as a varint; "m" the meta record; "s" followed by the
// 16-byte service id each service record.
package pebblestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/syncx"
)

// FormatVersion is the format version this package writes and reads:
// 2 is the format with the witness; a format 1 database (without it) is
// upgraded on Open.
const FormatVersion = 2

// WitnessFile is the name of the witness file in the store's directory.
const WitnessFile = "VIPKIT-WITNESS"

// ErrFailed is returned by every call after pebble or the witness failed
// fatally inside a commit (for example the disk refused the log write).
// The commit's batch is either wholly on disk or not at all; close the
// store and reopen it to learn which.
var ErrFailed = errors.New("pebblestore: store failed; reopen it")

// The keys of the records other than the services'; read-only.
var (
	keyFormat = []byte("\x00format") // +checklocksignore: read-only
	keySeq    = []byte("\x00seq")    // +checklocksignore: read-only
	keyMeta   = []byte("m")          // +checklocksignore: read-only
	prefixSvc = byte('s')
)

// Options configures Open. The zero value (or nil) is the real disk and a
// quiet logger.
type Options struct {
	// FS is the file system; nil means the real one (vfs.Default). Tests
	// pass pebble's vfs.NewCrashableMem or an errorfs wrapper to crash or
	// fail the disk at chosen operations.
	FS vfs.FS
	// Logger receives pebble's messages; nil drops informational ones and
	// errors (which surface as returned errors). A fatal message inside a
	// call of this package makes that call fail with ErrFailed instead of
	// exiting the process. One in pebble's background work (a flush or a
	// compaction whose write the disk refused) panics on pebble's own
	// goroutine and so ends the process, as pebble's default logger would;
	// the store's guarantee holds across that crash.
	Logger pebble.Logger
	// CacheBytes is pebble's block cache size; 0 means 8 MiB.
	CacheBytes int64
}

// Store is a crdt.Store in a pebble database. It is safe for concurrent
// use, though a Replica serializes its calls anyway.
type Store struct {
	// mu guards the database handle, the witness file, the sequence
	// number and the closed and failed states.
	mu syncx.Mutex
	// +checklocks:mu
	db  *pebble.DB
	fs  vfs.FS // +checklocksignore: set by Open, read-only after
	dir string // +checklocksignore: set by Open, read-only after
	// +checklocks:mu
	witness vfs.File
	// seq is the last commit's sequence number.
	// +checklocks:mu
	seq uint64
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	failed error
	// corrupt is set when pebble has detected corruption of a file.
	corrupt atomic.Bool
}

var _ crdt.Store = (*Store)(nil)

// fatal is the panic value of fatalLogger.Fatalf.
type fatal struct{ msg string }

type fatalLogger struct{ next pebble.Logger }

func (l fatalLogger) Infof(format string, args ...any) {
	if l.next != nil {
		l.next.Infof(format, args...)
	}
}

func (l fatalLogger) Errorf(format string, args ...any) {
	if l.next != nil {
		l.next.Errorf(format, args...)
	}
}

func (l fatalLogger) Fatalf(format string, args ...any) {
	panic(fatal{fmt.Sprintf(format, args...)})
}

// Open opens (creating if needed) the store in dir and checks it against
// its witness (see the package doc). A failed Open leaves nothing open and
// no goroutine running.
func Open(ctx context.Context, dir string, o *Options) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = 8 << 20
	}
	if opts.FS == nil {
		// Passed explicitly: pebble would otherwise wrap the disk in a
		// health checker whose goroutine outlives a failed open.
		opts.FS = vfs.Default
	}
	s := &Store{fs: opts.FS, dir: dir}
	// No one else has s yet; the lock is for the helpers, which expect it.
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(dir, opts); err != nil {
		return nil, err
	}
	return s, nil
}

// openLocked opens the database and checks its format; on failure it
// releases what it had opened.
//
// +checklocks:s.mu
// +checklocksignore: its body is not checked, because the analyzer
// reports a held lock on the path of the recovered panic, where s.mu is
// held as on every other path.
func (s *Store) openLocked(dir string, opts Options) (err error) {
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	po := &pebble.Options{FS: manifestDirSyncFS{opts.FS}, Cache: cache, Logger: fatalLogger{opts.Logger},
		EventListener: &pebble.EventListener{
			// Pebble's default makes detected corruption fatal; the read
			// that met it returns the corruption error instead.
			DataCorruption: func(info pebble.DataCorruptionInfo) { s.corrupt.Store(true) },
		}}
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(fatal)
			if !ok {
				panic(p)
			}
			s.release()
			err = fmt.Errorf("pebblestore: open %s: %w: %s", dir, crdt.ErrCorrupt, f.msg)
		}
	}()
	if err := opts.FS.MkdirAll(dir, 0o700); err != nil {
		return wrapErr("open "+dir, err)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return wrapErr("open "+dir, err)
	}
	s.db = db
	if err := s.checkFormat(); err != nil {
		s.release()
		return err
	}
	return nil
}

// release closes whatever Open had opened, after a failure.
//
// +checklocks:s.mu
func (s *Store) release() {
	if s.witness != nil {
		_ = s.witness.Close()
		s.witness = nil
	}
	if s.db != nil {
		closeQuietly(s.db)
		s.db = nil
	}
}

// closeQuietly closes db after a failure, ignoring its error and a fatal
// panic of pebble's.
func closeQuietly(db *pebble.DB) {
	defer func() { _ = recover() }()
	_ = db.Close()
}

// wrapErr wraps a pebble or file system error. Anything but an error of
// the environment (permissions, a full disk, a held lock, I/O errors,
// cancellation) means damaged or missing files: crdt.ErrCorrupt.
func wrapErr(op string, err error) error {
	if isEnvErr(err) {
		return fmt.Errorf("pebblestore: %s: %w", op, pebbleErr{err})
	}
	return fmt.Errorf("pebblestore: %s: %w: %w", op, crdt.ErrCorrupt, pebbleErr{err})
}

func isEnvErr(err error) bool {
	if pebble.IsCorruptionError(err) {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pebble.ErrClosed) {
		return true
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT, syscall.EISDIR, syscall.ENOTDIR:
			return false // a file the database names is missing
		}
		return true
	}
	return errors.Is(err, os.ErrPermission) || errors.Is(err, os.ErrDeadlineExceeded)
}

func wrapErrIf(op string, err error) error {
	if err == nil {
		return nil
	}
	return wrapErr(op, err)
}

// pebbleErr keeps a pebble error's chain but only the first line of its
// message (pebble's errors can carry multi-line details).
type pebbleErr struct{ err error }

func (e pebbleErr) Error() string {
	msg, _, _ := strings.Cut(e.err.Error(), "\n")
	return msg
}

func (e pebbleErr) Unwrap() error { return e.err }

// +checklocks:s.mu
func (s *Store) getUvarint(key []byte) (v uint64, found bool, err error) {
	b, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, wrapErr("read "+string(key[1:]), err)
	}
	defer closer.Close()
	v, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) {
		return 0, true, fmt.Errorf("pebblestore: %w: %s record %x", crdt.ErrCorrupt, key[1:], b)
	}
	return v, true, nil
}

// +checklocks:s.mu
func (s *Store) isEmpty() (bool, error) {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return false, wrapErr("open", err)
	}
	empty := !it.First()
	if err := it.Close(); err != nil {
		return false, wrapErr("open", err)
	}
	return empty, nil
}

// checkFormat checks the format record and the witness, creating both in
// an empty database and upgrading a format-1 one.
//
// +checklocks:s.mu
func (s *Store) checkFormat() error {
	ver, found, err := s.getUvarint(keyFormat)
	if err != nil {
		return err
	}
	wpath := s.fs.PathJoin(s.dir, WitnessFile)
	if !found {
		empty, err := s.isEmpty()
		if err != nil {
			return err
		}
		if !empty {
			return fmt.Errorf("pebblestore: %w: records without a format version", crdt.ErrCorrupt)
		}
		// A witness beside an empty database is either the remains of a
		// creation that crashed before its first record (sequence 0) or
		// the sign that the log lost everything.
		if w, err := readWitness(s.fs, wpath); err == nil && w.seq > 0 {
			return fmt.Errorf("pebblestore: %w: the database is empty but witness %s records %d acknowledged commits: the log (%s) lost them",
				crdt.ErrCorrupt, wpath, w.seq, s.logFiles())
		} else if err != nil && !errors.Is(err, errNoWitness) {
			return err
		}
		return s.initialize()
	}
	switch ver {
	case 1:
		return s.upgrade(wpath)
	case FormatVersion:
	default:
		return fmt.Errorf("pebblestore: %w: format %d, this build reads %d", crdt.ErrUnknownVersion, ver, FormatVersion)
	}
	seq, found, err := s.getUvarint(keySeq)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("pebblestore: %w: format %d without a commit sequence number", crdt.ErrCorrupt, ver)
	}
	w, err := readWitness(s.fs, wpath)
	if err != nil {
		return err
	}
	switch {
	case seq < w.seq:
		return fmt.Errorf("pebblestore: %w: the database holds commit %d but witness %s records %d acknowledged: the log (%s) lost acknowledged commits",
			crdt.ErrCorrupt, seq, wpath, w.seq, s.logFiles())
	case seq > w.seq+1 || (w.torn && seq != w.seq+1):
		return fmt.Errorf("pebblestore: %w: witness %s records commit %d (slots %v) but the database holds %d: the witness is damaged",
			crdt.ErrCorrupt, wpath, w.seq, w.slots, seq)
	}
	f, err := s.fs.OpenReadWrite(wpath, vfs.WriteCategoryUnspecified)
	if err != nil {
		return wrapErr("open witness", err)
	}
	s.witness, s.seq = f, seq
	if seq != w.seq || w.torn {
		// The last commit was synced but the crash came before its
		// witness: it was never acknowledged, and it is kept.
		if err := s.writeWitness(seq); err != nil {
			return err
		}
	}
	return nil
}

// upgrade checks a format-1 database against the witness beside it and
// upgrades it. A format-1 database was written before the witness
// existed, so the only witness that may be there is one at sequence 0
// with both slots intact: an upgrade that was cut short before its format
// record was durable, which is done again. A witness that records
// acknowledged commits means that the log lost the upgrade and the
// commits after it, and the database fell back to the format-1 records of
// its sorted tables; a damaged one cannot tell. Both are ErrCorrupt.
//
// +checklocks:s.mu
func (s *Store) upgrade(wpath string) error {
	w, err := readWitness(s.fs, wpath)
	switch {
	case errors.Is(err, errNoWitness):
	case err != nil:
		return fmt.Errorf("%w (beside a format-1 database)", err)
	case w.seq > 0:
		return fmt.Errorf("pebblestore: %w: the database is at format 1 but witness %s records %d acknowledged commits at format %d: the log (%s) lost the upgrade and the commits after it",
			crdt.ErrCorrupt, wpath, w.seq, FormatVersion, s.logFiles())
	case w.torn:
		return fmt.Errorf("pebblestore: %w: the database is at format 1 beside witness %s with a damaged slot (slots %v): not the witness of an upgrade cut short",
			crdt.ErrCorrupt, wpath, w.slots)
	}
	if err := s.initialize(); err != nil {
		return err
	}
	// The format record is synced in the log; the flush puts it in a
	// sorted table too, so that a log lost after this point leaves a
	// format-2 database, which the witness checks, rather than the
	// format-1 records below it.
	if err := s.db.Flush(); err != nil {
		return wrapErr("upgrade", err)
	}
	return nil
}

// initialize gives an empty or format-1 database its witness (first, so
// that a crash in between leaves a database that initializes again) and
// then format 2 and sequence 0.
//
// +checklocks:s.mu
func (s *Store) initialize() error {
	wpath := s.fs.PathJoin(s.dir, WitnessFile)
	tmp := wpath + ".tmp"
	f, err := s.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return wrapErr("create witness", err)
	}
	buf := make([]byte, witnessSize)
	putSlot(buf[0:], 0)
	putSlot(buf[witnessSlot:], 0)
	if _, err := f.Write(buf); err != nil {
		_ = f.Close()
		return wrapErr("create witness", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return wrapErr("create witness", err)
	}
	if err := f.Close(); err != nil {
		return wrapErr("create witness", err)
	}
	if err := s.fs.Rename(tmp, wpath); err != nil {
		return wrapErr("create witness", err)
	}
	if err := syncDir(s.fs, s.dir); err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(keyFormat, binary.AppendUvarint(nil, FormatVersion), nil)
	_ = b.Set(keySeq, binary.AppendUvarint(nil, 0), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return wrapErr("format", err)
	}
	if s.witness, err = s.fs.OpenReadWrite(wpath, vfs.WriteCategoryUnspecified); err != nil {
		return wrapErr("open witness", err)
	}
	s.seq = 0
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return wrapErr("sync "+dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return wrapErrIf("sync "+dir, err)
}

// logFiles names the database's log files, for errors.
func (s *Store) logFiles() string {
	names, _ := s.fs.List(s.dir)
	var logs []string
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			logs = append(logs, s.fs.PathJoin(s.dir, n))
		}
	}
	slices.Sort(logs)
	if len(logs) == 0 {
		return "no log file"
	}
	return strings.Join(logs, ", ")
}

// The witness file: two slots of witnessSlot bytes, each magic, sequence
// number (little endian) and CRC-32C of both; commit n writes slot n%2.
const (
	witnessSlot  = 4096
	witnessSize  = 2 * witnessSlot
	witnessMagic = "vkw1"
	slotLen      = 4 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errNoWitness = errors.New("pebblestore: no witness file")

func putSlot(b []byte, seq uint64) {
	copy(b, witnessMagic)
	binary.LittleEndian.PutUint64(b[4:], seq)
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(b[:12], castagnoli))
}

func getSlot(b []byte) (uint64, bool) {
	if string(b[:4]) != witnessMagic || crc32.Checksum(b[:12], castagnoli) != binary.LittleEndian.Uint32(b[12:16]) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[4:]), true
}

type witness struct {
	seq   uint64
	torn  bool // one slot does not read: a write torn by a crash, or damage
	slots [2]string
}

func readWitness(fs vfs.FS, path string) (witness, error) {
	var w witness
	f, err := fs.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return w, fmt.Errorf("%w: %w: %s is missing", errNoWitness, crdt.ErrCorrupt, path)
		}
		return w, wrapErr("read witness", err)
	}
	defer f.Close()
	buf := make([]byte, witnessSize)
	if n, err := f.ReadAt(buf, 0); n != witnessSize {
		if err == nil || errors.Is(err, io.EOF) {
			return w, fmt.Errorf("pebblestore: %w: witness %s is %d bytes, want %d", crdt.ErrCorrupt, path, n, witnessSize)
		}
		return w, wrapErr("read witness", err)
	}
	a, aok := getSlot(buf[0:])
	b, bok := getSlot(buf[witnessSlot:])
	for i, ok := range []bool{aok, bok} {
		w.slots[i] = "damaged"
		if ok {
			w.slots[i] = fmt.Sprint([]uint64{a, b}[i])
		}
	}
	switch {
	case !aok && !bok:
		return w, fmt.Errorf("pebblestore: %w: witness %s: both slots damaged", crdt.ErrCorrupt, path)
	case aok && bok:
		hi, lo := max(a, b), min(a, b)
		// Slot n%2 holds commit n: the other holds n-1 (or both hold 0
		// after creation).
		if (hi != lo+1 && hi != lo) || (hi != lo && [2]uint64{a, b}[hi%2] != hi) {
			return w, fmt.Errorf("pebblestore: %w: witness %s: slots %d and %d disagree", crdt.ErrCorrupt, path, a, b)
		}
		w.seq = hi
	case aok:
		w.seq, w.torn = a, true
	default:
		w.seq, w.torn = b, true
	}
	return w, nil
}

// writeWitness records seq as acknowledged: slot seq%2, synced.
//
// +checklocks:s.mu
func (s *Store) writeWitness(seq uint64) error {
	var b [slotLen]byte
	putSlot(b[:], seq)
	if _, err := s.witness.WriteAt(b[:], int64(seq%2)*witnessSlot); err != nil {
		return wrapErr("write witness", err)
	}
	if err := s.witness.SyncData(); err != nil {
		return wrapErr("sync witness", err)
	}
	return nil
}

// +checklocks:s.mu
func (s *Store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed {
		return crdt.ErrClosed
	}
	return s.failed
}

// Load implements crdt.Store.
func (s *Store) Load(ctx context.Context) (recs crdt.Records, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx); err != nil {
		return recs, err
	}
	defer s.recoverFatal(&err)
	it, err := s.db.NewIter(nil)
	if err != nil {
		return recs, wrapErr("load", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		switch {
		case bytes.Equal(k, keyFormat), bytes.Equal(k, keySeq):
		case bytes.Equal(k, keyMeta):
			recs.Meta = bytes.Clone(it.Value())
		case len(k) == 1+len(crdt.ServiceID{}) && k[0] == prefixSvc:
			var id crdt.ServiceID
			copy(id[:], k[1:])
			recs.Services = append(recs.Services, crdt.Record{Service: id, Data: bytes.Clone(it.Value())})
		default:
			_ = it.Close()
			return crdt.Records{}, fmt.Errorf("pebblestore: %w: unexpected key %q", crdt.ErrCorrupt, k)
		}
	}
	if err := it.Close(); err != nil {
		return crdt.Records{}, wrapErr("load", err)
	}
	return recs, nil
}

func svcKey(id crdt.ServiceID) []byte { return append([]byte{prefixSvc}, id[:]...) }

// Commit implements crdt.Store: one pebble batch with the next sequence
// number, committed with sync, then the witness of that number, synced.
// A failure of either poisons the store (ErrFailed).
func (s *Store) Commit(ctx context.Context, b crdt.Batch) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx); err != nil {
		return err
	}
	defer s.recoverFatal(&err)
	batch := s.db.NewBatch()
	defer batch.Close()
	seq := s.seq + 1
	if err := batch.Set(keySeq, binary.AppendUvarint(nil, seq), nil); err != nil {
		return wrapErr("commit", err)
	}
	if b.Meta != nil {
		if err := batch.Set(keyMeta, b.Meta, nil); err != nil {
			return wrapErr("commit", err)
		}
	}
	for _, r := range b.Put {
		if err := batch.Set(svcKey(r.Service), r.Data, nil); err != nil {
			return wrapErr("commit", err)
		}
	}
	for _, id := range b.Delete {
		if err := batch.Delete(svcKey(id), nil); err != nil {
			return wrapErr("commit", err)
		}
	}
	if err := batch.Commit(pebble.Sync); err != nil {
		return wrapErr("commit", err)
	}
	s.seq = seq
	if err := s.writeWitness(seq); err != nil {
		// The batch is durable but not acknowledged; the next Open keeps
		// it. Nothing more is committed before then.
		s.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		return s.failed
	}
	return nil
}

// recoverFatal turns a fatal pebble error inside a call into ErrFailed.
//
// +checklocks:s.mu
func (s *Store) recoverFatal(err *error) {
	if p := recover(); p != nil {
		f, ok := p.(fatal)
		if !ok {
			panic(p)
		}
		s.failed = fmt.Errorf("%w: %s", ErrFailed, f.msg)
		*err = s.failed
	}
}

// Close implements crdt.Store. After a fatal failure it releases what it
// can; the database is then recovered by the next Open.
func (s *Store) Close() (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return crdt.ErrClosed
	}
	s.closed = true
	failed := s.failed
	defer s.recoverFatal(&err)
	if s.witness != nil {
		_ = s.witness.Close()
	}
	err = s.db.Close()
	if failed != nil {
		// Pebble reports the failure again; it was already returned.
		return nil
	}
	return wrapErrIf("close", err)
}

// Flush writes the memtable to sorted tables (so that the next Open need
// not replay the log). Replicas do not need it; tools and tests may.
func (s *Store) Flush(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx); err != nil {
		return err
	}
	defer s.recoverFatal(&err)
	return s.db.Flush()
}
