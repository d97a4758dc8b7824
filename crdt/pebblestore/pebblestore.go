// Package pebblestore is the on-disk crdt.Store: a pebble database holding
// a replica's meta record and one record per service, every Commit one
// synced pebble batch. It is a package of its own so that importers of crdt
// that need no disk store do not link pebble.
//
// Use:
//
//	st, err := pebblestore.Open(ctx, dir, nil)
//	r, err := crdt.Open(ctx, crdt.Config{Network: net, Signer: key, Store: st})
//	defer r.Close() // closes st
//
// The database records a format version (FormatVersion). Opening a
// database of an unknown version fails with crdt.ErrUnknownVersion; a
// damaged one (pebble's checksums, or crdt's record checks) fails with
// crdt.ErrCorrupt. Nothing is ever reset.
//
// Keys: "\x00format" holds the version as a varint; "m" the meta record;
// "s" followed by the 16-byte service id each service record.
package pebblestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/vipkit/vipkit/crdt"
)

// FormatVersion is the format version this package writes and reads.
const FormatVersion = 1

// ErrFailed is returned by every call after pebble failed fatally inside a
// commit (for example the disk refused the log write). The commit's batch
// is either wholly on disk or not at all; close the store and reopen it to
// learn which.
var ErrFailed = errors.New("pebblestore: store failed; reopen it")

var (
	keyFormat = []byte("\x00format")
	keyMeta   = []byte("m")
	prefixSvc = byte('s')
)

// Options configures Open. The zero value (or nil) is the real disk and a
// quiet logger.
type Options struct {
	// FS is the file system; nil means the real one (vfs.Default).
	FS vfs.FS
	// Logger receives pebble's messages; nil drops informational ones and
	// errors (which surface as returned errors). Fatal messages always make
	// the current call fail with ErrFailed instead of exiting the process.
	Logger pebble.Logger
	// CacheBytes is pebble's block cache size; 0 means 8 MiB.
	CacheBytes int64
}

// Store is a crdt.Store in a pebble database. It is safe for concurrent
// use, though a Replica serializes its calls anyway.
type Store struct {
	mu     sync.Mutex
	db     *pebble.DB
	closed bool
	failed error
	// corrupt is set when pebble has detected corruption of a file.
	corrupt atomic.Bool

	// failAfter, when > 0, makes the next Commit fail after writing that
	// many records to its batch minus one (a failure midway). For tests.
	failAfter int
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

// Open opens (creating if needed) the database in dir. An empty database
// gets FormatVersion recorded; a database without it, or with another, is
// refused.
func Open(ctx context.Context, dir string, o *Options) (s *Store, err error) {
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
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	s = &Store{}
	po := &pebble.Options{FS: opts.FS, Cache: cache, Logger: fatalLogger{opts.Logger},
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
			s, err = nil, fmt.Errorf("pebblestore: open %s: %w: %s", dir, crdt.ErrCorrupt, f.msg)
		}
	}()
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, wrapErr("open "+dir, err)
	}
	s.db = db
	if err := s.checkFormat(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

func wrapErr(op string, err error) error {
	if pebble.IsCorruptionError(err) {
		return fmt.Errorf("pebblestore: %s: %w: %w", op, crdt.ErrCorrupt, pebbleErr{err})
	}
	return fmt.Errorf("pebblestore: %s: %w", op, pebbleErr{err})
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

func (s *Store) checkFormat() error {
	v, closer, err := s.db.Get(keyFormat)
	if errors.Is(err, pebble.ErrNotFound) {
		it, err := s.db.NewIter(nil)
		if err != nil {
			return wrapErr("format", err)
		}
		empty := !it.First()
		ierr := it.Close()
		if ierr != nil {
			return wrapErr("format", ierr)
		}
		if !empty {
			return fmt.Errorf("pebblestore: %w: records without a format version", crdt.ErrCorrupt)
		}
		if err := s.db.Set(keyFormat, binary.AppendUvarint(nil, FormatVersion), pebble.Sync); err != nil {
			return wrapErr("format", err)
		}
		return nil
	}
	if err != nil {
		return wrapErr("format", err)
	}
	defer closer.Close()
	ver, n := binary.Uvarint(v)
	if n <= 0 || n != len(v) {
		return fmt.Errorf("pebblestore: %w: format record %x", crdt.ErrCorrupt, v)
	}
	if ver != FormatVersion {
		return fmt.Errorf("pebblestore: %w: format %d, this build reads %d", crdt.ErrUnknownVersion, ver, FormatVersion)
	}
	return nil
}

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
		case bytes.Equal(k, keyFormat):
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

// Commit implements crdt.Store: one pebble batch, committed with sync.
func (s *Store) Commit(ctx context.Context, b crdt.Batch) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx); err != nil {
		return err
	}
	defer s.recoverFatal(&err)
	batch := s.db.NewBatch()
	defer batch.Close()
	n := 0
	put := func(k, v []byte) error {
		n++
		if s.failAfter > 0 && n >= s.failAfter {
			s.failAfter = 0
			return fmt.Errorf("pebblestore: injected failure at record %d", n)
		}
		return batch.Set(k, v, nil)
	}
	if b.Meta != nil {
		if err := put(keyMeta, b.Meta); err != nil {
			return err
		}
	}
	for _, r := range b.Put {
		if err := put(svcKey(r.Service), r.Data); err != nil {
			return err
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
	return nil
}

// recoverFatal turns a fatal pebble error inside a call into ErrFailed.
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

// FailNextCommitForTest makes the next Commit fail after adding records-1
// records to its batch (before the batch is committed): a failure midway
// through building a commit. For tests.
func (s *Store) FailNextCommitForTest(records int) {
	s.mu.Lock()
	s.failAfter = records
	s.mu.Unlock()
}

// SetFormatForTest writes a format version, to test refusal of unknown
// versions. For tests.
func (s *Store) SetFormatForTest(v uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.db.Set(keyFormat, binary.AppendUvarint(nil, v), pebble.Sync)
}
