package crdt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// group is the part of one merge or edit that concerns one service. A
// group is applied whole or not at all.
type group struct {
	id      ServiceID
	ps      []parsed
	trusted bool // a local edit: signed here, not verified again
	errs    []error
	bad     bool // a field failed a check that rejects the group
}

func (g *group) setErr(i int, err error) {
	if g.errs == nil {
		g.errs = make([]error, len(g.ps))
	}
	g.errs[i] = err
}

// fieldState is what classification decided for one field.
type fieldState uint8

const (
	fsPending   fieldState = iota // to verify, then apply
	fsIdentical                   // held byte-identical
	fsIgnored                     // the service is deleted
	fsRejected                    // refused (errs has why)
)

// MergeSnapshot verifies an encoded snapshot and merges it. See
// MergeSnapshots.
func (r *Replica) MergeSnapshot(ctx context.Context, snap []byte) (MergeResult, error) {
	return r.MergeSnapshots(ctx, [][]byte{snap})
}

// MergeSnapshots verifies encoded snapshots and merges them, committing
// every change in one synced store batch before it becomes visible.
//
// Each snapshot is decoded strictly (an encoding error rejects the whole
// snapshot) and applied whole or not at all: a field of another network, a
// bad or wrong-domain signature, a reserved key or a clock out of range
// rejects its snapshot; a limit that the merged service would exceed
// rejects it too (and sets the service's error state when it is held).
// Fields whose author is not a member are left out (ErrNotMember), and so
// are fields of a former member past its last counter (ErrFormerMember),
// while the snapshot's other fields merge. Fields already held byte-identical are
// not verified again; the others are verified in ZIP-215 batches of up to
// 1024, spread over GOMAXPROCS goroutines when there are several hundred
// (all of them have returned when the call does).
//
// The returned error joins one error per refused snapshot or field, each
// wrapping a sentinel (errors.Is); MergeResult counts what was done. The
// snapshots' bytes are not retained.
func (r *Replica) MergeSnapshots(ctx context.Context, snaps [][]byte) (MergeResult, error) {
	groups := make([]group, 0, len(snaps))
	var errs []error
	var bad uint64
	for i, b := range snaps {
		h, err := parseSnapshot(b, &r.lim, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("crdt: snapshot %d: %w", i, err))
			bad++
			continue
		}
		groups = append(groups, group{id: h.service, ps: h.fields})
	}
	res, err := r.merge(ctx, groups)
	res.Refused.Encoding += bad
	r.countRefused(res.Refused)
	return res, errors.Join(append(errs, err)...)
}

// MergeFields verifies fields (from a live update) and merges them, with
// the rules of MergeSnapshots; the fields of each service form one group
// applied whole or not at all.
func (r *Replica) MergeFields(ctx context.Context, fields []Field) (MergeResult, error) {
	idx := map[ServiceID]int{}
	var groups []group
	var errs []error
	for i := range fields {
		f := &fields[i]
		raw := f.Encode()
		p, n, err := parseField(raw, 0, &r.lim, false)
		if err == nil && n != len(raw) {
			err = ErrTrailingBytes
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("crdt: %w", fieldErr(f, err)))
			continue
		}
		gi, ok := idx[f.Service]
		if !ok {
			gi = len(groups)
			idx[f.Service] = gi
			groups = append(groups, group{id: f.Service})
		}
		groups[gi].ps = append(groups[gi].ps, p)
	}
	res, err := r.merge(ctx, groups)
	res.Rejected += len(errs)
	res.Refused.Encoding += uint64(len(errs))
	r.countRefused(res.Refused)
	return res, errors.Join(append(errs, err)...)
}

func (r *Replica) countRefused(c Refusals) {
	if c.Total() == 0 {
		return
	}
	r.mu.Lock()
	r.refused.add(c)
	r.mu.Unlock()
}

// Refused returns the fields refused by merges since Open, by reason.
func (r *Replica) Refused() Refusals {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.refused
}

// checkField applies the checks that need no signature.
func (r *Replica) checkField(p *parsed) error {
	if p.network != r.net {
		return ErrWrongNetwork
	}
	if p.key[0] == 0 && string(p.key) != TombstoneKey {
		return ErrReservedKey
	}
	if p.hasValue && string(p.key) == TombstoneKey {
		return ErrBadTombstone
	}
	if p.lamport > MaxClock || p.counter > MaxClock {
		return ErrLamportRange
	}
	return nil
}

// merge classifies, verifies, applies and commits groups.
func (r *Replica) merge(ctx context.Context, groups []group) (MergeResult, error) {
	var res MergeResult
	if len(groups) == 0 {
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	return r.mergeLocked(ctx, groups)
}

// mergeLocked is merge with r.writeMu held.
func (r *Replica) mergeLocked(ctx context.Context, groups []group) (MergeResult, error) {
	var res MergeResult
	r.mu.RLock()
	closed, members := r.closed, r.members
	r.mu.RUnlock()
	former := r.meta.former // written only under writeMu, which we hold
	if closed {
		return res, ErrClosed
	}

	// Classify every field against the committed state. r.services is only
	// written under writeMu, which we hold.
	states := make([][]fieldState, len(groups))
	var toVerify []*parsed
	var verifyAt [][2]int
	for gi := range groups {
		g := &groups[gi]
		st := make([]fieldState, len(g.ps))
		states[gi] = st
		held := r.services[g.id]
		if !g.trusted {
			if err := r.compactedRefusal(g); err != nil {
				for i := range g.ps {
					st[i] = fsRejected
					g.setErr(i, err)
				}
				continue
			}
		}
		for i := range g.ps {
			p := &g.ps[i]
			if err := r.checkField(p); err != nil {
				st[i], g.bad = fsRejected, true
				g.setErr(i, err)
				continue
			}
			if g.trusted {
				continue
			}
			if held != nil {
				if e := held.lookup(p.key); e != nil && bytes.Equal(e.raw, p.raw) {
					st[i] = fsIdentical
					continue
				}
				if held.tomb != nil && string(p.key) != TombstoneKey && string(p.key) != CreationKey {
					st[i] = fsIgnored
					continue
				}
			}
			if _, ok := members[p.author]; !ok {
				if last, was := former[p.author]; !was {
					st[i] = fsRejected
					g.setErr(i, ErrNotMember)
					continue
				} else if !formerCovers(last, p.counter) {
					st[i] = fsRejected
					g.setErr(i, fmt.Errorf("%w: counter %d, last %d", ErrFormerMember, p.counter, last))
					continue
				}
			}
			if string(p.key) == CreationKey {
				if p.hasValue || CreatedID(r.net, p.author, p.counter) != g.id {
					st[i] = fsRejected
					g.setErr(i, fmt.Errorf("%w: author %s counter %d", ErrBadCreation, p.author, p.counter))
					continue
				}
			} else if r.check != nil && string(p.key) != TombstoneKey {
				f := p.field()
				if err := r.check(&f); err != nil {
					st[i] = fsRejected
					g.setErr(i, fmt.Errorf("%w: %w", ErrInvalidField, err))
					continue
				}
			}
			toVerify = append(toVerify, p)
			verifyAt = append(verifyAt, [2]int{gi, i})
		}
	}
	if len(toVerify) > 0 {
		verrs := make([]error, len(toVerify))
		if verifyParsed(toVerify, verrs) {
			for k, err := range verrs {
				if err != nil {
					gi, i := verifyAt[k][0], verifyAt[k][1]
					states[gi][i], groups[gi].bad = fsRejected, true
					groups[gi].setErr(i, err)
				}
			}
		}
	}

	// Apply each group to a pending copy of its service.
	pending := map[ServiceID]*service{}
	var order []ServiceID
	limitErrs := map[ServiceID]error{}
	newMeta := r.meta // its maps are copied before any change
	metaChanged, countersCopied := false, false
	var ownMax uint64
	active, tombs := r.active, r.tombs
	var errs []error
	// refuse counts the fields group g would have applied (gr) as refused
	// by a limit, and keeps err for the service when it exists.
	refuse := func(g *group, gr MergeResult, err error) {
		res.Rejected += gr.Accepted
		res.Refused.Limit += uint64(gr.Accepted)
		errs = append(errs, fmt.Errorf("crdt: service %s refused: %w", g.id, err))
		if r.services[g.id] != nil {
			limitErrs[g.id] = err
		}
	}
	for gi := range groups {
		g := &groups[gi]
		st := states[gi]
		var gerrs []error
		for i, s := range st {
			switch s {
			case fsIdentical:
				res.Identical++
			case fsIgnored:
				res.Ignored++
			case fsRejected:
				res.Rejected++
				res.Refused.count(g.errs[i])
				gerrs = append(gerrs, fieldErr(ptrField(&g.ps[i]), g.errs[i]))
			}
		}
		if g.bad {
			errs = append(errs, fmt.Errorf("crdt: service %s refused: %w", g.id, errors.Join(gerrs...)))
			continue
		}
		if len(gerrs) > 0 {
			errs = append(errs, fmt.Errorf("crdt: service %s: %w", g.id, errors.Join(gerrs...)))
		}
		base := pending[g.id]
		if base == nil {
			base = r.services[g.id]
		}
		ns, gr, lamport, own, err := r.applyGroup(base, g, st)
		if err != nil {
			refuse(g, gr, err)
			continue
		}
		wasActive := base != nil && base.tomb == nil
		wasTomb := base != nil && base.tomb != nil
		if ns != nil {
			isTomb := ns.tomb != nil
			tombCap := r.lim.MaxHeldTombstones
			if g.trusted {
				tombCap = r.lim.MaxTombstones
			}
			if g.trusted && !wasActive && !isTomb && active+1 > r.lim.MaxServices {
				err = fmt.Errorf("%w: %d active services, limit %d", ErrServiceLimit, active, r.lim.MaxServices)
			} else if !wasTomb && isTomb && tombs+1 > tombCap {
				r.mu.RLock()
				note := r.waitingNote()
				r.mu.RUnlock()
				err = fmt.Errorf("%w: %d tombstones held, limit %d%s", ErrTombstoneLimit, tombs, tombCap, note)
			}
			if err != nil {
				refuse(g, gr, err)
				continue
			}
			if wasActive {
				active--
			}
			if wasTomb {
				tombs--
			}
			if isTomb {
				tombs++
			} else {
				active++
			}
			if _, seen := pending[g.id]; !seen {
				order = append(order, g.id)
			}
			pending[g.id] = ns
		}
		res.Accepted += gr.Accepted
		res.Superseded += gr.Superseded
		res.Ignored += gr.Ignored
		res.Identical += gr.Identical
		if lamport > newMeta.lamport {
			newMeta.lamport = lamport
			metaChanged = true
		}
		ownMax = max(ownMax, own)
		if r.signer != nil && own > newMeta.counter[r.self] {
			if !countersCopied {
				// r.meta stays untouched until publish.
				newMeta.counter = maps.Clone(r.meta.counter)
				if newMeta.counter == nil {
					newMeta.counter = map[AuthorID]uint64{}
				}
				countersCopied = true
			}
			newMeta.counter[r.self] = own
			metaChanged = true
		}
	}
	// The hard cap of active services: the lowest ids are held, whatever
	// the order they came in; the others are not (refused or dropped).
	var drop []ServiceID
	if active > r.lim.MaxHeldServices {
		ids := make([]ServiceID, 0, active)
		for id, s := range r.services {
			if _, p := pending[id]; !p && s.tomb == nil {
				ids = append(ids, id)
			}
		}
		for id, s := range pending {
			if s.tomb == nil {
				ids = append(ids, id)
			}
		}
		slices.SortFunc(ids, func(a, b ServiceID) int { return bytes.Compare(a[:], b[:]) })
		for _, id := range ids[r.lim.MaxHeldServices:] {
			if _, p := pending[id]; p {
				delete(pending, id)
				order = slices.DeleteFunc(order, func(x ServiceID) bool { return x == id })
			}
			if r.services[id] != nil {
				drop = append(drop, id)
			}
			res.Refused.Limit++
			errs = append(errs, fmt.Errorf("crdt: service %s not held: %w: %d active services, hard cap %d (the highest ids are not held)",
				id, ErrServiceLimit, len(ids), r.lim.MaxHeldServices))
		}
		active = r.lim.MaxHeldServices
	}
	if len(pending) == 0 && len(drop) == 0 && !metaChanged {
		r.setLimitErrs(limitErrs)
		return res, errors.Join(errs...)
	}
	if err := r.commit(ctx, pending, order, drop, &newMeta); err != nil {
		return MergeResult{}, err
	}
	r.publish(pending, order, drop, &newMeta, active, tombs, limitErrs, ownMax)
	res.Changed = order
	slices.SortFunc(res.Changed, func(a, b ServiceID) int { return bytes.Compare(a[:], b[:]) })
	return res, errors.Join(errs...)
}

func ptrField(p *parsed) *Field {
	f := p.field()
	return &f
}

// lookup returns the held entry for key, the tombstone included.
func (s *service) lookup(key []byte) *entry {
	switch string(key) {
	case TombstoneKey:
		return s.tomb
	case CreationKey:
		return s.create
	}
	return s.fields[string(key)]
}

// applyGroup merges g's surviving fields into a copy of base. It returns
// the new service (nil when nothing changed), the counts, the highest
// Lamport clock and own counter among the applied fields, or a limit error.
//
// A local edit may not take a service past MaxFieldsPerService (or further
// past it, when merges already did); a merge may, up to MaxHeldFields,
// and the service is then reported (see refreshOver).
func (r *Replica) applyGroup(base *service, g *group, st []fieldState) (*service, MergeResult, uint64, uint64, error) {
	var gr MergeResult
	var lamport, own uint64
	ns := &service{id: g.id, fields: map[string]*entry{}}
	if base != nil {
		ns.tomb = base.tomb
		ns.create = base.create
		for k, e := range base.fields {
			ns.fields[k] = e
		}
	}
	changed := false
	for i := range g.ps {
		if st[i] != fsPending {
			continue
		}
		p := &g.ps[i]
		lamport = max(lamport, p.lamport)
		if p.author == r.self {
			own = max(own, p.counter)
		}
		if string(p.key) == TombstoneKey {
			if ns.tomb == nil || compareRaw(&Field{Lamport: p.lamport, Author: p.author}, p.raw, &ns.tomb.f, ns.tomb.raw) > 0 {
				if ns.tomb != nil && bytes.Equal(ns.tomb.raw, p.raw) {
					gr.Identical++
					continue
				}
				ns.tomb = r.newEntry(p)
				gr.Accepted++
				changed = true
			} else if bytes.Equal(ns.tomb.raw, p.raw) {
				gr.Identical++
			} else {
				gr.Superseded++
			}
			continue
		}
		if string(p.key) == CreationKey {
			// One creator, one counter: only one creation field binds
			// an id, and a tombstone keeps it.
			switch {
			case ns.create == nil:
				ns.create = r.newEntry(p)
				gr.Accepted++
				changed = true
			case bytes.Equal(ns.create.raw, p.raw):
				gr.Identical++
			case compareRaw(&Field{Lamport: p.lamport, Author: p.author}, p.raw, &ns.create.f, ns.create.raw) > 0:
				ns.create = r.newEntry(p)
				gr.Accepted++
				changed = true
			default:
				gr.Superseded++
			}
			continue
		}
		if ns.tomb != nil {
			gr.Ignored++
			continue
		}
		e := ns.fields[string(p.key)]
		switch {
		case e == nil:
		case bytes.Equal(e.raw, p.raw):
			gr.Identical++
			continue
		case r.compareHeld(p, e) <= 0:
			gr.Superseded++
			continue
		}
		ne := r.newEntry(p)
		ns.fields[ne.f.Key] = ne
		gr.Accepted++
		changed = true
	}
	if !changed {
		return nil, gr, lamport, own, nil
	}
	if ns.tomb != nil {
		gr.Ignored += len(ns.fields)
		ns.fields = map[string]*entry{}
	} else if r.obs != nil {
		drop := r.obs(ns.id, ns.sortedFields(true))
		for _, k := range drop {
			if _, ok := ns.fields[k]; ok {
				delete(ns.fields, k)
				gr.Ignored++
			}
		}
	}
	fieldCap := r.lim.MaxHeldFields
	if g.trusted {
		fieldCap = r.lim.MaxFieldsPerService
		if base != nil {
			fieldCap = max(fieldCap, len(base.fields))
		}
	}
	if ns.tomb == nil && len(ns.fields) > fieldCap {
		return nil, gr, 0, 0, fmt.Errorf("%w: %d fields, limit %d", ErrFieldLimit, len(ns.fields), fieldCap)
	}
	ns.enc = r.encodeRaw(ns)
	if len(ns.enc) > r.lim.MaxSnapshotBytes {
		return nil, gr, 0, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrSnapshotTooLarge, len(ns.enc), r.lim.MaxSnapshotBytes)
	}
	ns.rev = revisionOf(ns)
	return ns, gr, lamport, own, nil
}

// compareHeld orders an incoming field against the held entry of its key:
// by Config.Rank, then by the merge order.
func (r *Replica) compareHeld(p *parsed, e *entry) int {
	if r.rank != nil {
		f := p.field()
		if pr := r.rankOf(&f); pr != e.rank {
			if pr < e.rank {
				return -1
			}
			return 1
		}
	}
	return compareRaw(&Field{Lamport: p.lamport, Author: p.author}, p.raw, &e.f, e.raw)
}

// encodeRaw encodes s's snapshot from its fields' held encodings.
func (r *Replica) encodeRaw(s *service) []byte {
	es := s.sortedEntries()
	n := uvarintLen(SnapshotVersion) + 32 + 10
	for _, e := range es {
		n += len(e.raw)
	}
	cnt := len(es)
	if s.tomb != nil {
		cnt++
		n += len(s.tomb.raw)
	}
	b := make([]byte, 0, n)
	b = appendUvarint(b, SnapshotVersion)
	b = append(b, r.net[:]...)
	b = append(b, s.id[:]...)
	b = appendUvarint(b, uint64(cnt))
	if s.tomb != nil {
		b = append(b, s.tomb.raw...)
	}
	for _, e := range es {
		b = append(b, e.raw...)
	}
	return b
}

// commit writes the pending services and the meta record in one batch.
func (r *Replica) commit(ctx context.Context, pending map[ServiceID]*service, order, drop []ServiceID, m *meta) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := Batch{Meta: encodeMeta(m), Delete: drop}
	for _, id := range order {
		enc := pending[id].enc
		rec := make([]byte, 0, len(enc)+4)
		rec = appendCRC(append(rec, enc...), 0)
		b.Put = append(b.Put, Record{Service: id, Data: rec})
	}
	if err := r.store.Commit(ctx, b); err != nil {
		return fmt.Errorf("crdt: commit: %w", err)
	}
	return nil
}

// publish makes committed changes visible.
func (r *Replica) publish(pending map[ServiceID]*service, order, drop []ServiceID, m *meta, active, tombs int, limitErrs map[ServiceID]error, own uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range drop {
		delete(r.services, id)
	}
	r.dropped += uint64(len(drop))
	if r.signer != nil && own > r.used {
		// Our own field, signed before a lost store: never reuse its counter.
		r.used = own
	}
	for _, id := range order {
		ns := pending[id]
		if old := r.services[id]; old != nil {
			ns.schemaErr = old.schemaErr
		}
		r.services[id] = ns
	}
	for id, err := range limitErrs {
		if s := r.services[id]; s != nil {
			if _, changed := pending[id]; !changed {
				s.limitErr = err
			}
		}
	}
	r.active, r.tombs = active, tombs
	r.meta = *m
	r.refreshOver()
}

func (r *Replica) setLimitErrs(errs map[ServiceID]error) {
	if len(errs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, err := range errs {
		if s := r.services[id]; s != nil {
			s.limitErr = err
		}
	}
}
