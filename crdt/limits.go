package crdt

import "fmt"

// Defaults of Limits. The first three are the spec's; the byte limits bound
// a single field and the control frame that carries a whole snapshot.
const (
	DefaultMaxServices         = 64
	DefaultMaxTombstones       = 1024
	DefaultMaxFieldsPerService = 192
	DefaultMaxKeyBytes         = 256
	DefaultMaxValueBytes       = 8 << 10
	DefaultMaxSnapshotBytes    = 64 << 10
)

// Limits bounds a replica's state. A zero field means its default. Every
// limit is enforced with its own error; nothing is evicted to make room.
type Limits struct {
	// MaxServices bounds active (not deleted) services (ErrServiceLimit).
	MaxServices int
	// MaxTombstones bounds deleted services' tombstones (ErrTombstoneLimit).
	MaxTombstones int
	// MaxFieldsPerService bounds the signed fields held for one active
	// service, counted after obsolete fields are dropped (ErrFieldLimit).
	MaxFieldsPerService int
	// MaxKeyBytes bounds a field key's length in bytes (ErrKeyTooLong).
	MaxKeyBytes int
	// MaxValueBytes bounds a field value's length in bytes (ErrValueTooLarge).
	MaxValueBytes int
	// MaxSnapshotBytes is the control frame limit: the largest encoded
	// snapshot accepted, exported or produced by an edit (ErrSnapshotTooLarge).
	MaxSnapshotBytes int
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
	} {
		if *p.v == 0 {
			*p.v = p.def
		}
		if *p.v < 0 {
			return l, fmt.Errorf("%w: Limits.%s is negative (%d)", ErrConfig, p.nm, *p.v)
		}
	}
	if l.MaxKeyBytes < len(TombstoneKey) {
		return l, fmt.Errorf("%w: Limits.MaxKeyBytes %d is below the tombstone key's %d", ErrConfig, l.MaxKeyBytes, len(TombstoneKey))
	}
	return l, nil
}
