package crdt

import (
	"errors"
	"fmt"

	"github.com/vipkit/vipkit/transport"
)

// Decoding errors. Each is returned (wrapped, with the offset or length at
// fault) by DecodeField, DecodeSnapshot and the stores' record decoders, and
// by every Merge method given encoded input; the replica is left unchanged.
var (
	// ErrTruncated means the input ended inside a value.
	ErrTruncated = errors.New("crdt: truncated encoding")
	// ErrTrailingBytes means bytes remain after a complete value.
	ErrTrailingBytes = errors.New("crdt: trailing bytes after encoding")
	// ErrVarint means a varint is overlong (not minimal), longer than its type
	// allows, or overflows its type.
	ErrVarint = errors.New("crdt: non-canonical or overflowing varint")
	// ErrBadOption means an option tag is neither 0 nor 1.
	ErrBadOption = errors.New("crdt: option tag is not 0 or 1")
	// ErrKeyTooLong means a field key is longer than Limits.MaxKeyBytes.
	ErrKeyTooLong = errors.New("crdt: field key too long")
	// ErrEmptyKey means a field key is empty.
	ErrEmptyKey = errors.New("crdt: empty field key")
	// ErrValueTooLarge means a field value is longer than Limits.MaxValueBytes.
	ErrValueTooLarge = errors.New("crdt: field value too large")
	// ErrSignatureLength means the signature vector is neither 64 bytes (a
	// signed field) nor, where DecodeUnsigned allows it, empty.
	ErrSignatureLength = errors.New("crdt: signature is not 64 bytes")
	// ErrUnknownVersion means a snapshot or stored record carries a format
	// version this package does not know.
	ErrUnknownVersion = errors.New("crdt: unknown format version")
	// ErrMixedSnapshot means a snapshot holds a field of another service or
	// network than its header names.
	ErrMixedSnapshot = errors.New("crdt: snapshot field does not match snapshot header")
	// ErrSnapshotTooLarge means an encoded snapshot is larger than
	// Limits.MaxSnapshotBytes (the control frame limit), on receipt or
	// because a local edit or merge would make it so.
	ErrSnapshotTooLarge = errors.New("crdt: snapshot exceeds control frame limit")
	// ErrTooManyFields means a snapshot claims more fields than a service may
	// hold.
	ErrTooManyFields = errors.New("crdt: snapshot holds too many fields")
)

// Verification errors: a field that fails one of these is not stored.
var (
	// ErrWrongNetwork means the field (or snapshot, or store) belongs to
	// another network than the replica's.
	ErrWrongNetwork = errors.New("crdt: field of another network")
	// ErrWrongDomain means the signature is valid, but over another signing
	// domain than "tsunagi-vip-field/v1\x00" (no domain, the domain without
	// its NUL, or another version of the field domain).
	ErrWrongDomain = errors.New("crdt: signature made under the wrong domain")
	// ErrBadSignature means the signature does not verify (ZIP-215 rules): a
	// byte of the field was changed, or the signature is not the author's.
	ErrBadSignature = errors.New("crdt: bad signature")
	// ErrNotMember means the author is not (or not yet) one of the network's
	// member keys. The field is not stored; a later snapshot brings it again.
	ErrNotMember = errors.New("crdt: author is not a member")
	// ErrFormerMember means the author is not a member but a former one
	// (Replica.Former), and the field's counter is past (or, at 0, below)
	// what its former entry covers: a signature made after it left. The
	// field is not stored; a snapshot that brings it again is accepted
	// once a higher last counter for the author arrives (MergeFormer) or
	// it becomes a member again.
	ErrFormerMember = errors.New("crdt: former member's field past its last counter")
	// ErrReservedKey means a key starts with 0x00 (reserved for crdt's own
	// registers, such as the tombstone) but is not one of them.
	ErrReservedKey = errors.New("crdt: reserved field key")
	// ErrBadTombstone means a tombstone field carries a value.
	ErrBadTombstone = errors.New("crdt: tombstone with a value")
	// ErrBadCreation means a creation field (CreationKey) carries a value,
	// or its author and counter do not give its service id (CreatedID).
	// The field alone is refused; the rest of its snapshot merges.
	ErrBadCreation = errors.New("crdt: creation field does not bind its service id")
	// ErrLamportRange means a Lamport clock or author counter is above
	// MaxClock, which would leave no room for later edits.
	ErrLamportRange = errors.New("crdt: clock or counter out of range")
)

// Limit and state errors.
var (
	// ErrFieldLimit means the merged service would hold more than
	// Limits.MaxFieldsPerService fields after obsolete ones were dropped. The
	// merge of that service is refused and the service's error state is set.
	ErrFieldLimit = errors.New("crdt: too many fields in service")
	// ErrServiceLimit means a new service would exceed Limits.MaxServices
	// active services.
	ErrServiceLimit = errors.New("crdt: too many active services")
	// ErrTombstoneLimit means a new tombstone would exceed
	// Limits.MaxTombstones. Tombstones are never evicted; the deletion is
	// refused.
	ErrTombstoneLimit = errors.New("crdt: tombstone history full")
	// ErrDeleted means an edit names a service that has been deleted. Recreate
	// the service under a fresh id (NewServiceID).
	ErrDeleted = errors.New("crdt: service deleted")
	// ErrStaleRevision means an edit was based on a revision of the service
	// that is no longer current.
	ErrStaleRevision = errors.New("crdt: stale revision")
	// ErrUnknownService means Delete names a service the replica does not hold.
	ErrUnknownService = errors.New("crdt: unknown service")
	// ErrBadEdit means an edit is empty or names a key twice.
	ErrBadEdit = errors.New("crdt: invalid edit")
	// ErrNoSigner means an edit was asked of a replica without a signing key.
	ErrNoSigner = errors.New("crdt: replica has no signing key")
	// ErrCorrupt means a stored record fails its checksum or does not decode.
	// Opening fails; the store is never reset.
	ErrCorrupt = errors.New("crdt: corrupt store")
	// ErrClosed means the replica or store has been closed. It matches
	// transport.ErrClosed (and so net.ErrClosed).
	ErrClosed = fmt.Errorf("crdt: closed: %w", transport.ErrClosed)
	// ErrInvalidOptions means Open was given a Config it cannot use (a
	// signer key of the wrong size, a limit below its floor).
	ErrInvalidOptions = errors.New("crdt: invalid options")
	// ErrConfig is another name for ErrInvalidOptions: the same error
	// value, so errors.Is matches either.
	//
	// Deprecated: use ErrInvalidOptions.
	ErrConfig = ErrInvalidOptions
)

// ErrInvalidField means the schema (Config.Check) refused a field's key or
// value. The error wraps the schema's own error too.
var ErrInvalidField = errors.New("crdt: field refused by the schema")

// Refusals counts fields refused by merges, by reason. Every refusal is
// also returned as an error by the merge that met it; the counts let a
// status page show what members keep sending.
type Refusals struct {
	// Encoding counts snapshots and fields that did not decode.
	Encoding uint64
	// WrongNetwork counts fields of another network (ErrWrongNetwork).
	WrongNetwork uint64
	// ReservedKey counts reserved keys and tombstones with a value
	// (ErrReservedKey, ErrBadTombstone).
	ReservedKey uint64
	// ClockRange counts clocks or counters above MaxClock (ErrLamportRange).
	ClockRange uint64
	// NotMember counts fields of authors that are not members (ErrNotMember).
	NotMember uint64
	// Former counts fields of former members past their last counter
	// (ErrFormerMember), and former-member entries above MaxClock refused
	// by MergeFormer.
	Former uint64
	// Signature counts bad or wrong-domain signatures (ErrBadSignature,
	// ErrWrongDomain).
	Signature uint64
	// Schema counts fields the schema refused (ErrInvalidField).
	Schema uint64
	// Limit counts valid fields of services refused by a limit.
	Limit uint64
	// Creation counts creation fields that do not bind their service id
	// (ErrBadCreation).
	Creation uint64
	// Deleted counts fields of services that a compaction certificate
	// says are deleted (ErrDeleted): replays of compacted services and
	// fresh fields signed for their ids.
	Deleted uint64
}

// Total returns the sum of the counts.
func (c Refusals) Total() uint64 {
	return c.Encoding + c.WrongNetwork + c.ReservedKey + c.ClockRange + c.NotMember + c.Former + c.Signature + c.Schema + c.Limit + c.Creation + c.Deleted
}

func (c *Refusals) add(d Refusals) {
	c.Encoding += d.Encoding
	c.WrongNetwork += d.WrongNetwork
	c.ReservedKey += d.ReservedKey
	c.ClockRange += d.ClockRange
	c.NotMember += d.NotMember
	c.Former += d.Former
	c.Signature += d.Signature
	c.Schema += d.Schema
	c.Limit += d.Limit
	c.Creation += d.Creation
	c.Deleted += d.Deleted
}

// count adds one refusal for err.
func (c *Refusals) count(err error) {
	switch {
	case errors.Is(err, ErrWrongNetwork):
		c.WrongNetwork++
	case errors.Is(err, ErrReservedKey), errors.Is(err, ErrBadTombstone):
		c.ReservedKey++
	case errors.Is(err, ErrLamportRange):
		c.ClockRange++
	case errors.Is(err, ErrNotMember):
		c.NotMember++
	case errors.Is(err, ErrFormerMember):
		c.Former++
	case errors.Is(err, ErrBadSignature), errors.Is(err, ErrWrongDomain):
		c.Signature++
	case errors.Is(err, ErrInvalidField):
		c.Schema++
	case errors.Is(err, ErrBadCreation):
		c.Creation++
	case errors.Is(err, ErrDeleted):
		c.Deleted++
	default:
		c.Encoding++
	}
}
