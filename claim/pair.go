package claim

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"net/netip"
	"slices"
)

// Member is one node of a pair: its overlay address and its Ed25519 key.
type Member struct {
	Addr netip.Addr
	Key  PublicKey
}

// PairSig is one signature on a pair record.
type PairSig struct {
	Signer PublicKey
	Sig    [ed25519.SignatureSize]byte
}

// PairRecord binds a VIP to the two members that may hold it. It is signed
// by both members, or by a trust root in place of a member. Members are kept
// in canonical order (lower key first). A PairRecord is not safe for
// concurrent mutation; once complete it is only read.
type PairRecord struct {
	Mesh    string
	VIP     netip.Addr
	Members [2]Member
	Sigs    []PairSig
}

// NewPairRecord returns an unsigned record for vip and the members a and b,
// sorted into canonical order. Errors: ErrMalformed, ErrVIPIsMember,
// ErrVIPOutsideRegion (the VIP must lie in the /112 of both members'
// addresses).
func NewPairRecord(mesh string, vip netip.Addr, a, b Member) (*PairRecord, error) {
	p := &PairRecord{Mesh: mesh, VIP: vip, Members: [2]Member{a, b}}
	if bytes.Compare(a.Key[:], b.Key[:]) > 0 {
		p.Members = [2]Member{b, a}
	}
	if err := p.checkShape(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *PairRecord) checkShape() error {
	if !validMesh(p.Mesh) || !validAddr(p.VIP) {
		return ErrMalformed
	}
	m0, m1 := p.Members[0], p.Members[1]
	if !validAddr(m0.Addr) || !validAddr(m1.Addr) || m0.Addr == m1.Addr || bytes.Compare(m0.Key[:], m1.Key[:]) >= 0 {
		return fmt.Errorf("%w: members must be two distinct nodes in key order", ErrMalformed)
	}
	for _, m := range p.Members {
		if p.VIP == m.Addr {
			return fmt.Errorf("%w: %v", ErrVIPIsMember, p.VIP)
		}
		if !Region(m.Addr).Contains(p.VIP) {
			return fmt.Errorf("%w: %v not in %v", ErrVIPOutsideRegion, p.VIP, Region(m.Addr))
		}
	}
	return nil
}

// Region returns the /112 that holds addr: the region a VIP held by addr
// must lie in.
func Region(addr netip.Addr) netip.Prefix {
	p, _ := addr.Prefix(112)
	return p
}

func (p *PairRecord) body() []byte {
	b := appendHeader(make([]byte, 0, 128), kindPair, p.Mesh, p.VIP)
	for _, m := range p.Members {
		b = appendAddr(b, m.Addr)
		b = append(b, m.Key[:]...)
	}
	return b
}

// Sign adds the signature of k, a member's or a trust root's key. Signing
// twice with one key replaces the signature.
func (p *PairRecord) Sign(k ed25519.PrivateKey) error {
	if err := p.checkShape(); err != nil {
		return err
	}
	s := PairSig{Signer: KeyOf(k)}
	copy(s.Sig[:], sign(k, PairLabel, p.body()))
	p.Sigs = slices.DeleteFunc(p.Sigs, func(o PairSig) bool { return o.Signer == s.Signer })
	if len(p.Sigs) >= MaxPairSigs {
		return fmt.Errorf("%w: more than %d signatures", ErrTooLarge, MaxPairSigs)
	}
	p.Sigs = append(p.Sigs, s)
	slices.SortFunc(p.Sigs, func(a, b PairSig) int { return bytes.Compare(a.Signer[:], b.Signer[:]) })
	return nil
}

// Encode returns the canonical encoding. It fails with ErrMalformed for a
// record with no signature or an invalid shape.
func (p *PairRecord) Encode() ([]byte, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: no pair record", ErrMalformed)
	}
	if err := p.checkShape(); err != nil {
		return nil, err
	}
	if len(p.Sigs) == 0 || len(p.Sigs) > MaxPairSigs {
		return nil, fmt.Errorf("%w: %d pair signatures", ErrMalformed, len(p.Sigs))
	}
	b := p.body()
	b = append(b, byte(len(p.Sigs)))
	for _, s := range p.Sigs {
		b = append(b, s.Signer[:]...)
		b = append(b, s.Sig[:]...)
	}
	return b, nil
}

// ParsePairRecord decodes a canonical pair record and checks that every
// signature verifies under its signer key. Whether the signers are members
// or trust roots is Complete's business. Errors: ErrTooLarge, ErrVersion,
// ErrMalformed, ErrVIPIsMember, ErrVIPOutsideRegion, ErrBadSignature.
func ParsePairRecord(b []byte) (*PairRecord, error) {
	p, err := decodePairRecord(b)
	if err != nil {
		return nil, err
	}
	if err := p.verifySigs(); err != nil {
		return nil, err
	}
	return p, nil
}

// verifySigs checks every signature under its signer key.
func (p *PairRecord) verifySigs() error {
	body := p.body()
	for _, s := range p.Sigs {
		if !s.Signer.verify(PairLabel, body, s.Sig[:]) {
			return ErrBadSignature
		}
	}
	return nil
}

// decodePairRecord decodes without checking signatures: ParseClaim leaves
// that to Policy, which caches the records it has verified.
func decodePairRecord(b []byte) (*PairRecord, error) {
	r := reader{b: b}
	mesh, vip, err := r.header(kindPair)
	if err != nil {
		return nil, err
	}
	p := &PairRecord{Mesh: mesh, VIP: vip}
	for i := range p.Members {
		p.Members[i] = Member{Addr: r.addr(), Key: r.key()}
	}
	n := int(r.u8())
	if r.bad || n == 0 || n > MaxPairSigs {
		return nil, ErrMalformed
	}
	for i := 0; i < n; i++ {
		s := PairSig{Signer: r.key()}
		copy(s.Sig[:], r.take(ed25519.SignatureSize))
		if i > 0 && bytes.Compare(p.Sigs[i-1].Signer[:], s.Signer[:]) >= 0 {
			return nil, fmt.Errorf("%w: pair signatures unsorted or repeated", ErrMalformed)
		}
		p.Sigs = append(p.Sigs, s)
	}
	if r.bad || r.off != len(b) {
		return nil, ErrMalformed
	}
	if err := p.checkShape(); err != nil {
		return nil, err
	}
	return p, nil
}

// Complete reports (with ErrPairSignatures) whether the record is signed for
// both member slots: each slot by its member or by a distinct trust root
// (isRoot may be nil: no roots). Every signer must be a member or a trust
// root. Signatures must already have been verified (ParsePairRecord, or Sign).
func (p *PairRecord) Complete(isRoot func(PublicKey) bool) error {
	members, roots := 0, 0
	for _, s := range p.Sigs {
		switch {
		case s.Signer == p.Members[0].Key || s.Signer == p.Members[1].Key:
			members++
		case isRoot != nil && isRoot(s.Signer):
			roots++
		default:
			return fmt.Errorf("%w: signer %x is neither a member nor a trust root", ErrPairSignatures, s.Signer[:4])
		}
	}
	if members+roots < 2 {
		return fmt.Errorf("%w: %d member and %d root signatures", ErrPairSignatures, members, roots)
	}
	return nil
}

// HasMember reports whether addr with key is one of the record's members.
func (p *PairRecord) HasMember(addr netip.Addr, key PublicKey) bool {
	for _, m := range p.Members {
		if m.Addr == addr && m.Key == key {
			return true
		}
	}
	return false
}

// Other returns the member that is not addr, and false when addr is not a
// member.
func (p *PairRecord) Other(addr netip.Addr) (Member, bool) {
	switch addr {
	case p.Members[0].Addr:
		return p.Members[1], true
	case p.Members[1].Addr:
		return p.Members[0], true
	}
	return Member{}, false
}

// SameMembers reports whether o names the same mesh, VIP and members as p
// (signatures aside).
func (p *PairRecord) SameMembers(o *PairRecord) bool {
	return p.Mesh == o.Mesh && p.VIP == o.VIP && p.Members == o.Members
}
