package vip

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vipkit/vipkit/crdt"
)

// Digest parts. A digest lists every held service, deleted ones too, 24
// bytes each; with enough tombstones it outgrows the control frame limit
// (3,000 deletions are 72 KB against 64 KiB). It is then sent as several
// digest frames, parts, each a digest of the one format and within the
// limit, so that every agent reads them.
//
// The held services, in id order, are cut into runs. The part of run k
// lists run k and, with revision NoRevision (which no held service ever
// has), the last id of run k-1 before its entries and the first id of run
// k+1 after them: the bounds of the id range the part speaks for, both
// exclusive. The first part has no lower bound, the last no upper one;
// together the ranges cover every id. A receiver that knows parts pushes
// only the services inside a part's range that the part lacks or holds at
// another revision, and never asks for a bound. A digest without bounds
// (one that fits a frame, or one from an agent that never splits) speaks
// for every id, as before.
//
// An agent that does not know parts reads each part as a whole digest: it
// also pushes what it holds outside the part, so that every part it gets
// makes it send, within the sender's reply budget, most of what it holds
// (and the two bound ids once more). Repair still completes; a mixed mesh
// only spends more of the reply budgets until every agent knows parts.

// digestEntry is the size of one digest entry: service id, revision.
const digestEntry = 16 + 8

// minDigestPart is the least a control frame must carry for digests in
// parts to make progress: the header, a count and one service between
// its two bounds.
const minDigestPart = frameHeader + 1 + 3*digestEntry

// digestParts returns the digest of every held service: one frame when it
// fits the control frame limit, parts of at most the limit otherwise.
func (p *Replicator) digestParts() [][]byte {
	infos := p.o.Registry.Replica().Services()
	if whole := frameHeader + uvarintLen(uint64(len(infos))) + digestEntry*len(infos); whole <= p.limit {
		return [][]byte{appendDigest(nil, infos, nil, nil)}
	}
	per := max(digestPartEntries(p.limit), 1) // at least 1: NewReplicator refuses smaller limits (checkDigestLimit)
	var parts [][]byte
	for start := 0; start < len(infos); start += per {
		end := min(start+per, len(infos))
		var lo, hi *crdt.ServiceID
		if start > 0 {
			lo = &infos[start-1].ID
		}
		if end < len(infos) {
			hi = &infos[end].ID
		}
		parts = append(parts, appendDigest(nil, infos[start:end], lo, hi))
	}
	return parts
}

// digestPartEntries is how many services a digest part of at most limit
// bytes lists besides its two bounds.
func digestPartEntries(limit int) int {
	n := (limit - frameHeader - 1) / digestEntry
	for n > 0 && frameHeader+uvarintLen(uint64(n))+digestEntry*n > limit {
		n--
	}
	return n - 2
}

// checkDigestLimit reports a control frame limit too small for digest
// parts.
func checkDigestLimit(limit int) error {
	if limit < minDigestPart {
		return fmt.Errorf("%w: the control frame limit %d cannot carry a digest part of one service (%d bytes)", ErrInvalidOptions, limit, minDigestPart)
	}
	return nil
}

// appendDigest appends a digest frame of infos, with the bounds lo before
// and hi after them when they are set.
func appendDigest(f []byte, infos []crdt.ServiceInfo, lo, hi *crdt.ServiceID) []byte {
	n := len(infos)
	if lo != nil {
		n++
	}
	if hi != nil {
		n++
	}
	f = append(f, frameMagic, frameVersion, frameDigest)
	f = binary.AppendUvarint(f, uint64(n))
	if lo != nil {
		f = append(f, lo[:]...)
		f = binary.BigEndian.AppendUint64(f, uint64(crdt.NoRevision))
	}
	for _, in := range infos {
		f = append(f, in.ID[:]...)
		f = binary.BigEndian.AppendUint64(f, uint64(in.Revision))
	}
	if hi != nil {
		f = append(f, hi[:]...)
		f = binary.BigEndian.AppendUint64(f, uint64(crdt.NoRevision))
	}
	return f
}

// uvarintLen is the length of v as a varint.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// digestRange returns the id range a digest's n entries speak for (see
// digestParts): between its bounds, the entries of revision NoRevision
// below and above all its services, both exclusive; every id when it has
// none. A bound among the services, or bounds without services, bound
// nothing: no agent sends them.
func digestRange(entries []byte, n int) func(crdt.ServiceID) bool {
	var lo, hi, first, last []byte
	var bounds [][]byte
	for i := range n {
		e := entries[i*digestEntry : (i+1)*digestEntry]
		id := e[:16]
		if crdt.Revision(binary.BigEndian.Uint64(e[16:])) == crdt.NoRevision {
			bounds = append(bounds, id)
			continue
		}
		if first == nil || bytes.Compare(id, first) < 0 {
			first = id
		}
		if last == nil || bytes.Compare(id, last) > 0 {
			last = id
		}
	}
	if first != nil {
		for _, b := range bounds {
			switch {
			case bytes.Compare(b, first) < 0 && (lo == nil || bytes.Compare(b, lo) > 0):
				lo = b
			case bytes.Compare(b, last) > 0 && (hi == nil || bytes.Compare(b, hi) < 0):
				hi = b
			}
		}
	}
	return func(id crdt.ServiceID) bool {
		return (lo == nil || bytes.Compare(id[:], lo) > 0) && (hi == nil || bytes.Compare(id[:], hi) < 0)
	}
}
