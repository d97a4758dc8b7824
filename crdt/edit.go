package crdt

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// Edit makes a local edit of one service: it signs one field per edit with
// the replica's key, a Lamport clock one past the clock of the field held
// for that key (1 for a new key) and the author's next counters (reserved
// durably before anything is signed),
// merges them, and commits the merged snapshot with the author's counter
// in one synced batch before returning. The
// returned fields (and EncodedSnapshot) are then ready to publish.
//
// base is the service's revision the edit was drafted on: the edit fails
// with ErrStaleRevision when the service has changed since (NoRevision for
// a new service, AnyRevision to skip the check). A deleted service fails
// with ErrDeleted; an edit beyond a limit fails with the limit's error and
// changes nothing.
//
// The clock is per key so that a field signed at MaxClock, which every
// replica accepts, pins only its own key: an edit of that key fails with
// ErrLamportRange naming the key and its author, while every other key
// and service stays editable, and deleting the service (its tombstone
// wins whatever the clocks) recovers. An edit is still causally after
// every field of its key the replica has seen, which is all the merge
// order needs.
func (r *Replica) Edit(ctx context.Context, id ServiceID, base Revision, edits ...Edit) ([]Field, error) {
	if len(edits) == 0 {
		return nil, fmt.Errorf("%w: no field", ErrBadEdit)
	}
	fields := make([]Field, len(edits))
	seen := make(map[string]bool, len(edits))
	for i, e := range edits {
		if seen[e.Key] {
			return nil, fmt.Errorf("%w: key %q twice", ErrBadEdit, e.Key)
		}
		seen[e.Key] = true
		switch {
		case e.Key == "":
			return nil, ErrEmptyKey
		case e.Key[0] == 0, e.Key == CreationKey:
			return nil, fmt.Errorf("%w: %q", ErrReservedKey, e.Key)
		case len(e.Key) > r.lim.MaxKeyBytes:
			return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLong, len(e.Key), r.lim.MaxKeyBytes)
		case len(e.Value) > r.lim.MaxValueBytes:
			return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, len(e.Value), r.lim.MaxValueBytes)
		}
		fields[i] = Field{Key: e.Key, HasValue: !e.Clear}
		if !e.Clear {
			fields[i].Value = append([]byte{}, e.Value...)
		}
	}
	return r.local(ctx, id, base, fields, nil)
}

// Create makes a new service with a creator-bound id: the id is
// CreatedID(network, the replica's author, seq), where seq is the counter
// of the service's creation field, the first field signed for it. mk
// is given the id and returns the service's first fields (it may return
// none); it runs with the replica's write lock held and must not call
// the Replica. The creation field and the edits are committed together
// before Create returns; the returned fields (the creation field first)
// are ready to publish.
//
// The creation counter is the author counter, reserved durably in blocks
// before anything is signed with it, so a crash may skip a number but
// never reuses one, and a member re-added with a fresh store continues
// past its former entry (MergeFormer).
func (r *Replica) Create(ctx context.Context, mk func(id ServiceID) ([]Edit, error)) (ServiceID, []Field, error) {
	var id ServiceID
	out, err := r.local(ctx, ServiceID{}, NoRevision, nil, func(seq uint64) ([]Field, error) {
		id = CreatedID(r.net, r.self, seq)
		var edits []Edit
		if mk != nil {
			var err error
			if edits, err = mk(id); err != nil {
				return nil, err
			}
		}
		fields := []Field{{Key: CreationKey}}
		seen := map[string]bool{}
		for _, e := range edits {
			switch {
			case seen[e.Key]:
				return nil, fmt.Errorf("%w: key %q twice", ErrBadEdit, e.Key)
			case e.Key == "":
				return nil, ErrEmptyKey
			case e.Key[0] == 0, e.Key == CreationKey:
				return nil, fmt.Errorf("%w: %q", ErrReservedKey, e.Key)
			case len(e.Key) > r.lim.MaxKeyBytes:
				return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrKeyTooLong, len(e.Key), r.lim.MaxKeyBytes)
			case len(e.Value) > r.lim.MaxValueBytes:
				return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrValueTooLarge, len(e.Value), r.lim.MaxValueBytes)
			}
			seen[e.Key] = true
			f := Field{Key: e.Key, HasValue: !e.Clear}
			if !e.Clear {
				f.Value = append([]byte{}, e.Value...)
			}
			fields = append(fields, f)
		}
		return fields, nil
	})
	if err != nil {
		return ServiceID{}, nil, err
	}
	return id, out, nil
}

// Delete deletes a service with a permanent signed tombstone, dropping its
// fields; no replay of them can bring it back. The returned tombstone (and
// EncodedSnapshot) is ready to publish. A service not held fails with
// ErrUnknownService; a full tombstone history with ErrTombstoneLimit,
// leaving the service as it was. base is checked as by Edit.
func (r *Replica) Delete(ctx context.Context, id ServiceID, base Revision) (Field, error) {
	out, err := r.local(ctx, id, base, []Field{{Key: TombstoneKey}}, nil)
	if err != nil {
		return Field{}, err
	}
	return out[0], nil
}

// local signs fields for service id and merges them as a trusted group.
// With create set, the service is new: create is given the counter the
// first field will carry and returns the fields, and the id is the one
// the first field (the creation field) binds.
func (r *Replica) local(ctx context.Context, id ServiceID, base Revision, fields []Field, create func(seq uint64) ([]Field, error)) ([]Field, error) {
	if r.signer == nil {
		return nil, ErrNoSigner
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.RLock()
	closed := r.closed
	counter := r.used
	r.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if create != nil {
		if counter >= MaxClock {
			return nil, fmt.Errorf("%w: author %s has used its counters up to %d", ErrLamportRange, r.self, counter)
		}
		var err error
		if fields, err = create(counter + 1); err != nil {
			return nil, err
		}
		id = CreatedID(r.net, r.self, counter+1)
	}
	r.mu.RLock()
	s := r.services[id]
	r.mu.RUnlock()
	if create == nil && s == nil && r.cert != nil {
		return nil, fmt.Errorf("%w: a new service takes Create (a creator-bound id) once a compaction certificate is held", ErrCompaction)
	}
	if create != nil && s != nil {
		// Only a lost store could make the counter repeat; refuse rather
		// than sign it again.
		return nil, fmt.Errorf("%w: service %s exists", ErrStaleRevision, id)
	}
	cur := NoRevision
	if s != nil {
		cur = s.rev
		if s.tomb != nil {
			return nil, fmt.Errorf("%w: %s", ErrDeleted, id)
		}
	}
	if base != AnyRevision && base != cur {
		return nil, fmt.Errorf("%w: service %s is at %d, edit based on %d", ErrStaleRevision, id, cur, base)
	}
	if s == nil && fields[0].Key == TombstoneKey {
		return nil, fmt.Errorf("%w: %s", ErrUnknownService, id)
	}
	for i := range fields {
		var held uint64
		if s != nil {
			if e := s.lookup([]byte(fields[i].Key)); e != nil {
				held = e.f.Lamport
				if held >= MaxClock {
					return nil, fmt.Errorf("%w: key %q of service %s is held at the clock bound (signed by %s); delete the service to recover",
						ErrLamportRange, fields[i].Key, id, e.f.Author)
				}
			}
		}
		fields[i].Lamport = held + 1
	}
	if counter > MaxClock-uint64(len(fields)) {
		return nil, fmt.Errorf("%w: author %s has used its counters up to %d", ErrLamportRange, r.self, counter)
	}
	if err := r.reserveCounters(ctx, counter+uint64(len(fields))); err != nil {
		return nil, err
	}
	// From here on the counters are spent, whether or not the edit
	// commits: a signature made with them is never repeated.
	r.mu.Lock()
	r.used = counter + uint64(len(fields))
	r.mu.Unlock()
	g := group{id: id, trusted: true}
	for i := range fields {
		f := &fields[i]
		f.Network, f.Service = r.net, id
		f.Counter = counter + uint64(i) + 1
		Sign(r.signer, f)
		raw := f.Encode()
		p, _, err := parseField(raw, 0, &r.lim, false)
		if err != nil {
			return nil, fmt.Errorf("crdt: edit: %w", err)
		}
		g.ps = append(g.ps, p)
	}
	res, err := r.mergeLocked(ctx, []group{g})
	if err != nil {
		return nil, err
	}
	if !slices.Contains(res.Changed, id) {
		return nil, fmt.Errorf("crdt: edit of %s changed nothing", id)
	}
	return fields, nil
}

// counterBlock is how many counters one reservation sets aside, so that
// only about one edit in counterBlock fields pays for an extra sync.
const counterBlock = 1024

// reserveCounters makes sure that counters up to upto are durably
// reserved before anything is signed with them, committing a larger
// reservation when needed. After a crash the replica continues past the
// reservation, so no counter is ever used twice, even for a signature that
// never left the process. Called with writeMu held.
func (r *Replica) reserveCounters(ctx context.Context, upto uint64) error {
	if upto <= r.meta.counter[r.self] {
		return nil
	}
	m := r.meta
	m.counter = maps.Clone(r.meta.counter)
	if m.counter == nil {
		m.counter = map[AuthorID]uint64{}
	}
	m.counter[r.self] = min(upto+counterBlock, MaxClock)
	if err := r.commit(ctx, nil, nil, nil, &m); err != nil {
		return err
	}
	r.mu.Lock()
	r.meta = m
	r.mu.Unlock()
	return nil
}
