package crdt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// FormerMember is an entry of the former-member list: an author that was a
// member and the last counter it is known to have signed while it was one.
// A field of a former member is accepted when its counter is 1..LastCounter
// (see Replica.MergeFormer).
type FormerMember struct {
	Author      AuthorID
	LastCounter uint64
}

// memberSet returns keys sorted, without repeats.
func memberSet(keys []AuthorID) []AuthorID {
	out := slices.Clone(keys)
	slices.SortFunc(out, func(a, b AuthorID) int { return bytes.Compare(a[:], b[:]) })
	return slices.Compact(out)
}

func setOf(keys []AuthorID) map[AuthorID]struct{} {
	m := make(map[AuthorID]struct{}, len(keys))
	for _, k := range keys {
		m[k] = struct{}{}
	}
	return m
}

// openMembers takes the member set at Open. A store of meta version 2
// holds the set it last committed: its members that cfgMembers lacks
// become former, as with SetMembers. A version-1 record (or none) holds
// no set: the replica takes cfgMembers; a version-1 record is rewritten
// at once, so that the set is on disk before any later start compares
// against it.
//
// +checklocksignore: Open calls it before r is shared, with no lock held.
func (r *Replica) openMembers(ctx context.Context, cfgMembers []AuthorID) error {
	if r.meta.version < 2 {
		r.meta.members = memberSet(cfgMembers)
		r.members = setOf(r.meta.members)
		if r.meta.version == 0 {
			return nil
		}
		return r.setMembersLocked(ctx, cfgMembers, true)
	}
	r.members = setOf(r.meta.members)
	return r.setMembersLocked(ctx, cfgMembers, false)
}

// SetMembers replaces the network's member keys and commits them (synced)
// before it returns. Fields are accepted only from members, and from
// former members up to their last counter; fields already held stay
// whatever the membership becomes. A field refused because its author was
// not yet a member is accepted when a later snapshot brings it again.
//
// An author that leaves the member set becomes a former member (Former),
// with the last counter of its existing entry or the highest counter of
// any field it signed that the replica holds (tombstones included),
// whichever is higher. Past Limits.MaxFormerMembers the entries of the
// highest author ids are dropped and counted (OverLimit.FormerDropped).
// An author that joins again keeps its entry: it is a member, and the
// entry still tells a fresh replica of its own key where its counters
// end (MergeFormer).
//
// On a commit error nothing changes.
func (r *Replica) SetMembers(ctx context.Context, keys []AuthorID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	closed := r.closed
	r.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return r.setMembersLocked(ctx, keys, false)
}

// setMembersLocked makes keys the member set, committing when the set or
// the former list changes (or when force is set). Called with writeMu
// held, or from Open before r is shared.
func (r *Replica) setMembersLocked(ctx context.Context, keys []AuthorID, force bool) error {
	next := memberSet(keys)
	in := setOf(next)
	var left []AuthorID
	for _, k := range r.meta.members {
		if _, ok := in[k]; !ok {
			left = append(left, k)
		}
	}
	m := r.meta // the maps are copied before any change
	m.members = next
	changed := force || !slices.Equal(r.meta.members, next)
	dropped := 0
	if len(left) > 0 {
		held := r.heldCounters(left)
		m.former = maps.Clone(r.meta.former)
		if m.former == nil {
			m.former = map[AuthorID]uint64{}
		}
		for _, a := range left {
			old, ok := m.former[a]
			if last := max(old, held[a]); !ok || last > old {
				m.former[a] = last
				changed = true
			}
		}
		dropped = capFormer(m.former, r.lim.MaxFormerMembers)
	}
	if !changed {
		return nil
	}
	if err := r.commit(ctx, nil, nil, nil, &m); err != nil {
		return err
	}
	r.mu.Lock()
	r.meta = m
	r.members = in
	r.formerDropped += uint64(dropped)
	r.mu.Unlock()
	return nil
}

// heldCounters returns, for each of authors, the highest counter of the
// held fields (tombstones included) it signed. Called with writeMu held.
func (r *Replica) heldCounters(authors []AuthorID) map[AuthorID]uint64 {
	want := setOf(authors)
	out := make(map[AuthorID]uint64, len(authors))
	see := func(e *entry) {
		if _, ok := want[e.f.Author]; ok && e.f.Counter > out[e.f.Author] {
			out[e.f.Author] = e.f.Counter
		}
	}
	for _, s := range r.services {
		if s.tomb != nil {
			see(s.tomb)
		}
		if s.create != nil {
			see(s.create)
		}
		for _, e := range s.fields {
			see(e)
		}
	}
	return out
}

// capFormer keeps the max entries of the lowest author ids and returns
// how many it dropped. Which entries stay depends only on the set of
// authors, never on the order they came in, so the list's merge (the
// union with the highest counter per author, then the cap) stays
// commutative, associative and idempotent: an author dropped from a union
// has max lower ids before it in every superset too.
func capFormer(m map[AuthorID]uint64, limit int) int {
	if len(m) <= limit {
		return 0
	}
	authors := sortedAuthors(m)
	for _, a := range authors[limit:] {
		delete(m, a)
	}
	return len(authors) - limit
}

// Former returns the former-member list in author order. It includes
// entries of authors that have since become members again.
func (r *Replica) Former() []FormerMember {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]FormerMember, 0, len(r.meta.former))
	for _, a := range sortedAuthors(r.meta.former) {
		out = append(out, FormerMember{Author: a, LastCounter: r.meta.former[a]})
	}
	return out
}

// MergeFormer merges a former-member list from another replica: for each
// author the higher last counter wins, and past Limits.MaxFormerMembers
// the entries of the lowest author ids are kept (the others are counted in
// OverLimit.FormerDropped). The merge is commutative, associative and
// idempotent. The change is committed (synced) before MergeFormer returns;
// changed reports whether the list changed.
//
// An entry of the replica's own author makes it continue its counters
// past LastCounter: a member re-added with a fresh store never signs
// again with a counter it used before it left. The counters up to it
// count as spent and reserved, in the same commit; the next edit reserves
// past it as every edit does.
//
// An entry above MaxClock refuses the whole list with ErrLamportRange,
// changing nothing; it is counted in Refusals.Former.
//
// The list is taken on a current member's word. Its power there is no more
// than editing: an entry lets a key that is no longer a member have
// fields with counters up to LastCounter accepted, which a current member
// could write itself under its own key (see docs/crdt.md).
func (r *Replica) MergeFormer(ctx context.Context, in []FormerMember) (changed bool, err error) {
	var bad []error
	for _, e := range in {
		if e.LastCounter > MaxClock {
			bad = append(bad, fmt.Errorf("crdt: former member %s: %w: last counter %d above %d", e.Author, ErrLamportRange, e.LastCounter, MaxClock))
		}
	}
	if len(bad) > 0 {
		r.countRefused(Refusals{Former: uint64(len(bad))})
		return false, errors.Join(bad...)
	}
	if len(in) == 0 {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	closed, used := r.closed, r.used
	r.mu.RUnlock()
	if closed {
		return false, ErrClosed
	}
	m := r.meta
	m.former = maps.Clone(r.meta.former)
	if m.former == nil {
		m.former = map[AuthorID]uint64{}
	}
	for _, e := range in {
		if old, ok := m.former[e.Author]; !ok || e.LastCounter > old {
			m.former[e.Author] = e.LastCounter
			changed = true
		}
	}
	dropped := capFormer(m.former, r.lim.MaxFormerMembers)
	// Only an entry that was kept counts: the list is the same on every
	// replica, and one that dropped the author's entry refuses its fields.
	if changed && maps.Equal(m.former, r.meta.former) {
		changed = false
	}
	bump := uint64(0)
	if last, ok := m.former[r.self]; ok && r.signer != nil && last > used {
		bump = last
		if last > m.counter[r.self] {
			m.counter = maps.Clone(r.meta.counter)
			if m.counter == nil {
				m.counter = map[AuthorID]uint64{}
			}
			m.counter[r.self] = last
		}
	}
	if !changed && bump == 0 {
		if dropped > 0 {
			r.mu.Lock()
			r.formerDropped += uint64(dropped)
			r.mu.Unlock()
		}
		return false, nil
	}
	if err := r.commit(ctx, nil, nil, nil, &m); err != nil {
		return false, err
	}
	r.mu.Lock()
	r.meta = m
	r.formerDropped += uint64(dropped)
	if bump > r.used {
		r.used = bump
	}
	r.mu.Unlock()
	return changed, nil
}

// formerCovers reports whether a former member's entry covers counter c.
// Counter 0 is never signed by a replica (an author's first counter is
// 1), so no entry covers it: an entry of 0 covers nothing.
func formerCovers(last, c uint64) bool { return c >= 1 && c <= last }
