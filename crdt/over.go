package crdt

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// OverLimit describes the state a replica holds beyond its limits. It is
// computed from the held fields alone, so every replica that holds the
// same fields reports the same (Dropped aside, which counts this
// replica's own history).
type OverLimit struct {
	// Services lists the active services beyond MaxServices in id order:
	// held and published, but not to be routed. Their ServiceInfo.Err
	// wraps ErrServiceLimit.
	Services []ServiceID
	// Fields lists the services holding more than MaxFieldsPerService
	// fields. Their ServiceInfo.Err wraps ErrFieldLimit.
	Fields []ServiceID
	// Tombstones is the number of tombstones held. At MaxTombstones or
	// more the deletion history is full: Err wraps ErrTombstoneLimit and
	// local deletions fail.
	Tombstones int
	// Authors counts, per author, the fields of the services in Services
	// and Fields and, when the history is full, the tombstones: who filled
	// the limits.
	Authors map[AuthorID]int
	// Dropped counts the services this replica did not hold past
	// MaxHeldServices since Open.
	Dropped uint64
	// FormerDropped counts the former-member entries this replica did not
	// keep past Limits.MaxFormerMembers since Open (see MergeFormer).
	FormerDropped uint64
	// Err joins one error per exceeded limit, naming the authors; nil
	// when every limit holds.
	Err error
}

// OverLimit reports the state held beyond the limits.
func (r *Replica) OverLimit() OverLimit {
	r.mu.RLock()
	defer r.mu.RUnlock()
	o := r.over
	o.Services = slices.Clone(o.Services)
	o.Fields = slices.Clone(o.Fields)
	o.Authors = make(map[AuthorID]int, len(r.over.Authors))
	for a, n := range r.over.Authors {
		o.Authors[a] = n
	}
	o.Dropped = r.dropped
	o.FormerDropped = r.formerDropped
	return o
}

// refreshOver recomputes the over-limit state: the services beyond
// MaxServices in id order, those beyond MaxFieldsPerService, and a full
// tombstone history.
//
// +checklocks:r.mu
func (r *Replica) refreshOver() {
	var o OverLimit
	var ids []ServiceID
	for id, s := range r.services {
		if s.tomb == nil {
			ids = append(ids, id)
		} else {
			o.Tombstones++
		}
	}
	slices.SortFunc(ids, func(a, b ServiceID) int { return bytes.Compare(a[:], b[:]) })
	var errs []error
	for i, id := range ids {
		s := r.services[id]
		s.overErr = nil
		var serr []error
		if i >= r.lim.MaxServices {
			o.Services = append(o.Services, id)
			serr = append(serr, fmt.Errorf("%w: service %s is number %d in id order of %d active services, limit %d: held, not routed (fields by %s)",
				ErrServiceLimit, id, i+1, len(ids), r.lim.MaxServices, authorsOf(s, &o)))
		}
		if len(s.fields) > r.lim.MaxFieldsPerService {
			o.Fields = append(o.Fields, id)
			serr = append(serr, fmt.Errorf("%w: service %s holds %d fields, limit %d: not routed (fields by %s)",
				ErrFieldLimit, id, len(s.fields), r.lim.MaxFieldsPerService, authorsOf(s, &o)))
		}
		if len(serr) > 0 {
			s.overErr = errors.Join(serr...)
			errs = append(errs, serr...)
		}
	}
	if o.Tombstones >= r.lim.MaxTombstones {
		by := map[AuthorID]int{}
		for _, s := range r.services {
			if s.tomb != nil {
				by[s.tomb.f.Author]++
			}
		}
		if o.Authors == nil {
			o.Authors = map[AuthorID]int{}
		}
		for a, n := range by {
			o.Authors[a] += n
		}
		errs = append(errs, fmt.Errorf("%w: %d tombstones held, limit %d (by %s)%s", ErrTombstoneLimit, o.Tombstones, r.lim.MaxTombstones, topAuthors(by), r.waitingNote()))
	}
	o.Err = errors.Join(errs...)
	r.over = o
}

// authorsOf names the authors of s's fields and counts them into o.
func authorsOf(s *service, o *OverLimit) string {
	by := map[AuthorID]int{}
	for _, e := range s.fields {
		by[e.f.Author]++
	}
	if o.Authors == nil {
		o.Authors = map[AuthorID]int{}
	}
	for a, n := range by {
		o.Authors[a] += n
	}
	return topAuthors(by)
}

// topAuthors lists up to four authors by count, most first.
func topAuthors(by map[AuthorID]int) string {
	type an struct {
		a AuthorID
		n int
	}
	var l []an
	for a, n := range by {
		l = append(l, an{a, n})
	}
	slices.SortFunc(l, func(x, y an) int {
		if c := cmp.Compare(y.n, x.n); c != 0 {
			return c
		}
		return bytes.Compare(x.a[:], y.a[:])
	})
	var parts []string
	for i, x := range l {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("and %d more", len(l)-4))
			break
		}
		parts = append(parts, fmt.Sprintf("%s: %d", x.a.String()[:16], x.n))
	}
	return strings.Join(parts, ", ")
}
