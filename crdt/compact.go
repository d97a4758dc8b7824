package crdt

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/hdevalence/ed25519consensus"
)

// Compaction of deletion markers (docs/crdt.md, "Deletions without a
// lifetime cap").
//
// A Compaction names, for each creator, a frontier k and the creator's
// services with a creation counter at most k that are live (Live). Every
// other service of that creator up to k is deleted. The entry of the zero
// creator (LegacyCreator) lists the live services without a creation
// field (ids made before creation fields existed). A member acknowledges
// a Compaction (Acknowledge) only when the live services it holds match
// it exactly, and only after that state, and the fact that it
// acknowledged, are committed. A Compaction with the acknowledgements of
// every current member but the receiver is a Certificate: the receiver
// then drops the tombstones it covers and refuses every field of a
// service it names deleted (ErrDeleted, counted in Refusals.Deleted).
// Once a replica holds a certificate, a service that has no creation
// field and is not listed live under LegacyCreator is refused as well.

// AckDomain is the signing domain of an acknowledgement: an Ed25519
// signature over AckDomain followed by the SHA-256 of the compaction's
// encoding.
const AckDomain = "tsunagi-vip-compact-ack/v1\x00"

// CompactionVersion is the format version of a compaction's encoding.
const CompactionVersion = 1

// LegacyCreator is the creator of a compaction entry that lists the live
// services without a creation field.
var LegacyCreator AuthorID

// ackSize is an acknowledgement's encoded size: author and signature.
const ackSize = 32 + SignatureSize

// compactionRoom is what a compaction's encoding must leave of the
// control frame limit, so that a certificate frame carries it with at
// least one acknowledgement (frame header, counts, one ack).
const compactionRoom = 128

// maxPools bounds the compactions whose acknowledgements a replica
// gathers at once; past it the lowest epoch is forgotten and counted.
const maxPools = 4

// ErrCompaction means a compaction or certificate was refused: malformed,
// stale (its epoch is not above the one held), not matching the state
// this replica holds, or taking back a service an earlier one deleted.
// The message says which.
var ErrCompaction = errors.New("crdt: compaction refused")

// Compaction is a proposal to compact deletion markers; see the package
// section in docs/crdt.md.
type Compaction struct {
	Network NetworkID
	// Epoch numbers compactions: each acknowledged or held one is above
	// the last, up to MaxClock.
	Epoch uint64
	// Members is the proposer's member set, in strict key order: every
	// one of them must acknowledge, and each acknowledges only a
	// compaction naming its own member set.
	Members []AuthorID
	// Entries are in strict creator order.
	Entries []CompactionEntry
}

// CompactionEntry is one creator's part of a Compaction.
type CompactionEntry struct {
	Creator AuthorID
	// Frontier is the highest creation counter covered (0 for
	// LegacyCreator).
	Frontier uint64
	// Live lists the creator's live services with a creation counter at
	// most Frontier, in strict id order.
	Live []ServiceID
}

// Ack is one member's acknowledgement of a Compaction.
type Ack struct {
	Author    AuthorID
	Signature []byte
}

// Certificate is a Compaction with acknowledgements, in strict author
// order. It is complete at a replica when every current member other
// than the replica itself acknowledged it.
type Certificate struct {
	Compaction Compaction
	Acks       []Ack
}

// CertResult tells what AddCertificate did.
type CertResult struct {
	// Applied reports that the certificate was complete and is now held.
	Applied bool
	// Stale reports a certificate at or below the epoch held: ignored.
	Stale bool
	// Dropped lists the services dropped by the certificate (their
	// markers, and services it names deleted), in id order.
	Dropped []ServiceID
	// Missing lists the current members whose acknowledgement the
	// compaction still lacks (when not applied), in key order.
	Missing []AuthorID
}

// Encode returns c's encoding: version u32, network [16], epoch u64, then
// a vector of entries (creator [32], frontier u64, a vector of service
// ids [16]), in postcard's rules.
func (c *Compaction) Encode() []byte {
	b := appendUvarint(nil, CompactionVersion)
	b = append(b, c.Network[:]...)
	b = appendUvarint(b, c.Epoch)
	b = appendUvarint(b, uint64(len(c.Members)))
	for _, m := range c.Members {
		b = append(b, m[:]...)
	}
	b = appendUvarint(b, uint64(len(c.Entries)))
	for _, e := range c.Entries {
		b = append(b, e.Creator[:]...)
		b = appendUvarint(b, e.Frontier)
		b = appendUvarint(b, uint64(len(e.Live)))
		for _, id := range e.Live {
			b = append(b, id[:]...)
		}
	}
	return b
}

// Hash is the SHA-256 of c's encoding, which acknowledgements sign.
func (c *Compaction) Hash() [32]byte { return sha256.Sum256(c.Encode()) }

// Encode returns the certificate's encoding: the compaction's, then a
// vector of (author [32], signature [64]).
func (c *Certificate) Encode() []byte {
	b := c.Compaction.Encode()
	b = appendUvarint(b, uint64(len(c.Acks)))
	for _, a := range c.Acks {
		b = append(b, a.Author[:]...)
		b = append(b, a.Signature...)
	}
	return b
}

// DecodeCompaction decodes a compaction strictly; see DecodeCertificate.
func DecodeCompaction(b []byte) (Compaction, error) {
	c, off, err := parseCompaction(b)
	if err == nil && off != len(b) {
		err = fmt.Errorf("%w: %w after compaction", ErrCompaction, ErrTrailingBytes)
	}
	return c, err
}

// DecodeCertificate decodes a certificate strictly: shortest varints,
// counts the input can hold, entries, ids and acknowledgements in strict
// order, a frontier of 0 for LegacyCreator, epochs and frontiers at most
// MaxClock, and no trailing bytes. Errors wrap ErrCompaction.
func DecodeCertificate(b []byte) (Certificate, error) {
	c, off, err := parseCompaction(b)
	if err != nil {
		return Certificate{}, err
	}
	n, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return Certificate{}, fmt.Errorf("%w: %w", ErrCompaction, err)
	}
	if n > uint64(len(b)-off)/ackSize || uint64(len(b)-off) != n*ackSize {
		return Certificate{}, fmt.Errorf("%w: %d acknowledgements in %d bytes", ErrCompaction, n, len(b)-off)
	}
	cert := Certificate{Compaction: c, Acks: make([]Ack, n)}
	for i := range cert.Acks {
		a := &cert.Acks[i]
		copy(a.Author[:], b[off:])
		a.Signature = bytes.Clone(b[off+32 : off+ackSize])
		off += ackSize
		if i > 0 && bytes.Compare(cert.Acks[i-1].Author[:], a.Author[:]) >= 0 {
			return Certificate{}, fmt.Errorf("%w: acknowledgements out of order at %d", ErrCompaction, i)
		}
	}
	return cert, nil
}

func parseCompaction(b []byte) (Compaction, int, error) {
	var c Compaction
	bad := func(err error) (Compaction, int, error) {
		return Compaction{}, 0, fmt.Errorf("%w: %w", ErrCompaction, err)
	}
	ver, off, err := readUvarint(b, 0, 5, math.MaxUint32)
	if err != nil {
		return bad(err)
	}
	if ver != CompactionVersion {
		return bad(fmt.Errorf("%w: compaction version %d", ErrUnknownVersion, ver))
	}
	if len(b)-off < 16 {
		return bad(ErrTruncated)
	}
	copy(c.Network[:], b[off:])
	off += 16
	if c.Epoch, off, err = readUvarint(b, off, 10, MaxClock); err != nil {
		return bad(err)
	}
	nm, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return bad(err)
	}
	if nm > uint64(len(b)-off)/32 {
		return bad(fmt.Errorf("%w: %d members in %d bytes", ErrTruncated, nm, len(b)-off))
	}
	c.Members = make([]AuthorID, nm)
	for i := range c.Members {
		copy(c.Members[i][:], b[off:])
		off += 32
		if i > 0 && bytes.Compare(c.Members[i-1][:], c.Members[i][:]) >= 0 {
			return bad(fmt.Errorf("members out of order at %d", i))
		}
	}
	n, off, err := readUvarint(b, off, 10, math.MaxUint64)
	if err != nil {
		return bad(err)
	}
	if n > uint64(len(b)-off)/34 {
		return bad(fmt.Errorf("%w: %d entries in %d bytes", ErrTruncated, n, len(b)-off))
	}
	c.Entries = make([]CompactionEntry, n)
	for i := range c.Entries {
		e := &c.Entries[i]
		if len(b)-off < 32 {
			return bad(ErrTruncated)
		}
		copy(e.Creator[:], b[off:])
		off += 32
		if i > 0 && bytes.Compare(c.Entries[i-1].Creator[:], e.Creator[:]) >= 0 {
			return bad(fmt.Errorf("entries out of order at %d", i))
		}
		if e.Frontier, off, err = readUvarint(b, off, 10, MaxClock); err != nil {
			return bad(err)
		}
		if e.Creator == LegacyCreator && e.Frontier != 0 {
			return bad(errors.New("legacy entry with a frontier"))
		}
		var k uint64
		if k, off, err = readUvarint(b, off, 10, math.MaxUint64); err != nil {
			return bad(err)
		}
		if k > uint64(len(b)-off)/16 {
			return bad(fmt.Errorf("%w: %d live services in %d bytes", ErrTruncated, k, len(b)-off))
		}
		e.Live = make([]ServiceID, k)
		for j := range e.Live {
			copy(e.Live[j][:], b[off:])
			off += 16
			if j > 0 && bytes.Compare(e.Live[j-1][:], e.Live[j][:]) >= 0 {
				return bad(fmt.Errorf("live services out of order in entry %d", i))
			}
		}
	}
	return c, off, nil
}

// frontier is one creator's compacted state.
type frontier struct {
	k    uint64
	live map[ServiceID]struct{}
}

// heldCert is the certificate a replica holds, parsed.
type heldCert struct {
	cert  Certificate
	hash  [32]byte
	front map[AuthorID]*frontier
}

// ackPool gathers the acknowledgements of one compaction.
type ackPool struct {
	c    Compaction
	hash [32]byte
	acks map[AuthorID][]byte
}

func frontOf(c *Compaction) map[AuthorID]*frontier {
	m := make(map[AuthorID]*frontier, len(c.Entries))
	for _, e := range c.Entries {
		f := &frontier{k: e.Frontier, live: make(map[ServiceID]struct{}, len(e.Live))}
		for _, id := range e.Live {
			f.live[id] = struct{}{}
		}
		m[e.Creator] = f
	}
	return m
}

// loadCompaction parses the compaction state of the meta record.
//
// +checklocksignore: Open calls it before r is shared.
func (r *Replica) loadCompaction() error {
	if r.meta.acked != nil {
		if _, err := DecodeCompaction(r.meta.acked); err != nil {
			return fmt.Errorf("%w: acknowledged compaction: %w", ErrCorrupt, err)
		}
	}
	if r.meta.cert != nil {
		cert, err := DecodeCertificate(r.meta.cert)
		if err != nil {
			return fmt.Errorf("%w: certificate: %w", ErrCorrupt, err)
		}
		r.cert = &heldCert{cert: cert, hash: cert.Compaction.Hash(), front: frontOf(&cert.Compaction)}
	}
	return nil
}

// compactedRefusal returns why a group of a service not held must be
// refused under the held certificate, or nil. Called with writeMu held.
func (r *Replica) compactedRefusal(g *group) error {
	if r.cert == nil {
		return nil
	}
	if held := r.services[g.id]; held != nil {
		return nil
	}
	for i := range g.ps {
		p := &g.ps[i]
		if string(p.key) != CreationKey || p.hasValue || p.network != r.net || CreatedID(r.net, p.author, p.counter) != g.id {
			continue
		}
		f := r.cert.front[p.author]
		if f == nil || p.counter > f.k {
			return nil
		}
		if _, live := f.live[g.id]; live {
			return nil
		}
		return fmt.Errorf("%w: service %s (creator %s, number %d) is deleted by the certificate of epoch %d (frontier %d)",
			ErrDeleted, g.id, p.author, p.counter, r.cert.cert.Compaction.Epoch, f.k)
	}
	if f := r.cert.front[LegacyCreator]; f != nil {
		if _, live := f.live[g.id]; live {
			return nil
		}
	}
	return fmt.Errorf("%w: service %s has no creation field and is not live in the certificate of epoch %d",
		ErrDeleted, g.id, r.cert.cert.Compaction.Epoch)
}

// held returns, for the creator of entry e, the live services this
// replica holds with a creation counter at most e.Frontier (for
// LegacyCreator, the live services without a creation field). Called
// with writeMu held.
func (r *Replica) heldLive(creator AuthorID, k uint64) []ServiceID {
	var out []ServiceID
	for id, s := range r.services {
		if s.tomb != nil {
			continue
		}
		c, seq, bound := s.creator()
		if creator == LegacyCreator {
			if !bound {
				out = append(out, id)
			}
		} else if bound && c == creator && seq <= k {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(a, b ServiceID) int { return bytes.Compare(a[:], b[:]) })
	return out
}

// Propose returns the compaction this replica would propose: for each
// creator of a held tombstone (with its creation field) or of the held
// certificate, the frontier is the highest creation counter of its held
// tombstones (never below the certificate's), and its live services are
// the ones held; the LegacyCreator entry lists the live services without
// a creation field. ok is false when it would compact no held tombstone
// and the held certificate already carries every current member's
// acknowledgement. Creators that are neither members nor former members
// are left out once they hold nothing. The epoch is one above every
// compaction acknowledged or held; past MaxClock no compaction can be
// proposed (ErrLamportRange). A compaction whose encoding would not leave
// room for an acknowledgement in the control frame limit fails with
// ErrSnapshotTooLarge.
func (r *Replica) Propose() (c Compaction, ok bool, err error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	closed, members := r.closed, r.members
	r.mu.RUnlock()
	if closed {
		return c, false, ErrClosed
	}
	epoch := r.lastEpoch()
	if epoch >= MaxClock {
		return c, false, fmt.Errorf("%w: compaction epoch %d is at the bound", ErrLamportRange, epoch)
	}
	if r.active >= r.lim.MaxHeldServices {
		return c, false, fmt.Errorf("%w: %d active services at the hard cap %d: services may have been dropped, nothing is compacted", ErrServiceLimit, r.active, r.lim.MaxHeldServices)
	}
	k := map[AuthorID]uint64{LegacyCreator: 0}
	if r.cert != nil {
		for a, f := range r.cert.front {
			_, m := members[a]
			_, was := r.meta.former[a]
			if m || was || a == LegacyCreator {
				k[a] = f.k
			}
		}
	}
	compactable := 0
	for _, s := range r.services {
		if c, seq, bound := s.creator(); bound {
			if s.tomb != nil {
				compactable++
				k[c] = max(k[c], seq)
			}
		}
	}
	current := sortedAuthors(members)
	if compactable == 0 && r.cert != nil && slices.Equal(r.cert.cert.Compaction.Members, current) {
		return c, false, nil
	}
	if compactable == 0 && r.cert == nil {
		return c, false, nil
	}
	c = Compaction{Network: r.net, Epoch: epoch + 1, Members: current}
	for _, a := range sortedAuthors(k) {
		c.Entries = append(c.Entries, CompactionEntry{Creator: a, Frontier: k[a], Live: r.heldLive(a, k[a])})
	}
	if n := len(c.Encode()); n > r.lim.MaxSnapshotBytes-compactionRoom {
		return Compaction{}, false, fmt.Errorf("%w: a compaction of %d bytes, limit %d", ErrSnapshotTooLarge, n, r.lim.MaxSnapshotBytes-compactionRoom)
	}
	return c, true, nil
}

// lastEpoch is the highest epoch acknowledged or held. Called with
// writeMu held.
func (r *Replica) lastEpoch() uint64 {
	var e uint64
	if r.cert != nil {
		e = r.cert.cert.Compaction.Epoch
	}
	if r.meta.acked != nil {
		if a, err := DecodeCompaction(r.meta.acked); err == nil {
			e = max(e, a.Epoch)
		}
	}
	return e
}

// dominates checks that c takes back nothing old deleted: every creator
// of old that is still a member or former member (and LegacyCreator) has
// an entry in c with a frontier at least old's, and no service of it that
// old left out up to old's frontier is live in c. Called with writeMu
// held.
func (r *Replica) dominates(members map[AuthorID]struct{}, c, old *Compaction, what string) error {
	if old == nil {
		return nil
	}
	byC := map[AuthorID]*CompactionEntry{}
	for i := range c.Entries {
		byC[c.Entries[i].Creator] = &c.Entries[i]
	}
	for _, oe := range old.Entries {
		_, m := members[oe.Creator]
		_, was := r.meta.former[oe.Creator]
		ne := byC[oe.Creator]
		if ne == nil {
			if m || was || oe.Creator == LegacyCreator {
				return fmt.Errorf("%w: creator %s of the %s is missing", ErrCompaction, oe.Creator, what)
			}
			continue
		}
		if ne.Frontier < oe.Frontier {
			return fmt.Errorf("%w: creator %s: frontier %d below %d of the %s", ErrCompaction, oe.Creator, ne.Frontier, oe.Frontier, what)
		}
		oldLive := map[ServiceID]bool{}
		for _, id := range oe.Live {
			oldLive[id] = true
		}
		for _, id := range ne.Live {
			if oldLive[id] {
				continue
			}
			if oe.Creator == LegacyCreator {
				return fmt.Errorf("%w: service %s without a creation field was not live in the %s", ErrCompaction, id, what)
			}
			if s := r.services[id]; s != nil {
				if _, seq, ok := s.creator(); ok && seq <= oe.Frontier {
					return fmt.Errorf("%w: service %s was deleted by the %s", ErrCompaction, id, what)
				}
			}
		}
	}
	return nil
}

// maxEpochStep is how far past its last epoch a replica acknowledges a
// compaction. A proposer's epoch grows by one per proposal it
// acknowledged, so an honest gap is the number of proposals a member
// missed: 2^32 of them is more than a century at one a second. Without a
// step, one validly signed proposal at MaxClock that honest members
// acknowledge would leave no epoch for any later compaction; with it,
// reaching MaxClock takes 2^31 rounds that every member acknowledges and
// syncs. A var so that tests can reach the epoch bound.
var maxEpochStep uint64 = 1 << 32

func (r *Replica) checkCompaction(c *Compaction) error {
	if c.Network != r.net {
		return fmt.Errorf("%w: %w", ErrCompaction, ErrWrongNetwork)
	}
	if c.Epoch == 0 || c.Epoch > MaxClock {
		return fmt.Errorf("%w: epoch %d out of range", ErrCompaction, c.Epoch)
	}
	_, _, err := parseCompaction(c.Encode()) // the order and bounds
	return err
}

// Acknowledge checks a proposed compaction against the held state and,
// when it matches, commits that it acknowledged it (synced) and returns
// its signed acknowledgement. It matches when its epoch is above every
// one acknowledged or held (the same compaction again is acknowledged
// again), it takes back nothing the last acknowledged or held compaction
// deleted, the replica holds fewer active services than the hard cap,
// for every entry the live services held are exactly the entry's Live,
// and the frontier of the replica's own entry is at most its own
// counter. Otherwise it fails with ErrCompaction saying why, and commits
// nothing.
func (r *Replica) Acknowledge(ctx context.Context, c Compaction) (Ack, error) {
	if r.signer == nil {
		return Ack{}, ErrNoSigner
	}
	if err := ctx.Err(); err != nil {
		return Ack{}, err
	}
	if err := r.checkCompaction(&c); err != nil {
		return Ack{}, err
	}
	enc := c.Encode()
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	closed, used, members := r.closed, r.used, r.members
	_, member := members[r.self]
	r.mu.RUnlock()
	if closed {
		return Ack{}, ErrClosed
	}
	if !member {
		return Ack{}, fmt.Errorf("%w: %w: this replica's author", ErrCompaction, ErrNotMember)
	}
	if cur := sortedAuthors(members); !slices.Equal(cur, c.Members) {
		return Ack{}, fmt.Errorf("%w: it names %d members, this replica has %d others", ErrCompaction, len(c.Members), len(cur))
	}
	again := r.meta.acked != nil && bytes.Equal(r.meta.acked, enc)
	if !again {
		if last := r.lastEpoch(); c.Epoch <= last {
			return Ack{}, fmt.Errorf("%w: epoch %d, already at %d", ErrCompaction, c.Epoch, last)
		} else if c.Epoch-last > maxEpochStep {
			return Ack{}, fmt.Errorf("%w: epoch %d is more than %d past this replica's %d", ErrCompaction, c.Epoch, maxEpochStep, last)
		}
		if r.active >= r.lim.MaxHeldServices {
			return Ack{}, fmt.Errorf("%w: %d active services at the hard cap %d", ErrCompaction, r.active, r.lim.MaxHeldServices)
		}
		if r.cert != nil {
			if err := r.dominates(members, &c, &r.cert.cert.Compaction, "held certificate"); err != nil {
				return Ack{}, err
			}
		}
		if r.meta.acked != nil {
			old, err := DecodeCompaction(r.meta.acked)
			if err != nil {
				return Ack{}, fmt.Errorf("%w: acknowledged compaction: %w", ErrCorrupt, err)
			}
			if err := r.dominates(members, &c, &old, "acknowledged compaction"); err != nil {
				return Ack{}, err
			}
		}
		for _, e := range c.Entries {
			if e.Creator == r.self && e.Frontier > used {
				return Ack{}, fmt.Errorf("%w: frontier %d of this replica's own entry is past its counter %d", ErrCompaction, e.Frontier, used)
			}
			if mine := r.heldLive(e.Creator, e.Frontier); !slices.Equal(mine, e.Live) {
				return Ack{}, fmt.Errorf("%w: creator %s up to %d: %d live services held, the compaction lists %d%s",
					ErrCompaction, e.Creator, e.Frontier, len(mine), len(e.Live), firstDiff(mine, e.Live))
			}
		}
		m := r.meta
		m.acked = enc
		if err := r.commit(ctx, nil, nil, nil, &m); err != nil {
			return Ack{}, err
		}
		r.mu.Lock()
		r.meta = m
		r.mu.Unlock()
	}
	h := sha256.Sum256(enc)
	return Ack{Author: r.self, Signature: ed25519.Sign(r.signer, ackMessage(h))}, nil
}

func firstDiff(a, b []ServiceID) string {
	in := map[ServiceID]bool{}
	for _, id := range b {
		in[id] = true
	}
	for _, id := range a {
		if !in[id] {
			return fmt.Sprintf(" (%s held live, not listed)", id)
		}
	}
	in = map[ServiceID]bool{}
	for _, id := range a {
		in[id] = true
	}
	for _, id := range b {
		if !in[id] {
			return fmt.Sprintf(" (%s listed, not held live)", id)
		}
	}
	return ""
}

func ackMessage(h [32]byte) []byte {
	return append([]byte(AckDomain), h[:]...)
}

// VerifyAck checks an acknowledgement's signature for a compaction's
// hash under ZIP-215 rules: nil, ErrSignatureLength or ErrBadSignature.
func VerifyAck(h [32]byte, a Ack) error {
	if len(a.Signature) != SignatureSize {
		return ErrSignatureLength
	}
	if !ed25519consensus.Verify(a.Author[:], ackMessage(h), a.Signature) {
		return ErrBadSignature
	}
	return nil
}

// AddCertificate adds a certificate's acknowledgements to the ones
// gathered for its compaction and, once every current member other than
// this replica has acknowledged it (and at least one member has), applies
// it: the tombstones it covers are dropped, and so is every held service
// it names deleted (a returning member's copy of a service deleted while
// it was away), in one synced commit with the certificate, which is then
// held. An acknowledgement by an author that is neither a member nor a
// former member (ErrNotMember) or with a bad signature (ErrBadSignature)
// is left out, counted, and reported in the returned error; the others
// are still gathered. A certificate at or below the held epoch is stale
// and ignored; one that takes back a service the held one deleted fails
// with ErrCompaction.
func (r *Replica) AddCertificate(ctx context.Context, cert Certificate) (CertResult, error) {
	var res CertResult
	c := &cert.Compaction
	if err := r.checkCompaction(c); err != nil {
		r.countRefused(Refusals{Encoding: 1})
		return res, err
	}
	h := c.Hash()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	closed, members := r.closed, r.members
	r.mu.RUnlock()
	if closed {
		return res, ErrClosed
	}
	if r.cert != nil && c.Epoch <= r.cert.cert.Compaction.Epoch {
		res.Stale = true
		return res, nil
	}
	var errs []error
	var refused Refusals
	pool := r.pools[h]
	named := setOf(c.Members)
	for _, a := range cert.Acks {
		if pool != nil && pool.acks[a.Author] != nil {
			continue
		}
		_, m := members[a.Author]
		_, was := r.meta.former[a.Author]
		if _, in := named[a.Author]; !in || !m && !was {
			refused.NotMember++
			errs = append(errs, fmt.Errorf("crdt: acknowledgement by %s: %w (or not named by the compaction)", a.Author, ErrNotMember))
			continue
		}
		if err := VerifyAck(h, a); err != nil {
			refused.Signature++
			errs = append(errs, fmt.Errorf("crdt: acknowledgement by %s: %w", a.Author, err))
			continue
		}
		if pool == nil {
			pool = &ackPool{c: *c, hash: h, acks: map[AuthorID][]byte{}}
			r.addPool(pool)
		}
		pool.acks[a.Author] = bytes.Clone(a.Signature)
	}
	r.countRefused(refused)
	if pool == nil {
		return res, errors.Join(errs...)
	}
	for _, m := range c.Members {
		if pool.acks[m] == nil {
			res.Missing = append(res.Missing, m)
		}
	}
	if len(res.Missing) > 0 {
		r.setWaiting()
		return res, errors.Join(errs...)
	}
	// Every member it names acknowledged: it is a certificate. It holds
	// here when those members are members or former members here, and
	// more than half of this replica's current members are among them
	// (a node that joined later, or a member re-added, is not; a single
	// member can never make one alone in a network of two or more).
	inCur := 0
	for _, m := range c.Members {
		_, cur := members[m]
		_, was := r.meta.former[m]
		if cur {
			inCur++
		} else if !was {
			return res, errors.Join(append(errs, fmt.Errorf("%w: it names %s, neither a member nor a former member here", ErrCompaction, m))...)
		}
	}
	if 2*inCur <= len(members) {
		return res, errors.Join(append(errs, fmt.Errorf("%w: %d of its %d members are among the %d current members here, not more than half",
			ErrCompaction, inCur, len(c.Members), len(members)))...)
	}
	dropped, err := r.applyCert(ctx, members, pool)
	if err != nil {
		return res, errors.Join(append(errs, err)...)
	}
	res.Applied, res.Dropped = true, dropped
	return res, errors.Join(errs...)
}

// addPool adds a pool, forgetting the lowest epochs past maxPools.
// Called with writeMu held.
//
// +checklocks:r.writeMu
func (r *Replica) addPool(p *ackPool) {
	if r.pools == nil {
		r.pools = map[[32]byte]*ackPool{}
	}
	r.pools[p.hash] = p
	for len(r.pools) > maxPools {
		var low *ackPool
		for _, q := range r.pools {
			if low == nil || q.c.Epoch < low.c.Epoch || q.c.Epoch == low.c.Epoch && bytes.Compare(q.hash[:], low.hash[:]) < 0 {
				low = q
			}
		}
		delete(r.pools, low.hash)
		r.mu.Lock()
		r.poolsDropped++
		r.mu.Unlock()
	}
}

// applyCert applies a complete pool. Called with writeMu held.
//
// +checklocks:r.writeMu
func (r *Replica) applyCert(ctx context.Context, members map[AuthorID]struct{}, pool *ackPool) ([]ServiceID, error) {
	c := &pool.c
	if r.cert != nil {
		if err := r.dominates(members, c, &r.cert.cert.Compaction, "held certificate"); err != nil {
			r.countRefused(Refusals{Deleted: 1})
			return nil, err
		}
	}
	cert := Certificate{Compaction: *c}
	for _, a := range sortedAuthors(pool.acks) {
		cert.Acks = append(cert.Acks, Ack{Author: a, Signature: pool.acks[a]})
	}
	front := frontOf(c)
	var drop []ServiceID
	active, tombs := r.active, r.tombs
	for id, s := range r.services {
		cr, seq, bound := s.creator()
		var f *frontier
		if bound {
			f = front[cr]
			if f == nil || seq > f.k {
				continue
			}
		} else {
			if s.tomb != nil {
				continue // a random id's tombstone is kept for good
			}
			f = front[LegacyCreator]
			if f == nil {
				continue
			}
		}
		if _, live := f.live[id]; live {
			// Listed live: kept, and a tombstone it holds stays (no
			// certificate takes a deletion back).
			continue
		}
		drop = append(drop, id)
		if s.tomb != nil {
			tombs--
		} else {
			active--
		}
	}
	slices.SortFunc(drop, func(a, b ServiceID) int { return bytes.Compare(a[:], b[:]) })
	m := r.meta
	m.cert = cert.Encode()
	if err := r.commit(ctx, nil, nil, drop, &m); err != nil {
		return nil, err
	}
	for h, p := range r.pools {
		if p.c.Epoch <= c.Epoch {
			delete(r.pools, h)
		}
	}
	r.mu.Lock()
	for _, id := range drop {
		delete(r.services, id)
	}
	r.meta = m
	r.active, r.tombs = active, tombs
	r.cert = &heldCert{cert: cert, hash: pool.hash, front: front}
	r.compacted += uint64(len(drop))
	r.waiting = nil
	r.refreshOver()
	r.mu.Unlock()
	return drop, nil
}

// setWaiting records the members the newest pending compaction waits
// for. Called with writeMu held.
//
// +checklocks:r.writeMu
func (r *Replica) setWaiting() {
	var newest *ackPool
	for _, p := range r.pools {
		if newest == nil || p.c.Epoch > newest.c.Epoch {
			newest = p
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiting = nil
	if newest == nil {
		return
	}
	for _, m := range newest.c.Members {
		if newest.acks[m] == nil {
			r.waiting = append(r.waiting, m)
		}
	}
	r.waitingEpoch = newest.c.Epoch
	r.refreshOver()
}

// waitingNote says what compaction waits for, for ErrTombstoneLimit.
//
// +checklocksread:r.mu
func (r *Replica) waitingNote() string {
	legacy := 0
	for _, s := range r.services {
		if s.tomb != nil && s.create == nil {
			legacy++
		}
	}
	var parts []string
	if len(r.waiting) > 0 {
		names := make([]string, len(r.waiting))
		for i, a := range r.waiting {
			names[i] = a.String()
		}
		parts = append(parts, fmt.Sprintf("compaction (epoch %d) waits for the acknowledgements of %s", r.waitingEpoch, strings.Join(names, ", ")))
	} else {
		parts = append(parts, "no compaction is waiting for acknowledgements here")
	}
	if legacy > 0 {
		parts = append(parts, fmt.Sprintf("%d tombstones are of services without a creation field and are kept for good", legacy))
	}
	return "; " + strings.Join(parts, "; ")
}

// Certificate returns the certificate the replica holds; false for none.
func (r *Replica) Certificate() (Certificate, bool) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	if r.cert == nil {
		return Certificate{}, false
	}
	c, err := DecodeCertificate(r.meta.cert)
	return c, err == nil
}

// Pending returns the compactions whose acknowledgements are being
// gathered, each with the ones gathered so far, by epoch.
func (r *Replica) Pending() []Certificate {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	var out []Certificate
	for _, p := range r.pools {
		c := Certificate{Compaction: p.c}
		for _, a := range sortedAuthors(p.acks) {
			c.Acks = append(c.Acks, Ack{Author: a, Signature: bytes.Clone(p.acks[a])})
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Certificate) int {
		if a.Compaction.Epoch != b.Compaction.Epoch {
			if a.Compaction.Epoch < b.Compaction.Epoch {
				return -1
			}
			return 1
		}
		return 0
	})
	return out
}

// CompactionStats counts what compaction did since Open.
type CompactionStats struct {
	// Epoch is the held certificate's epoch (0 for none).
	Epoch uint64
	// Compacted counts the services (markers, and copies of deleted
	// services) dropped by certificates.
	Compacted uint64
	// PoolsDropped counts compactions whose acknowledgements were
	// forgotten past the bound of four gathered at once.
	PoolsDropped uint64
	// Waiting lists the current members whose acknowledgement the newest
	// pending compaction lacks.
	Waiting []AuthorID
}

// CompactionStats reports compaction's counters.
func (r *Replica) CompactionStats() CompactionStats {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s := CompactionStats{Compacted: r.compacted, PoolsDropped: r.poolsDropped, Waiting: slices.Clone(r.waiting)}
	if r.cert != nil {
		s.Epoch = r.cert.cert.Compaction.Epoch
	}
	return s
}
