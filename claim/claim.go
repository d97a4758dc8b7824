package claim

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Claim is a holder's signed statement that it carries a VIP at an epoch.
// Claims are ordered by Newer: a higher epoch wins, and equal epochs go to
// the lower public key. A Claim is immutable once signed or parsed and is
// safe for concurrent reads.
type Claim struct {
	Mesh      string     // the mesh the claim is for
	VIP       netip.Addr // the service VIP, an IPv6 /128
	Holder    netip.Addr // the holder's own overlay address
	HolderKey PublicKey  // the holder's Ed25519 key
	Epoch     uint64     // only grows; ≥ 1
	Pair      *PairRecord

	sig [ed25519.SignatureSize]byte
	raw []byte // canonical encoding, signature included
}

// NewClaim builds and signs a claim for the holder whose private key is k.
// The pair record must already be complete (see PairRecord.Complete); the
// claim is checked for the pair's VIP and membership so that a node never
// signs a claim others would refuse.
func NewClaim(k ed25519.PrivateKey, holder netip.Addr, epoch uint64, pair *PairRecord) (*Claim, error) {
	if pair == nil {
		return nil, fmt.Errorf("%w: no pair record", ErrPairMismatch)
	}
	c := &Claim{Mesh: pair.Mesh, VIP: pair.VIP, Holder: holder, HolderKey: KeyOf(k), Epoch: epoch, Pair: pair}
	if !validAddr(holder) || epoch == 0 {
		return nil, fmt.Errorf("%w: holder %v epoch %d", ErrMalformed, holder, epoch)
	}
	if !pair.HasMember(holder, c.HolderKey) {
		return nil, fmt.Errorf("%w: %v is not a member", ErrPairMismatch, holder)
	}
	body, err := c.appendBody(nil)
	if err != nil {
		return nil, err
	}
	copy(c.sig[:], sign(k, ClaimLabel, body))
	c.raw = append(body, c.sig[:]...)
	return c, nil
}

func (c *Claim) appendBody(b []byte) ([]byte, error) {
	pr, err := c.Pair.Encode()
	if err != nil {
		return nil, err
	}
	if !validMesh(c.Mesh) || !validAddr(c.VIP) {
		return nil, ErrMalformed
	}
	b = appendHeader(b, kindClaim, c.Mesh, c.VIP)
	b = appendAddr(b, c.Holder)
	b = append(b, c.HolderKey[:]...)
	b = binary.BigEndian.AppendUint64(b, c.Epoch)
	b = binary.BigEndian.AppendUint16(b, uint16(len(pr)))
	return append(b, pr...), nil
}

// Encode returns the claim's canonical encoding. The slice is shared: do not
// modify it.
func (c *Claim) Encode() []byte { return c.raw }

// ParseClaim decodes a canonical claim and checks its signature under the key
// it names, and its pair record's encoding. The pair record's own
// signatures, the trust store and the held state are Policy's business
// (Policy.Accept and Verify check them, caching the pair record they have
// verified): never act on a claim that only went through ParseClaim.
// Errors: ErrTooLarge, ErrVersion, ErrMalformed, ErrBadSignature.
func ParseClaim(b []byte) (*Claim, error) {
	c, body, err := decodeClaim(b)
	if err != nil {
		return nil, err
	}
	if !c.HolderKey.verify(ClaimLabel, body, c.sig[:]) {
		return nil, ErrBadSignature
	}
	return c, nil
}

func decodeClaim(b []byte) (*Claim, []byte, error) {
	r := reader{b: b}
	mesh, vip, err := r.header(kindClaim)
	if err != nil {
		return nil, nil, err
	}
	c := &Claim{Mesh: mesh, VIP: vip}
	c.Holder = r.addr()
	c.HolderKey = r.key()
	c.Epoch = r.u64()
	pr := r.take(r.u16())
	bodyLen := r.off
	sig := r.take(ed25519.SignatureSize)
	if r.bad || r.off != len(b) || c.Epoch == 0 {
		return nil, nil, ErrMalformed
	}
	if c.Pair, err = decodePairRecord(pr); err != nil {
		return nil, nil, err
	}
	copy(c.sig[:], sig)
	c.raw = bytes.Clone(b)
	return c, c.raw[:bodyLen], nil
}

// Newer reports whether c wins over o: a higher epoch, or an equal epoch and
// a lower holder key. Any claim is newer than nil; a claim is not newer than
// itself.
func (c *Claim) Newer(o *Claim) bool {
	if o == nil {
		return true
	}
	if c.Epoch != o.Epoch {
		return c.Epoch > o.Epoch
	}
	return bytes.Compare(c.HolderKey[:], o.HolderKey[:]) < 0
}

// Equal reports whether c and o are the same signed claim.
func (c *Claim) Equal(o *Claim) bool {
	if c == nil || o == nil {
		return c == o
	}
	return bytes.Equal(c.raw, o.raw)
}

// String formats the claim for logs.
func (c *Claim) String() string {
	if c == nil {
		return "<no claim>"
	}
	return fmt.Sprintf("claim{%s %v epoch=%d holder=%v}", c.Mesh, c.VIP, c.Epoch, c.Holder)
}

// Release asks the holder of a VIP to release it for a next epoch. It is
// signed by the requester, which must be the other member of the pair.
type Release struct {
	Mesh      string
	VIP       netip.Addr
	From      netip.Addr // the requester's overlay address
	FromKey   PublicKey
	NextEpoch uint64 // the epoch the requester will claim

	raw []byte
}

// NewRelease builds and signs a release request.
func NewRelease(k ed25519.PrivateKey, mesh string, vip, from netip.Addr, next uint64) (*Release, error) {
	if !validMesh(mesh) || !validAddr(vip) || !validAddr(from) || next == 0 {
		return nil, ErrMalformed
	}
	r := &Release{Mesh: mesh, VIP: vip, From: from, FromKey: KeyOf(k), NextEpoch: next}
	b := appendHeader(nil, kindRelease, mesh, vip)
	b = appendAddr(b, from)
	b = append(b, r.FromKey[:]...)
	b = binary.BigEndian.AppendUint64(b, next)
	r.raw = append(b, sign(k, ReleaseLabel, b)...)
	return r, nil
}

// Encode returns the release's canonical encoding (shared; do not modify).
func (r *Release) Encode() []byte { return r.raw }

// ParseRelease decodes a release and checks its signature under the key it
// names. Errors: ErrTooLarge, ErrVersion, ErrMalformed, ErrBadSignature.
func ParseRelease(b []byte) (*Release, error) {
	rd := reader{b: b}
	mesh, vip, err := rd.header(kindRelease)
	if err != nil {
		return nil, err
	}
	r := &Release{Mesh: mesh, VIP: vip}
	r.From = rd.addr()
	r.FromKey = rd.key()
	r.NextEpoch = rd.u64()
	body := rd.off
	sig := rd.take(ed25519.SignatureSize)
	if rd.bad || rd.off != len(b) || r.NextEpoch == 0 {
		return nil, ErrMalformed
	}
	if !r.FromKey.verify(ReleaseLabel, b[:body], sig) {
		return nil, ErrBadSignature
	}
	r.raw = bytes.Clone(b)
	return r, nil
}
