package crdt

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Store is the durable home of a replica's state: one meta record (the
// network, the Lamport high-water mark and the local authors' counters) and
// one record per service (its snapshot). Records are opaque to the store;
// crdt frames each with a CRC-32C and checks it on Open (ErrCorrupt).
//
// Implementations: MemStore here, pebblestore.Store on disk. Both pass the
// contract suite in crdt/storetest. A Store is used by one Replica at a
// time; its methods need not be safe for concurrent use.
//
// The replica calls Load from Open and Commit with its write lock held (a
// commit is part of the merge or edit it makes durable, and every other
// merge and edit waits for it): Load and Commit must not call the Replica.
// Close is called with no replica lock held, after the last commit.
type Store interface {
	// Load returns every committed record, services in id order. An empty
	// store returns Records with a nil Meta. A store that cannot be read
	// faithfully (unknown format version, damaged files) returns an error
	// wrapping ErrUnknownVersion or ErrCorrupt; it never resets itself.
	Load(ctx context.Context) (Records, error)
	// Commit applies b atomically and durably: when it returns nil, every
	// record of b is on stable storage (synced); when it returns an error,
	// the store holds either all of b or none of it, and a store that
	// cannot tell returns its failure on every later call.
	Commit(ctx context.Context, b Batch) error
	// Close releases the store. Later calls return ErrClosed.
	Close() error
}

// Record is one service's stored record.
type Record struct {
	Service ServiceID
	Data    []byte
}

// Records is the content of a store.
type Records struct {
	Meta     []byte
	Services []Record
}

// Batch is one atomic change: the new meta record (nil keeps the old one),
// service records to write (replacing any old one) and to remove.
type Batch struct {
	Meta   []byte
	Put    []Record
	Delete []ServiceID
}

// MemStore is an in-memory Store for tests and for replicas that need no
// durability. Its durable content survives Close: Reopen returns a new
// MemStore over it, as a restart would. Safe for concurrent use.
type MemStore struct {
	d *memData
	// mu guards closed.
	mu syncx.Mutex
	// +checklocks:mu
	closed bool
}

// memData is the durable content of a MemStore, shared with the MemStores
// that Reopen makes over it.
type memData struct {
	// mu guards the content.
	mu syncx.Mutex
	// +checklocks:mu
	version uint32
	// +checklocks:mu
	meta []byte
	// +checklocks:mu
	services map[ServiceID][]byte
}

var _ Store = (*MemStore)(nil)

// MemStoreVersion is the format version a MemStore records.
const MemStoreVersion = 1

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{d: &memData{version: MemStoreVersion, services: map[ServiceID][]byte{}}}
}

// Reopen returns a new MemStore over s's content, like reopening a file
// after a restart. s should be closed first (its content is shared).
func (s *MemStore) Reopen() *MemStore { return &MemStore{d: s.d} }

// Load implements Store.
func (s *MemStore) Load(ctx context.Context) (Records, error) {
	if err := s.check(ctx); err != nil {
		return Records{}, err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.d.version != MemStoreVersion {
		return Records{}, fmt.Errorf("crdt: mem store: %w: %d", ErrUnknownVersion, s.d.version)
	}
	r := Records{Meta: bytes.Clone(s.d.meta)}
	for id, data := range s.d.services {
		r.Services = append(r.Services, Record{Service: id, Data: bytes.Clone(data)})
	}
	slices.SortFunc(r.Services, func(a, b Record) int { return bytes.Compare(a.Service[:], b.Service[:]) })
	return r, nil
}

// Commit implements Store. It builds the new content aside and swaps it in.
func (s *MemStore) Commit(ctx context.Context, b Batch) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	next := make(map[ServiceID][]byte, len(s.d.services)+len(b.Put))
	for id, data := range s.d.services {
		next[id] = data
	}
	for _, r := range b.Put {
		next[r.Service] = bytes.Clone(r.Data)
	}
	for _, id := range b.Delete {
		delete(next, id)
	}
	if b.Meta != nil {
		s.d.meta = bytes.Clone(b.Meta)
	}
	s.d.services = next
	return nil
}

// Close implements Store.
func (s *MemStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	return nil
}

func (s *MemStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Record framing: body || CRC-32C(body), little endian.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func appendCRC(b []byte, start int) []byte {
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

func checkCRC(rec []byte) ([]byte, error) {
	if len(rec) < 4 {
		return nil, fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(rec))
	}
	body := rec[:len(rec)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(rec[len(rec)-4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return body, nil
}

// metaVersion is the format version of the meta record written while the
// replica holds no compaction state; metaVersionCompact the one written
// once it does (version 2 and two options after it). decodeMeta reads
// version 1 too (no member set, no former members).
const (
	metaVersion        = 2
	metaVersionCompact = 3
)

// meta is the replica-wide durable state.
type meta struct {
	network NetworkID
	lamport uint64              // highest Lamport clock seen
	counter map[AuthorID]uint64 // counters reserved (used or not) per local author
	// members is the member set, in author order. A version-1 record has
	// none: the replica takes Config.Members.
	members []AuthorID
	// former is the former-member list: author to last counter.
	former map[AuthorID]uint64
	// acked is the encoding of the last compaction this replica
	// acknowledged (nil for none); cert the encoding of the certificate
	// it holds (nil for none). Both are written with version 3.
	acked, cert []byte
	// version is the version of the decoded record (0 for none).
	version uint32
}

// encodeMeta encodes m as a framed record, in the postcard rules: version
// u32 (2), network [16], Lamport u64, a vector of (author [32], counter
// u64), a vector of member authors [32] and a vector of former members
// (author [32], last counter u64), each vector in strict author order,
// followed by the CRC-32C. Version 1 ends after the counters.
func encodeMeta(m *meta) []byte {
	ver := uint64(metaVersion)
	if m.acked != nil || m.cert != nil {
		ver = metaVersionCompact
	}
	b := appendUvarint(nil, ver)
	b = append(b, m.network[:]...)
	b = appendUvarint(b, m.lamport)
	b = appendAuthorMap(b, m.counter)
	b = appendUvarint(b, uint64(len(m.members)))
	for _, a := range m.members {
		b = append(b, a[:]...)
	}
	b = appendAuthorMap(b, m.former)
	if ver == metaVersionCompact {
		b = appendOptBytes(b, m.acked)
		b = appendOptBytes(b, m.cert)
	}
	return appendCRC(b, 0)
}

func appendOptBytes(b, v []byte) []byte {
	if v == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = appendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func readOptBytes(b []byte, off int) ([]byte, int, error) {
	if off >= len(b) {
		return nil, 0, fmt.Errorf("%w: meta truncated", ErrCorrupt)
	}
	switch b[off] {
	case 0:
		return nil, off + 1, nil
	case 1:
	default:
		return nil, 0, fmt.Errorf("%w: %w in meta record", ErrCorrupt, ErrBadOption)
	}
	n, off, err := readUvarint(b, off+1, 10, uint64(len(b)))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if n > uint64(len(b)-off) {
		return nil, 0, fmt.Errorf("%w: meta truncated", ErrCorrupt)
	}
	return bytes.Clone(b[off : off+int(n)]), off + int(n), nil
}

func sortedAuthors[V any](m map[AuthorID]V) []AuthorID {
	authors := make([]AuthorID, 0, len(m))
	for a := range m {
		authors = append(authors, a)
	}
	slices.SortFunc(authors, func(x, y AuthorID) int { return bytes.Compare(x[:], y[:]) })
	return authors
}

// appendAuthorMap appends a vector of (author [32], u64) in author order.
func appendAuthorMap(b []byte, m map[AuthorID]uint64) []byte {
	authors := sortedAuthors(m)
	b = appendUvarint(b, uint64(len(authors)))
	for _, a := range authors {
		b = append(b, a[:]...)
		b = appendUvarint(b, m[a])
	}
	return b
}

func decodeMeta(rec []byte) (meta, error) {
	m := meta{counter: map[AuthorID]uint64{}}
	b, err := checkCRC(rec)
	if err != nil {
		return m, err
	}
	ver, off, err := readUvarint(b, 0, 5, math.MaxUint32)
	if err != nil {
		return m, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if ver != 1 && ver != metaVersion && ver != metaVersionCompact {
		return m, fmt.Errorf("%w: meta record version %d", ErrUnknownVersion, ver)
	}
	m.version = uint32(ver)
	if len(b)-off < 16 {
		return m, fmt.Errorf("%w: meta truncated", ErrCorrupt)
	}
	copy(m.network[:], b[off:])
	off += 16
	if m.lamport, off, err = readUvarint(b, off, 10, math.MaxUint64); err != nil {
		return m, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if off, err = readAuthorMap(b, off, m.counter, math.MaxUint64, "counters"); err != nil {
		return m, err
	}
	if ver >= 2 {
		n, o, err := readUvarint(b, off, 10, math.MaxUint64)
		if err != nil {
			return m, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		off = o
		if n > uint64(len(b)-off)/32 {
			return m, fmt.Errorf("%w: meta members truncated", ErrCorrupt)
		}
		m.members = make([]AuthorID, n)
		for i := range m.members {
			copy(m.members[i][:], b[off:])
			off += 32
			if i > 0 && bytes.Compare(m.members[i-1][:], m.members[i][:]) >= 0 {
				return m, fmt.Errorf("%w: meta members out of order", ErrCorrupt)
			}
		}
		m.former = map[AuthorID]uint64{}
		if off, err = readAuthorMap(b, off, m.former, MaxClock, "former members"); err != nil {
			return m, err
		}
	}
	if ver == metaVersionCompact {
		if m.acked, off, err = readOptBytes(b, off); err != nil {
			return m, err
		}
		if m.cert, off, err = readOptBytes(b, off); err != nil {
			return m, err
		}
	}
	if off != len(b) {
		return m, fmt.Errorf("%w: %w in meta record", ErrCorrupt, ErrTrailingBytes)
	}
	return m, nil
}

// readAuthorMap reads a vector of (author [32], u64 at most maxVal) in
// strict author order into into.
func readAuthorMap(b []byte, off int, into map[AuthorID]uint64, maxVal uint64, what string) (int, error) {
	n, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if n > uint64(len(b)-off)/33 {
		return 0, fmt.Errorf("%w: meta %s truncated", ErrCorrupt, what)
	}
	var prev AuthorID
	for i := uint64(0); i < n; i++ {
		if len(b)-off < 32 {
			return 0, fmt.Errorf("%w: meta %s truncated", ErrCorrupt, what)
		}
		var a AuthorID
		copy(a[:], b[off:])
		if i > 0 && bytes.Compare(prev[:], a[:]) >= 0 {
			return 0, fmt.Errorf("%w: meta %s out of order", ErrCorrupt, what)
		}
		prev = a
		off += 32
		var c uint64
		if c, off, err = readUvarint(b, off, 10, maxVal); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		into[a] = c
	}
	return off, nil
}
