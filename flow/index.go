package flow

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/vipkit/vipkit/packet"
)

// tuple is a packed IPv4 5-tuple: k0 = src<<32 | dst (exactly the eight bytes
// at offset 12 of the IPv4 header, read big-endian), k1 = sport<<48 |
// dport<<32 | proto<<24. The low 24 bits of k1 are zero in a tuple; the index
// stores a binding id and a direction bit there.
type tuple struct{ k0, k1 uint64 }

func mkTuple(src, dst uint32, sport, dport uint16, proto Proto) tuple {
	return tuple{uint64(src)<<32 | uint64(dst), uint64(sport)<<48 | uint64(dport)<<32 | uint64(proto)<<24}
}

// packetTuple reads the tuple of an IPv4 packet whose L4 header starts at l4.
func packetTuple(pkt, l4 []byte) tuple {
	return tuple{binary.BigEndian.Uint64(pkt[packet.IPv4SrcOff:]), uint64(binary.BigEndian.Uint32(l4))<<32 | uint64(pkt[packet.IPv4ProtoOff])<<24}
}

func (t tuple) src() uint32   { return uint32(t.k0 >> 32) }
func (t tuple) dst() uint32   { return uint32(t.k0) }
func (t tuple) sport() uint16 { return uint16(t.k1 >> 48) }
func (t tuple) dport() uint16 { return uint16(t.k1 >> 32) }
func (t tuple) proto() Proto  { return Proto(t.k1 >> 24) }
func (t tuple) ports() uint32 { return uint32(t.k1 >> 32) }

// reverse returns the tuple of a packet going the other way.
func (t tuple) reverse() tuple {
	return mkTuple(t.dst(), t.src(), t.dport(), t.sport(), t.proto())
}

const (
	idBits   = 23
	idMask   = 1<<idBits - 1
	dirShift = idBits
	keyMask1 = ^uint64(1<<24 - 1)

	// MaxCapacity is the largest Options.Capacity: binding ids have 23 bits.
	MaxCapacity = idMask

	dirFwd = 0 // the client's packet (orig tuple)
	dirRev = 1 // the backend's reply (reply tuple)
)

// indexEntry is one index entry, 32 bytes: two to a cache line. k0 and k1 are the
// tuple, with the binding id and direction in the low 24 bits of k1; k1 == 0
// marks an empty entry (a stored tuple always has a nonzero protocol). v0
// and v1 hold everything an established packet in that direction needs, so
// that translating it reads this one cache line of the table and nothing
// else that misses the cache (see hot.go for the layout). Its size must
// stay 32 bytes, so that an entry never straddles two cache lines
// (TestBindingSize).
type indexEntry struct{ k0, k1, v0, v1 uint64 }

func (e *indexEntry) id() uint32 { return uint32(e.k1 & idMask) }
func (e *indexEntry) dir() int   { return int(e.k1>>dirShift) & 1 }

// index maps tuples to index entries with open addressing and linear
// probing over one flat array: the full key is inline, so a lookup touches
// one cache line (sometimes the next one too) and follows no pointers.
// Homes are even slots, so the first probe covers both entries of a cache
// line. Deletion shifts entries back (no tombstones), so churn does not
// degrade it. Every binding has two entries (its client tuple and its reply
// tuple); the array is sized for a load factor of at most ½ at full
// capacity. The hash is keyed with a random seed so that remote senders
// cannot aim collisions.
type index struct {
	entries []indexEntry
	mask    uint64
	shift   uint
	seed0   uint64
	seed1   uint64
	n       int
}

func newIndex(entries int, seed0, seed1 uint64) index {
	size := 16
	for size < entries*2 {
		size <<= 1
	}
	ents := make([]indexEntry, size)
	adviseHuge(unsafe.Pointer(unsafe.SliceData(ents)), uintptr(size)*unsafe.Sizeof(indexEntry{}))
	return index{
		entries: ents,
		mask:    uint64(size - 1),
		shift:   uint(64 - bits.TrailingZeros(uint(size))),
		seed0:   seed0 | 1,
		seed1:   seed1 | 1,
	}
}

// home returns the first slot to probe for a key: always even, the first
// entry of a cache line.
func (x *index) home(k0, k1 uint64) uint64 {
	hi, lo := bits.Mul64(k0^x.seed0, (k1&keyMask1)^x.seed1)
	h := (hi ^ lo) * 0x9e3779b97f4a7c15
	return h >> x.shift &^ 1
}

// find returns the entry of t, or nil.
func (x *index) find(t tuple) *indexEntry {
	i := x.home(t.k0, t.k1)
	for {
		e := &x.entries[i]
		if e.k1 == 0 {
			return nil
		}
		if e.k0 == t.k0 && e.k1&keyMask1 == t.k1 {
			return e
		}
		i = (i + 1) & x.mask
	}
}

// insert adds t → (id, dir) with values v0, v1. It reports false, changing
// nothing, when t is already present.
func (x *index) insert(t tuple, id uint32, dir int, v0, v1 uint64) bool {
	i := x.home(t.k0, t.k1)
	for {
		e := &x.entries[i]
		if e.k1 == 0 {
			*e = indexEntry{t.k0, t.k1 | uint64(id) | uint64(dir)<<dirShift, v0, v1}
			x.n++
			return true
		}
		if e.k0 == t.k0 && e.k1&keyMask1 == t.k1 {
			return false
		}
		i = (i + 1) & x.mask
	}
}

// remove deletes t and reports whether it was present.
func (x *index) remove(t tuple) bool {
	i := x.home(t.k0, t.k1)
	for {
		e := &x.entries[i]
		if e.k1 == 0 {
			return false
		}
		if e.k0 == t.k0 && e.k1&keyMask1 == t.k1 {
			break
		}
		i = (i + 1) & x.mask
	}
	// Backward-shift deletion: move later entries of the same probe run
	// into the hole when their home allows it.
	j := i
	for {
		j = (j + 1) & x.mask
		e := x.entries[j]
		if e.k1 == 0 {
			break
		}
		k := x.home(e.k0, e.k1)
		// The entry at j may move to i iff its home k is not cyclically in (i, j].
		if i <= j {
			if i < k && k <= j {
				continue
			}
		} else if i < k || k <= j {
			continue
		}
		x.entries[i] = e
		i = j
	}
	x.entries[i] = indexEntry{}
	x.n--
	return true
}
