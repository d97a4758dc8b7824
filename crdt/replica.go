package crdt

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Config configures a Replica.
type Config struct {
	// Network is the replica's network. Fields of any other are rejected.
	Network NetworkID
	// Signer is the local author's key, used by Edit and Delete. Nil makes
	// a replica that merges but cannot edit (ErrNoSigner).
	Signer ed25519.PrivateKey
	// Members are the network's member keys at start; see SetMembers.
	// Open compares them with the member set the store holds: a member
	// of the stored set that Members lacks becomes former, as SetMembers
	// makes it.
	Members []AuthorID
	// Store holds the state durably. Nil means a new MemStore. The replica
	// owns the store from Open on and closes it on Close.
	Store Store
	// Limits bounds the state; zero fields take their defaults.
	Limits Limits
	// Obsolete, when set, is the schema's rule for fields that may be
	// dropped: given an active service's merged fields (in key order), it
	// returns the keys to drop. It runs on every change of a service, before
	// the field limit is checked and before the commit. It must be a pure
	// function of the fields and monotonic (a field obsolete in a set stays
	// obsolete in every superset), so that all replicas drop the same
	// fields whatever the arrival order. It must not retain the slice and
	// must not call the Replica: it runs inside a merge, with the
	// replica's write lock held (every merge and edit waits for it).
	Obsolete func(service ServiceID, fields []Field) []string
	// Check, when set, is the schema's validation of a field's key and
	// value, run on every field a merge would verify (never on the
	// tombstone). A field it refuses is left out of the merge, like a
	// field of a non-member, and counted in Refusals.Schema; the rest of
	// its snapshot merges. It must be a pure function of the field alone
	// (never of membership or other local state), so that every replica
	// refuses the same fields. Local edits are not checked: the schema
	// validates its drafts before editing. Like Obsolete it runs inside a
	// merge, with the replica's write lock held: it must be quick and must
	// not call the Replica.
	Check func(f *Field) error
	// Rank, when set, is the schema's precedence of a register's values,
	// compared before the Lamport clock: within one key the field of the
	// higher rank wins whatever its clock, and equal ranks fall back to
	// the (clock, author, bytes) order. It must be a pure function of the
	// field. vip uses it for listener generations, so that a removed
	// generation stays removed. Without it every rank is 0. It runs in Open
	// and inside merges and edits, with the replica's write lock held: it
	// must be quick and must not call the Replica.
	Rank func(f *Field) uint64
}

// Revision identifies a service's held state: a hash of its fields'
// encodings in key order, the same on every replica that holds the same
// fields. NoRevision is the revision of a service not held.
type Revision uint64

const (
	// NoRevision is the revision of a service the replica does not hold;
	// an edit that creates a service passes it.
	NoRevision Revision = 0
	// AnyRevision makes Edit and Delete skip the revision check.
	AnyRevision Revision = ^Revision(0)
)

// Edit is one field change of a local edit.
type Edit struct {
	// Key is the field key (1..MaxKeyBytes bytes, not starting with 0x00).
	Key string
	// Value is the new encoded value; nil with Clear unset is an empty value.
	Value []byte
	// Clear writes a field without a value (clears the register).
	Clear bool
}

// MergeResult tells what a merge did.
type MergeResult struct {
	// Refused counts this merge's refused fields by reason; Rejected is
	// their total.
	Refused Refusals
	// Changed lists the services whose held state changed, in id order.
	Changed []ServiceID
	// Accepted counts fields verified and stored as their register's value.
	Accepted int
	// Identical counts fields already held byte-identical: not re-verified.
	Identical int
	// Superseded counts valid fields that lost to the held field.
	Superseded int
	// Ignored counts fields of deleted services (a tombstone wins over
	// them, without verification) and fields dropped as obsolete.
	Ignored int
	// Rejected counts fields refused with an error (see the returned error).
	Rejected int
}

// ServiceInfo describes a held service.
type ServiceInfo struct {
	ID ServiceID
	// Deleted reports a tombstone; the service then holds no other field.
	Deleted bool
	// Fields counts the signed fields held (without the tombstone).
	Fields int
	// Revision identifies the held state (see Revision).
	Revision Revision
	// SnapshotBytes is the encoded snapshot's length.
	SnapshotBytes int
	// Err is the service's error state: the schema's (SetServiceError)
	// joined with crdt's own (a merge refused by a limit), or nil.
	Err error
}

// Replica is one node's copy of a network's signed field registers. It
// verifies and merges fields and snapshots from other members, makes and
// signs local edits, and persists every change to its Store before the
// change is visible through any read method.
//
// All methods are safe for concurrent use. Merges and edits are serialized;
// reads do not wait for verification or for the store's sync. After Close
// every method returns ErrClosed.
type Replica struct {
	net    NetworkID
	lim    Limits
	store  Store
	signer ed25519.PrivateKey
	self   AuthorID
	obs    func(ServiceID, []Field) []string
	check  func(*Field) error
	rank   func(*Field) uint64

	// writeMu serializes merges, edits and commits. With mu it guards the
	// committed state (services, active, tombs, meta).
	writeMu syncx.Mutex

	// mu guards every field below and the error fields of the services;
	// readers take it shared.
	//
	// The committed state is written with writeMu and mu both held, so a
	// writer (holding writeMu) reads it without mu and a reader reads it
	// with mu held for reading. The analyzer has no rule for "either of
	// two locks", so these four fields carry no annotation.
	mu syncx.RWMutex
	// +checklocks:mu
	closed bool
	// members is the member set, meta.members as a set.
	// +checklocks:mu
	members  map[AuthorID]struct{}
	services map[ServiceID]*service
	active   int
	tombs    int
	meta     meta
	// used is the last counter the local author used; counters up to
	// meta.counter[self] are reserved durably (see reserveCounters).
	// +checklocks:mu
	used uint64
	// refused counts the fields refused since Open, by reason.
	// +checklocks:mu
	refused Refusals
	// dropped counts services not held past MaxHeldServices since Open.
	// +checklocks:mu
	dropped uint64
	// formerDropped counts former-member entries not kept past
	// MaxFormerMembers since Open.
	// +checklocks:mu
	formerDropped uint64
	// over is the state held beyond the limits (refreshOver).
	// +checklocks:mu
	over OverLimit

	// cert is the held compaction certificate (nil for none), written
	// with writeMu and mu held, like the committed state.
	cert *heldCert
	// pools gathers acknowledgements of pending compactions.
	// +checklocks:writeMu
	pools map[[32]byte]*ackPool
	// waiting lists the members the newest pending compaction lacks.
	// +checklocks:mu
	waiting []AuthorID
	// +checklocks:mu
	waitingEpoch uint64
	// +checklocks:mu
	poolsDropped uint64
	// compacted counts the services dropped by certificates since Open.
	// +checklocks:mu
	compacted uint64
}

// service is one held service. It is immutable once published except for
// the error fields, which are guarded by Replica.mu.
type service struct {
	id        ServiceID
	fields    map[string]*entry // without the tombstone and the creation field
	tomb      *entry
	create    *entry // the creation field (CreationKey), nil for a random id
	rev       Revision
	enc       []byte // the snapshot's encoding
	schemaErr error
	limitErr  error // a merge of it was refused by a hard cap
	overErr   error // it is beyond a limit (refreshOver)
}

type entry struct {
	f    Field
	raw  []byte
	rank uint64 // Config.Rank of f
}

// Open loads the replica's state from cfg.Store. A store holding another
// network's state fails with ErrWrongNetwork; an unknown format version or
// a corrupt record fails with ErrUnknownVersion or ErrCorrupt, leaving the
// store untouched. Stored state beyond cfg.Limits fails with the limit's
// error.
func Open(ctx context.Context, cfg Config) (*Replica, error) {
	lim, err := cfg.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Signer != nil && len(cfg.Signer) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: signer key of %d bytes", ErrInvalidOptions, len(cfg.Signer))
	}
	st := cfg.Store
	if st == nil {
		st = NewMemStore()
	}
	r := &Replica{
		net:      cfg.Network,
		lim:      lim,
		store:    st,
		signer:   cfg.Signer,
		obs:      cfg.Obsolete,
		check:    cfg.Check,
		rank:     cfg.Rank,
		services: map[ServiceID]*service{},
		meta:     meta{network: cfg.Network, counter: map[AuthorID]uint64{}},
	}
	if cfg.Signer != nil {
		copy(r.self[:], cfg.Signer.Public().(ed25519.PublicKey))
	}
	if err := r.load(ctx); err != nil {
		return nil, fmt.Errorf("crdt: open: %w", err)
	}
	if err := r.openMembers(ctx, cfg.Members); err != nil {
		return nil, fmt.Errorf("crdt: open: %w", err)
	}
	// Every reserved counter may have signed something before a crash:
	// continue past all of them.
	r.used = max(r.meta.counter[r.self], r.meta.former[r.self])
	return r, nil
}

// load reads the store into r.
//
// +checklocksignore: Open calls it before r is shared, with no lock held.
func (r *Replica) load(ctx context.Context) error {
	recs, err := r.store.Load(ctx)
	if err != nil {
		return err
	}
	if recs.Meta == nil {
		if len(recs.Services) != 0 {
			return fmt.Errorf("%w: service records without a meta record", ErrCorrupt)
		}
		return nil
	}
	m, err := decodeMeta(recs.Meta)
	if err != nil {
		return fmt.Errorf("meta record: %w", err)
	}
	if m.network != r.net {
		return fmt.Errorf("%w: store holds network %s, replica is %s", ErrWrongNetwork, m.network, r.net)
	}
	r.meta = m
	if err := r.loadCompaction(); err != nil {
		return err
	}
	var ps []parsed
	for _, rec := range recs.Services {
		body, err := checkCRC(rec.Data)
		if err != nil {
			return fmt.Errorf("service %s: %w", rec.Service, err)
		}
		h, err := parseSnapshot(body, &r.lim, ps)
		if err != nil {
			if errors.Is(err, ErrUnknownVersion) || errors.Is(err, ErrSnapshotTooLarge) || errors.Is(err, ErrTooManyFields) ||
				errors.Is(err, ErrKeyTooLong) || errors.Is(err, ErrValueTooLarge) {
				// The checksum held: the record is intact but beyond
				// this build's format or this configuration's limits.
				return fmt.Errorf("service %s: %w", rec.Service, err)
			}
			return fmt.Errorf("service %s: %w: %w", rec.Service, ErrCorrupt, err)
		}
		ps = h.fields
		if h.network != r.net || h.service != rec.Service {
			return fmt.Errorf("%w: service record %s names service %s of network %s with %d fields",
				ErrCorrupt, rec.Service, h.service, h.network, len(h.fields))
		}
		s := &service{id: rec.Service, fields: map[string]*entry{}, enc: bytes.Clone(body)}
		for i := range h.fields {
			p := &h.fields[i]
			e := r.newEntry(p)
			r.meta.lamport = max(r.meta.lamport, p.lamport)
			if cfgSelf := r.self; r.signer != nil && p.author == cfgSelf && p.counter > r.meta.counter[cfgSelf] {
				r.meta.counter[cfgSelf] = p.counter
			}
			if e.f.IsTombstone() {
				s.tomb = e
			} else if e.f.IsCreation() {
				if e.f.HasValue || CreatedID(r.net, e.f.Author, e.f.Counter) != rec.Service {
					return fmt.Errorf("%w: service %s holds a creation field of another id", ErrCorrupt, rec.Service)
				}
				s.create = e
			} else if _, dup := s.fields[e.f.Key]; dup {
				return fmt.Errorf("%w: service %s holds key %q twice", ErrCorrupt, rec.Service, e.f.Key)
			} else {
				s.fields[e.f.Key] = e
			}
		}
		if s.tomb != nil && len(s.fields) > 0 {
			return fmt.Errorf("%w: deleted service %s holds fields", ErrCorrupt, rec.Service)
		}
		if s.tomb == nil && len(s.fields) > r.lim.MaxHeldFields {
			return fmt.Errorf("service %s: %w: %d stored, hard cap %d", rec.Service, ErrFieldLimit, len(s.fields), r.lim.MaxHeldFields)
		}
		s.rev = revisionOf(s)
		r.services[s.id] = s
		if s.tomb != nil {
			r.tombs++
		} else {
			r.active++
		}
	}
	if r.active > r.lim.MaxHeldServices {
		return fmt.Errorf("%w: %d stored, hard cap %d", ErrServiceLimit, r.active, r.lim.MaxHeldServices)
	}
	if r.tombs > r.lim.MaxHeldTombstones {
		return fmt.Errorf("%w: %d stored, hard cap %d", ErrTombstoneLimit, r.tombs, r.lim.MaxHeldTombstones)
	}
	r.refreshOver()
	return nil
}

func (r *Replica) newEntry(p *parsed) *entry {
	raw := bytes.Clone(p.raw)
	q, _, _ := parseField(raw, 0, &Limits{MaxKeyBytes: len(raw), MaxValueBytes: len(raw)}, false)
	e := &entry{f: q.field(), raw: raw}
	e.rank = r.rankOf(&e.f)
	return e
}

// rankOf is Config.Rank of f (0 for the tombstone, the creation field
// and without the hook).
func (r *Replica) rankOf(f *Field) uint64 {
	if r.rank == nil || f.Key == TombstoneKey || f.Key == CreationKey {
		return 0
	}
	return r.rank(f)
}

// Close closes the replica and its store. It waits for a merge or edit in
// progress, then closes the store with no replica lock held: Store.Close
// may call the replica (every method then returns ErrClosed).
func (r *Replica) Close() error {
	// Taking writeMu waits for the merge or edit in progress; every later
	// one takes writeMu, sees closed and leaves the store alone, so the
	// store is closed after writeMu is released.
	r.writeMu.Lock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.writeMu.Unlock()
		return ErrClosed
	}
	r.closed = true
	r.mu.Unlock()
	r.writeMu.Unlock()
	return r.store.Close()
}

// Network returns the replica's network.
func (r *Replica) Network() NetworkID { return r.net }

// Author returns the local author's key (zero without a signer).
func (r *Replica) Author() AuthorID { return r.self }

// Limits returns the replica's limits, defaults applied.
func (r *Replica) Limits() Limits { return r.lim }

// Members returns the member keys in key order.
func (r *Replica) Members() []AuthorID {
	r.mu.RLock()
	out := make([]AuthorID, 0, len(r.members))
	for k := range r.members {
		out = append(out, k)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b AuthorID) int { return bytes.Compare(a[:], b[:]) })
	return out
}

// Lamport returns the highest Lamport clock seen in any field, kept in
// the store as a high-water mark. Edits do not sign with it: an edit of a
// key signs with the clock held for that key plus one (see Edit).
func (r *Replica) Lamport() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.meta.lamport
}

// Counter returns, for the local author, the highest counter it has spent:
// every counter up to it may have signed a field, and the next edit signs
// above it. Within one run that is the last counter used by an edit (or
// merged back from one of its own fields); after a reopen it is the
// ceiling of the durable reservation, since counters reserved before a
// crash may have been used (0 for a fresh store). For another author it
// returns the ceiling reserved in the store, which is 0 unless the store
// was written by a replica with that author's key.
func (r *Replica) Counter(author AuthorID) uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if author == r.self && r.signer != nil {
		return r.used
	}
	return r.meta.counter[author]
}

// Services describes every held service (active and deleted), in id order.
func (r *Replica) Services() []ServiceInfo {
	r.mu.RLock()
	out := make([]ServiceInfo, 0, len(r.services))
	for _, s := range r.services {
		out = append(out, s.info())
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b ServiceInfo) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	return out
}

// Service describes one service; false when it is not held.
func (r *Replica) Service(id ServiceID) (ServiceInfo, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.services[id]
	if !ok {
		return ServiceInfo{}, false
	}
	return s.info(), true
}

func (s *service) info() ServiceInfo {
	return ServiceInfo{
		ID: s.id, Deleted: s.tomb != nil, Fields: len(s.fields), Revision: s.rev,
		SnapshotBytes: len(s.enc), Err: errors.Join(s.schemaErr, s.limitErr, s.overErr),
	}
}

// Fields returns copies of a service's fields in key order, without its
// tombstone; nil when the service is not held or is deleted.
func (r *Replica) Fields(id ServiceID) []Field {
	r.mu.RLock()
	s := r.services[id]
	r.mu.RUnlock()
	if s == nil || s.tomb != nil {
		return nil
	}
	return s.sortedFields(true)
}

// sortedEntries returns the fields and the creation field in key order,
// without the tombstone.
func (s *service) sortedEntries() []*entry {
	out := make([]*entry, 0, len(s.fields)+1)
	for _, e := range s.fields {
		out = append(out, e)
	}
	if s.create != nil {
		out = append(out, s.create)
	}
	slices.SortFunc(out, func(a, b *entry) int { return strings.Compare(a.f.Key, b.f.Key) })
	return out
}

// creator returns the creator and counter of a creator-bound service.
func (s *service) creator() (AuthorID, uint64, bool) {
	if s.create == nil {
		return AuthorID{}, 0, false
	}
	return s.create.f.Author, s.create.f.Counter, true
}

func (s *service) sortedFields(clone bool) []Field {
	out := make([]Field, 0, len(s.fields))
	for _, e := range s.fields {
		f := e.f
		if clone {
			f.Value = bytes.Clone(f.Value)
			f.Signature = bytes.Clone(f.Signature)
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Field) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Snapshot returns the service's snapshot: its fields in key order, or its
// tombstone alone once deleted. ok is false when the service is not held.
func (r *Replica) Snapshot(id ServiceID) (snap Snapshot, ok bool) {
	r.mu.RLock()
	s := r.services[id]
	r.mu.RUnlock()
	if s == nil {
		return Snapshot{}, false
	}
	snap, err := DecodeSnapshot(s.enc, &r.lim)
	if err != nil { // held encodings were produced and checked here
		return Snapshot{}, false
	}
	return snap, true
}

// EncodedSnapshot returns a copy of the service's encoded snapshot, ready
// to publish; it always fits Limits.MaxSnapshotBytes. ok is false when the
// service is not held.
func (r *Replica) EncodedSnapshot(id ServiceID) (b []byte, ok bool) {
	r.mu.RLock()
	s := r.services[id]
	r.mu.RUnlock()
	if s == nil {
		return nil, false
	}
	return bytes.Clone(s.enc), true
}

// SetServiceError sets (or, with nil, clears) the schema's error state of a
// held service: for example a merged configuration beyond the schema's
// limits, to be excluded from routing. It is kept in memory only and
// reported by Service and Services. It is a no-op for a service not held.
func (r *Replica) SetServiceError(id ServiceID, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.services[id]; s != nil {
		s.schemaErr = err
	}
}

// ServiceError returns a service's error state (see ServiceInfo.Err).
func (r *Replica) ServiceError(id ServiceID) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if s := r.services[id]; s != nil {
		return errors.Join(s.schemaErr, s.limitErr, s.overErr)
	}
	return nil
}

func revisionOf(s *service) Revision {
	h := sha256.New()
	if s.tomb != nil {
		h.Write(s.tomb.raw)
	}
	for _, e := range s.sortedEntries() {
		h.Write(e.raw)
	}
	var sum [sha256.Size]byte
	rev := Revision(binary.BigEndian.Uint64(h.Sum(sum[:0])))
	if rev == NoRevision || rev == AnyRevision {
		rev = 1
	}
	return rev
}
