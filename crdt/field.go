package crdt

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
)

// NetworkID names an overlay network. Fields and snapshots of one network
// are rejected by replicas of every other.
type NetworkID [16]byte

// ServiceID names one service (VIP). A service made by Replica.Create has
// a creator-bound id (CreatedID); ids made before creation fields existed
// are random (NewServiceID). Ids are never reused: recreating a deleted
// service takes a fresh id.
type ServiceID [16]byte

// AuthorID is an author's Ed25519 public key: the 32 bytes of an
// ed25519.PublicKey.
type AuthorID [32]byte

// String returns the id in hex.
func (id NetworkID) String() string { return hex.EncodeToString(id[:]) }

// String returns the id in hex.
func (id ServiceID) String() string { return hex.EncodeToString(id[:]) }

// String returns the key in hex.
func (id AuthorID) String() string { return hex.EncodeToString(id[:]) }

// NewServiceID returns a fresh random service id read from r, or from
// crypto/rand when r is nil.
func NewServiceID(r io.Reader) (ServiceID, error) {
	var id ServiceID
	if r == nil {
		r = rand.Reader
	}
	if _, err := io.ReadFull(r, id[:]); err != nil {
		return id, fmt.Errorf("crdt: service id: %w", err)
	}
	return id, nil
}

const (
	// Domain is the signing domain: an Ed25519 signature of a field is
	// over Domain followed by the field's encoding with an empty signature.
	Domain = "tsunagi-vip-field/v1\x00"

	// TombstoneKey is the reserved key of a service's tombstone: a signed
	// field without a value that deletes the service permanently. Keys
	// starting with 0x00 are reserved for crdt; the schema uses others.
	TombstoneKey = "\x00deleted"

	// MaxClock is the largest Lamport clock and author counter a field may
	// carry. Larger values are rejected (ErrLamportRange) so that no member
	// can exhaust the clock for everyone else.
	MaxClock uint64 = 1<<63 - 1

	// SignatureSize is the length of a field's signature.
	SignatureSize = 64

	// CreationKey is the key of a service's creation field: a field
	// without a value, signed by the service's creator, whose author and
	// counter determine the service id (CreatedID). It never changes. The
	// key lies under the vip schema's "L/" prefix with a shape no
	// listener key has, so that agents without creation fields refuse
	// the field alone and keep the rest of the service (docs/wire.md).
	CreationKey = "L/created"

	// CreationDomain is the domain of a creator-bound service id.
	CreationDomain = "vipkit-service-id/v1\x00"
)

// CreatedID returns the id of the service that creator creates with its
// counter seq on network net: the first 16 bytes of SHA-256(CreationDomain
// ‖ net ‖ creator ‖ seq as 8 bytes big endian). Only creator can sign the
// creation field that binds the id, and it never signs two fields with one
// counter, so the services of one creator are numbered by their counters.
func CreatedID(net NetworkID, creator AuthorID, seq uint64) ServiceID {
	h := sha256.New()
	h.Write([]byte(CreationDomain))
	h.Write(net[:])
	h.Write(creator[:])
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	h.Write(b[:])
	var sum [sha256.Size]byte
	var id ServiceID
	copy(id[:], h.Sum(sum[:0]))
	return id
}

// IsCreation reports whether f is a service's creation field.
func (f *Field) IsCreation() bool { return f.Key == CreationKey }

// Field is one signed register: the value of one key of one service, as
// written by one author. Its wire encoding is documented in the package
// doc; Encode and DecodeField implement it.
//
// A Field is a value; the slices it holds are not shared with the
// replica that returned it or the buffer it was decoded from.
type Field struct {
	Network NetworkID
	Service ServiceID
	// Key names the register within the service (the schema's field key).
	// It is a byte string (not necessarily UTF-8), 1..Limits.MaxKeyBytes
	// long, and must not start with 0x00 unless it is TombstoneKey.
	Key string
	// HasValue reports whether the register holds a value; a field without
	// one clears the register (it still wins the merge like any other).
	HasValue bool
	// Value is the schema's encoded value; meaningful only when HasValue.
	Value []byte
	// Lamport is the field's Lamport clock: above every clock its author
	// had seen when signing.
	Lamport uint64
	// Author is the signer's public key.
	Author AuthorID
	// Counter is the author's durable counter: strictly increasing over
	// every field the author signs, across restarts.
	Counter uint64
	// Signature is the Ed25519 signature (64 bytes); empty when unsigned.
	Signature []byte
}

// IsTombstone reports whether f is a service's tombstone.
func (f *Field) IsTombstone() bool { return f.Key == TombstoneKey }

// Equal reports whether f and g are the same field (same encoding).
func (f *Field) Equal(g *Field) bool {
	return f.Network == g.Network && f.Service == g.Service && f.Key == g.Key &&
		f.HasValue == g.HasValue && (!f.HasValue || bytes.Equal(f.Value, g.Value)) &&
		f.Lamport == g.Lamport && f.Author == g.Author && f.Counter == g.Counter &&
		bytes.Equal(f.Signature, g.Signature)
}

// String describes the field for errors and logs (not the encoding).
func (f *Field) String() string {
	return fmt.Sprintf("field{service %s key %q lamport %d author %s counter %d}",
		f.Service, f.Key, f.Lamport, f.Author.String()[:16], f.Counter)
}

// Compare orders two fields of the same register by the merge order: by
// Lamport clock, then author id, then canonical (encoded) bytes. The
// greater field wins the register. It returns -1, 0 or +1. A replica with
// a schema rank (Config.Rank) compares the ranks first and uses this
// order between fields of equal rank.
func Compare(a, b *Field) int {
	if c := compareStamp(a, b); c != 0 {
		return c
	}
	return bytes.Compare(a.Encode(), b.Encode())
}

// compareRaw is Compare with both encodings at hand.
func compareRaw(a *Field, araw []byte, b *Field, braw []byte) int {
	if c := compareStamp(a, b); c != 0 {
		return c
	}
	return bytes.Compare(araw, braw)
}

// compareStamp is the first two keys of Compare: the Lamport time, then
// the author.
func compareStamp(a, b *Field) int {
	if c := cmp.Compare(a.Lamport, b.Lamport); c != 0 {
		return c
	}
	return bytes.Compare(a.Author[:], b.Author[:])
}

// FieldError names a field that was refused and why. Err wraps one of the
// package's sentinel errors; match it with errors.Is.
type FieldError struct {
	Service ServiceID
	Key     string
	Author  AuthorID
	Counter uint64
	Err     error
}

// Error describes the field and the reason.
func (e *FieldError) Error() string {
	return fmt.Sprintf("service %s key %q (author %s counter %d): %v",
		e.Service, e.Key, e.Author.String()[:16], e.Counter, e.Err)
}

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(f *Field, err error) *FieldError {
	return &FieldError{Service: f.Service, Key: f.Key, Author: f.Author, Counter: f.Counter, Err: err}
}
