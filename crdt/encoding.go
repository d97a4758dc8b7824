package crdt

import (
	"fmt"
	"math"
	"slices"
)

// SnapshotVersion is the format version of the snapshot encoding.
const SnapshotVersion = 1

// minFieldLen is the shortest possible encoded field: network, service, key
// length and one key byte, option tag, Lamport, author, counter, and the
// signature length. It bounds the field count a snapshot may claim.
const minFieldLen = 16 + 16 + 1 + 1 + 1 + 1 + 32 + 1 + 1

// appendUvarint appends v as postcard's LEB128 varint: 7 bits per byte,
// least significant group first, high bit set on every byte but the last.
func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// uvarintLen is the encoded length of v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// readUvarint decodes a canonical varint of at most maxBytes bytes whose
// value is at most maxVal. Overlong encodings (a final 0x00 byte after the
// first), values too large and encodings too long are ErrVarint.
func readUvarint(b []byte, off int, maxBytes int, maxVal uint64) (uint64, int, error) {
	var v uint64
	var shift uint
	for i := 0; i < maxBytes; i++ {
		if off+i >= len(b) {
			return 0, 0, fmt.Errorf("%w: varint at byte %d", ErrTruncated, off)
		}
		c := b[off+i]
		if shift == 63 && c > 1 {
			return 0, 0, fmt.Errorf("%w: overflow at byte %d", ErrVarint, off)
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if c == 0 && i > 0 {
				return 0, 0, fmt.Errorf("%w: overlong at byte %d", ErrVarint, off)
			}
			if v > maxVal {
				return 0, 0, fmt.Errorf("%w: value %d above %d at byte %d", ErrVarint, v, maxVal, off)
			}
			return v, off + i + 1, nil
		}
		shift += 7
	}
	return 0, 0, fmt.Errorf("%w: longer than %d bytes at byte %d", ErrVarint, maxBytes, off)
}

// EncodedLen returns the length of f's encoding.
func (f *Field) EncodedLen() int {
	return f.encodedLenSig(len(f.Signature))
}

func (f *Field) encodedLenSig(sigLen int) int {
	n := 16 + 16 + uvarintLen(uint64(len(f.Key))) + len(f.Key) + 1
	if f.HasValue {
		n += uvarintLen(uint64(len(f.Value))) + len(f.Value)
	}
	n += uvarintLen(f.Lamport) + 32 + uvarintLen(f.Counter)
	return n + uvarintLen(uint64(sigLen)) + sigLen
}

// Encode returns f's encoding (see the package doc).
func (f *Field) Encode() []byte {
	return f.AppendEncode(make([]byte, 0, f.EncodedLen()))
}

// AppendEncode appends f's encoding to b and returns the extended slice.
func (f *Field) AppendEncode(b []byte) []byte {
	b = f.appendUnsigned(b)
	b = appendUvarint(b, uint64(len(f.Signature)))
	return append(b, f.Signature...)
}

// appendUnsigned appends every member of the encoding before the signature.
func (f *Field) appendUnsigned(b []byte) []byte {
	b = append(b, f.Network[:]...)
	b = append(b, f.Service[:]...)
	b = appendUvarint(b, uint64(len(f.Key)))
	b = append(b, f.Key...)
	if f.HasValue {
		b = append(b, 1)
		b = appendUvarint(b, uint64(len(f.Value)))
		b = append(b, f.Value...)
	} else {
		b = append(b, 0)
	}
	b = appendUvarint(b, f.Lamport)
	b = append(b, f.Author[:]...)
	return appendUvarint(b, f.Counter)
}

// AppendSigningMessage appends the message an author signs: Domain, then
// f's encoding with an empty signature vector (a final 0x00).
func (f *Field) AppendSigningMessage(b []byte) []byte {
	b = append(b, Domain...)
	b = f.appendUnsigned(b)
	return append(b, 0)
}

// parsed is a decoded field whose byte members alias the input.
type parsed struct {
	network  NetworkID
	service  ServiceID
	key      []byte
	hasValue bool
	value    []byte
	lamport  uint64
	author   AuthorID
	counter  uint64
	sig      []byte
	raw      []byte // the whole encoding
	sigOff   int    // offset in raw of the signature's length varint
}

// parseField decodes one field at b[off:] without allocating. With
// unsigned, an empty signature is allowed.
func parseField(b []byte, off int, lim *Limits, unsigned bool) (p parsed, next int, err error) {
	start := off
	if len(b)-off < 32 {
		return p, 0, fmt.Errorf("%w: ids at byte %d", ErrTruncated, off)
	}
	copy(p.network[:], b[off:off+16])
	copy(p.service[:], b[off+16:off+32])
	off += 32
	kl, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return p, 0, err
	}
	if kl == 0 {
		return p, 0, fmt.Errorf("%w at byte %d", ErrEmptyKey, off)
	}
	if kl > uint64(lim.MaxKeyBytes) {
		return p, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLong, kl, lim.MaxKeyBytes)
	}
	if uint64(len(b)-off) < kl {
		return p, 0, fmt.Errorf("%w: key at byte %d", ErrTruncated, off)
	}
	p.key = b[off : off+int(kl)]
	off += int(kl)
	if off >= len(b) {
		return p, 0, fmt.Errorf("%w: option at byte %d", ErrTruncated, off)
	}
	switch b[off] {
	case 0:
		off++
	case 1:
		off++
		p.hasValue = true
		vl, o, err := readUvarint(b, off, 10, math.MaxUint64)
		if err != nil {
			return p, 0, err
		}
		off = o
		if vl > uint64(lim.MaxValueBytes) {
			return p, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, vl, lim.MaxValueBytes)
		}
		if uint64(len(b)-off) < vl {
			return p, 0, fmt.Errorf("%w: value at byte %d", ErrTruncated, off)
		}
		p.value = b[off : off+int(vl)]
		off += int(vl)
	default:
		return p, 0, fmt.Errorf("%w: 0x%02x at byte %d", ErrBadOption, b[off], off)
	}
	if p.lamport, off, err = readUvarint(b, off, 10, math.MaxUint64); err != nil {
		return p, 0, err
	}
	if len(b)-off < 32 {
		return p, 0, fmt.Errorf("%w: author at byte %d", ErrTruncated, off)
	}
	copy(p.author[:], b[off:off+32])
	off += 32
	if p.counter, off, err = readUvarint(b, off, 10, math.MaxUint64); err != nil {
		return p, 0, err
	}
	p.sigOff = off - start
	sl, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return p, 0, err
	}
	if sl != SignatureSize && !(unsigned && sl == 0) {
		return p, 0, fmt.Errorf("%w: %d bytes", ErrSignatureLength, sl)
	}
	if uint64(len(b)-off) < sl {
		return p, 0, fmt.Errorf("%w: signature at byte %d", ErrTruncated, off)
	}
	p.sig = b[off : off+int(sl)]
	off += int(sl)
	p.raw = b[start:off]
	return p, off, nil
}

// field converts p to a Field whose slices alias p's input.
func (p *parsed) field() Field {
	f := Field{
		Network:   p.network,
		Service:   p.service,
		Key:       string(p.key),
		HasValue:  p.hasValue,
		Lamport:   p.lamport,
		Author:    p.author,
		Counter:   p.counter,
		Signature: p.sig,
	}
	if p.hasValue {
		f.Value = p.value
	}
	return f
}

// DecodeField decodes one signed field that fills b exactly, under the
// default limits. The result does not alias b.
func DecodeField(b []byte) (Field, error) {
	lim := DefaultLimits()
	return decodeField(b, &lim)
}

func decodeField(b []byte, lim *Limits) (Field, error) {
	own := append([]byte(nil), b...)
	p, n, err := parseField(own, 0, lim, false)
	if err != nil {
		return Field{}, fmt.Errorf("crdt: decode field: %w", err)
	}
	if n != len(b) {
		return Field{}, fmt.Errorf("crdt: decode field: %w: %d of %d bytes used", ErrTrailingBytes, n, len(b))
	}
	return p.field(), nil
}

// Snapshot is a whole service as a set of signed fields: every field the
// replica holds for it, or its tombstone alone once deleted. A snapshot
// does not delete: a field missing from it is simply not in it.
type Snapshot struct {
	Network NetworkID
	Service ServiceID
	// Fields are ordered by key in exported snapshots; any order decodes.
	Fields []Field
}

// EncodedLen returns the length of s's encoding.
func (s *Snapshot) EncodedLen() int {
	n := uvarintLen(SnapshotVersion) + 32 + uvarintLen(uint64(len(s.Fields)))
	for i := range s.Fields {
		n += s.Fields[i].EncodedLen()
	}
	return n
}

// Encode returns s's encoding (see the package doc).
func (s *Snapshot) Encode() []byte { return s.AppendEncode(make([]byte, 0, s.EncodedLen())) }

// AppendEncode appends s's encoding to b.
func (s *Snapshot) AppendEncode(b []byte) []byte {
	b = appendUvarint(b, SnapshotVersion)
	b = append(b, s.Network[:]...)
	b = append(b, s.Service[:]...)
	b = appendUvarint(b, uint64(len(s.Fields)))
	for i := range s.Fields {
		b = s.Fields[i].AppendEncode(b)
	}
	return b
}

// snapHeader is a parsed snapshot: header and field views into the input.
type snapHeader struct {
	network NetworkID
	service ServiceID
	fields  []parsed
}

// parseSnapshot decodes a snapshot without copying its bytes: the parsed
// fields alias b. maxFields bounds the claimed field count.
func parseSnapshot(b []byte, lim *Limits, fields []parsed) (snapHeader, error) {
	var h snapHeader
	if len(b) > lim.MaxSnapshotBytes {
		return h, fmt.Errorf("%w: %d bytes, limit %d", ErrSnapshotTooLarge, len(b), lim.MaxSnapshotBytes)
	}
	ver, off, err := readUvarint(b, 0, 5, math.MaxUint32)
	if err != nil {
		return h, err
	}
	if ver != SnapshotVersion {
		return h, fmt.Errorf("%w: snapshot version %d", ErrUnknownVersion, ver)
	}
	if len(b)-off < 32 {
		return h, fmt.Errorf("%w: snapshot header at byte %d", ErrTruncated, off)
	}
	copy(h.network[:], b[off:off+16])
	copy(h.service[:], b[off+16:off+32])
	off += 32
	cnt, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return h, err
	}
	if cnt > uint64(max(lim.MaxFieldsPerService, lim.MaxHeldFields))+1 {
		return h, fmt.Errorf("%w: %d fields, limit %d", ErrTooManyFields, cnt, max(lim.MaxFieldsPerService, lim.MaxHeldFields))
	}
	if cnt > uint64((len(b)-off)/minFieldLen) {
		return h, fmt.Errorf("%w: %d fields claimed in %d bytes", ErrTruncated, cnt, len(b)-off)
	}
	h.fields = slices.Grow(fields[:0], int(cnt))
	for i := uint64(0); i < cnt; i++ {
		p, next, err := parseField(b, off, lim, false)
		if err != nil {
			return h, fmt.Errorf("field %d: %w", i, err)
		}
		if p.network != h.network || p.service != h.service {
			return h, fmt.Errorf("%w: field %d", ErrMixedSnapshot, i)
		}
		h.fields = append(h.fields, p)
		off = next
	}
	if off != len(b) {
		return h, fmt.Errorf("%w: %d of %d bytes used", ErrTrailingBytes, off, len(b))
	}
	return h, nil
}

// DecodeSnapshot decodes a snapshot that fills b exactly, under lim (the
// default limits when nil). It checks the encoding only; signatures are
// checked when a Replica merges it. The result does not alias b.
func DecodeSnapshot(b []byte, lim *Limits) (Snapshot, error) {
	l := DefaultLimits()
	if lim != nil {
		l = *lim
	}
	l, err := l.withDefaults()
	if err != nil {
		return Snapshot{}, err
	}
	own := append([]byte(nil), b...)
	h, err := parseSnapshot(own, &l, nil)
	if err != nil {
		return Snapshot{}, fmt.Errorf("crdt: decode snapshot: %w", err)
	}
	s := Snapshot{Network: h.network, Service: h.service, Fields: make([]Field, len(h.fields))}
	for i := range h.fields {
		s.Fields[i] = h.fields[i].field()
	}
	return s, nil
}
