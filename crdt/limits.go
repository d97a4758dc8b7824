package crdt

import "fmt"

// Defaults of Limits (docs/defaults.md gives their reasons). The first
// three are the configuration's limits; the byte limits bound a single
// field and the control frame that carries a whole snapshot.
const (
	DefaultMaxServices         = 64
	DefaultMaxTombstones       = 1024
	DefaultMaxFieldsPerService = 192
	DefaultMaxKeyBytes         = 256
	DefaultMaxValueBytes       = 8 << 10
	DefaultMaxSnapshotBytes    = 64 << 10
	// DefaultMaxFormerMembers bounds the former-member list. Each entry
	// is a key and a last counter (at most 42 bytes on the wire and in the
	// meta record), so 1024 entries are at most 43 KiB: the whole list fits
	// one control frame at the default frame limit, and the meta record
	// that is rewritten on every commit stays small. A network keeps one
	// entry per member that ever left; 1024 departures is far more than a
	// mesh of a few hundred nodes sees, while a member that vouches for
	// made-up entries cannot grow every replica's state without bound.
	DefaultMaxFormerMembers = 1024
)

// Limits bounds a replica's state. A zero field means its default. Every
// limit is enforced with its own error and reported, never silently.
//
// The first three are the configuration's limits: a local edit that would
// exceed one is refused. What merges bring beyond them is held up to the
// hard caps (the MaxHeld fields, twice the limits by default) and
// reported, so that every replica that has seen the same fields holds
// and routes the same state whatever the arrival order (see the package
// doc, Limits).
type Limits struct {
	// MaxServices bounds the active (not deleted) services routed: the
	// first MaxServices in id order. An edit creating one more fails with
	// ErrServiceLimit; merged ones beyond it are held and reported with
	// ErrServiceLimit (ServiceInfo.Err, OverLimit).
	MaxServices int
	// MaxTombstones bounds the deletion history. A local Delete beyond it
	// fails with ErrTombstoneLimit; merged tombstones beyond it are held
	// and the history is reported full (OverLimit.Err).
	MaxTombstones int
	// MaxFieldsPerService bounds the signed fields of one active service,
	// counted after obsolete fields are dropped. An edit that would add a
	// field beyond it fails with ErrFieldLimit; a merged service beyond it
	// is held and reported with ErrFieldLimit (ServiceInfo.Err).
	MaxFieldsPerService int
	// MaxHeldServices is the hard cap of active services held. Past it
	// the services of the highest ids are not held (refused, or dropped
	// to make room for a lower id), counted in OverLimit.Dropped: the
	// held set is the lowest ids whatever the arrival order. Zero means
	// twice MaxServices.
	MaxHeldServices int
	// MaxHeldTombstones is the hard cap of tombstones held; a merged
	// tombstone past it is refused with ErrTombstoneLimit (tombstones are
	// never dropped). Zero means twice MaxTombstones.
	MaxHeldTombstones int
	// MaxHeldFields is the hard cap of fields of one service; a merge past
	// it (or past MaxSnapshotBytes) is refused with ErrFieldLimit. Zero
	// means twice MaxFieldsPerService.
	MaxHeldFields int
	// MaxKeyBytes bounds a field key's length in bytes (ErrKeyTooLong).
	MaxKeyBytes int
	// MaxValueBytes bounds a field value's length in bytes (ErrValueTooLarge).
	MaxValueBytes int
	// MaxSnapshotBytes is the control frame limit: the largest encoded
	// snapshot accepted, exported or produced by an edit (ErrSnapshotTooLarge).
	MaxSnapshotBytes int
	// MaxFormerMembers is the hard cap of the former-member list
	// (Replica.Former). Past it the entries of the lowest author ids are
	// kept, so that every replica keeps the same list whatever the order
	// entries came in; the others are dropped and counted
	// (OverLimit.FormerDropped). A field of a dropped former member is
	// refused like a non-member's. Zero means DefaultMaxFormerMembers.
	MaxFormerMembers int
}

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{
		MaxServices:         DefaultMaxServices,
		MaxTombstones:       DefaultMaxTombstones,
		MaxFieldsPerService: DefaultMaxFieldsPerService,
		MaxKeyBytes:         DefaultMaxKeyBytes,
		MaxValueBytes:       DefaultMaxValueBytes,
		MaxSnapshotBytes:    DefaultMaxSnapshotBytes,
		MaxFormerMembers:    DefaultMaxFormerMembers,
	}
}

// withDefaults fills zero fields and validates the result.
func (l Limits) withDefaults() (Limits, error) {
	d := DefaultLimits()
	for _, p := range []struct {
		v   *int
		def int
		nm  string
	}{
		{&l.MaxServices, d.MaxServices, "MaxServices"},
		{&l.MaxTombstones, d.MaxTombstones, "MaxTombstones"},
		{&l.MaxFieldsPerService, d.MaxFieldsPerService, "MaxFieldsPerService"},
		{&l.MaxKeyBytes, d.MaxKeyBytes, "MaxKeyBytes"},
		{&l.MaxValueBytes, d.MaxValueBytes, "MaxValueBytes"},
		{&l.MaxSnapshotBytes, d.MaxSnapshotBytes, "MaxSnapshotBytes"},
		{&l.MaxFormerMembers, d.MaxFormerMembers, "MaxFormerMembers"},
	} {
		if *p.v == 0 {
			*p.v = p.def
		}
		if *p.v < 0 {
			return l, fmt.Errorf("%w: Limits.%s is negative (%d)", ErrInvalidOptions, p.nm, *p.v)
		}
	}
	for _, p := range []struct {
		v    *int
		base int
		nm   string
	}{
		{&l.MaxHeldServices, l.MaxServices, "MaxHeldServices"},
		{&l.MaxHeldTombstones, l.MaxTombstones, "MaxHeldTombstones"},
		{&l.MaxHeldFields, l.MaxFieldsPerService, "MaxHeldFields"},
	} {
		if *p.v == 0 {
			*p.v = 2 * p.base
		}
		if *p.v < p.base {
			return l, fmt.Errorf("%w: Limits.%s %d is below its limit %d", ErrInvalidOptions, p.nm, *p.v, p.base)
		}
	}
	if l.MaxKeyBytes < len(TombstoneKey) {
		return l, fmt.Errorf("%w: Limits.MaxKeyBytes %d is below the tombstone key's %d", ErrInvalidOptions, l.MaxKeyBytes, len(TombstoneKey))
	}
	return l, nil
}
