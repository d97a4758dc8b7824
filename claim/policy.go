package claim

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Policy holds what a node checks every claim and release against: its mesh,
// its trust store and, optionally, the overlay prefix. A Policy is safe for
// concurrent use; it caches the pair records whose signatures it has
// already checked against the trust store.
type Policy struct {
	Mesh    string
	Trust   TrustStore
	Overlay netip.Prefix // when valid, a VIP outside it is refused

	mu syncx.Mutex
	// +checklocks:mu
	verified []byte // encoding of the last pair record found complete
}

// Accept reports whether a node that holds held (nil: none) and keeps the
// pair record kept (nil: none yet) takes claim c, received from the peer at
// from (the zero Addr for a claim read from the KV, which has no sender).
// The rules, each its own error:
//
//   - for this mesh (ErrWrongMesh);
//   - signed by the key the trust store holds for the holder (ErrUnknownNode,
//     ErrUntrustedKey; the signature itself was checked by ParseClaim);
//   - from a peer at the address the claim names (ErrWrongSender);
//   - consistent with the pair record: the record is complete, names the
//     claim's VIP and holder, the VIP is in the region (ErrPairMismatch,
//     ErrPairSignatures, ErrVIPOutsidePrefix), and it names the members of
//     the kept record (ErrPairChanged);
//   - newer than the held claim (ErrStale);
//   - no more than MaxEpochJump epochs ahead of it (ErrEpochJump), and
//     not above MaxEpoch, even when no claim is held (ErrEpochExhausted).
func (p *Policy) Accept(held *Claim, kept *PairRecord, c *Claim, from netip.Addr) error {
	if err := p.Verify(kept, c, from); err != nil {
		return err
	}
	return Fresh(held, c)
}

// Fresh applies the ordering rules of Accept alone: c must be newer than held
// (ErrStale) and at most MaxEpochJump ahead of it (ErrEpochJump). With no
// held claim every claim is fresh.
func Fresh(held, c *Claim) error {
	if c.Epoch > MaxEpoch {
		return fmt.Errorf("%w: epoch %d is above %d, the last one a node takes", ErrEpochExhausted, c.Epoch, uint64(MaxEpoch))
	}
	if held == nil {
		return nil
	}
	if !c.Newer(held) {
		return fmt.Errorf("%w: epoch %d, holding %d", ErrStale, c.Epoch, held.Epoch)
	}
	// Newer means c.Epoch >= held.Epoch: the difference cannot wrap.
	if c.Epoch-held.Epoch > MaxEpochJump {
		return fmt.Errorf("%w: epoch %d, holding %d", ErrEpochJump, c.Epoch, held.Epoch)
	}
	return nil
}

// nextEpoch returns the epoch after e, checked: ErrEpochExhausted when e
// is MaxEpoch or above (a claim at the next epoch would be refused, or
// would wrap to 0).
func nextEpoch(e uint64) (uint64, error) {
	if e >= MaxEpoch {
		return 0, fmt.Errorf("%w: epoch %d: no claim can follow it (the last epoch a node takes is %d)", ErrEpochExhausted, e, uint64(MaxEpoch))
	}
	return e + 1, nil
}

// Verify applies every rule of Accept except the ordering ones: it says
// whether c is a valid claim at all. The controller uses it for values read
// from the KV, which have no sender (from is the zero Addr).
func (p *Policy) Verify(kept *PairRecord, c *Claim, from netip.Addr) error {
	if c.Mesh != p.Mesh {
		return fmt.Errorf("%w: %q", ErrWrongMesh, c.Mesh)
	}
	k, ok := p.Trust.KeyByAddr(c.Holder)
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownNode, c.Holder)
	}
	if k != c.HolderKey {
		return fmt.Errorf("%w: holder %v", ErrUntrustedKey, c.Holder)
	}
	if from.IsValid() && from.Unmap() != c.Holder {
		return fmt.Errorf("%w: from %v, claim names %v", ErrWrongSender, from, c.Holder)
	}
	return p.checkPair(kept, c.Pair, c.VIP, c.Holder, c.HolderKey)
}

func (p *Policy) checkPair(kept, pr *PairRecord, vip, holder netip.Addr, key PublicKey) error {
	if pr.Mesh != p.Mesh || pr.VIP != vip {
		return fmt.Errorf("%w: record for %s %v", ErrPairMismatch, pr.Mesh, pr.VIP)
	}
	if !pr.HasMember(holder, key) {
		return fmt.Errorf("%w: %v is not a member", ErrPairMismatch, holder)
	}
	if p.Overlay.IsValid() && !p.Overlay.Contains(vip) {
		return fmt.Errorf("%w: %v not in %v", ErrVIPOutsidePrefix, vip, p.Overlay)
	}
	if kept != nil && !kept.SameMembers(pr) {
		return fmt.Errorf("%w: %v", ErrPairChanged, pr.VIP)
	}
	return p.completePair(pr)
}

// completePair checks the record's signers against the trust store: every
// member's key must be the store's key for its address, and the record must
// be Complete. The last complete encoding is cached, so a stream of claims
// with one record costs one check.
func (p *Policy) completePair(pr *PairRecord) error {
	enc, err := pr.Encode()
	if err != nil {
		return err
	}
	p.mu.Lock()
	hit := p.verified != nil && bytes.Equal(p.verified, enc)
	p.mu.Unlock()
	if hit {
		return nil
	}
	if err := pr.verifySigs(); err != nil {
		return err
	}
	for _, m := range pr.Members {
		k, ok := p.Trust.KeyByAddr(m.Addr)
		if !ok {
			return fmt.Errorf("%w: member %v", ErrUnknownNode, m.Addr)
		}
		if k != m.Key {
			return fmt.Errorf("%w: member %v", ErrUntrustedKey, m.Addr)
		}
	}
	if err := pr.Complete(p.Trust.IsRoot); err != nil {
		return err
	}
	p.mu.Lock()
	p.verified = enc
	p.mu.Unlock()
	return nil
}

// CheckPair reports whether a node that keeps kept (nil: none) takes the
// pair record pr: complete, members known to the trust store, and the same
// members as the kept one.
func (p *Policy) CheckPair(kept, pr *PairRecord) error {
	if pr.Mesh != p.Mesh {
		return fmt.Errorf("%w: %q", ErrWrongMesh, pr.Mesh)
	}
	if p.Overlay.IsValid() && !p.Overlay.Contains(pr.VIP) {
		return fmt.Errorf("%w: %v not in %v", ErrVIPOutsidePrefix, pr.VIP, p.Overlay)
	}
	if kept != nil && !kept.SameMembers(pr) {
		return fmt.Errorf("%w: %v", ErrPairChanged, pr.VIP)
	}
	return p.completePair(pr)
}

// AcceptRelease reports whether self, holding held under the kept pair
// record, takes the release r received from the peer at from. A release is
// taken only from the other member named in the pair record:
//
//   - for this mesh and the held VIP (ErrWrongMesh, ErrPairMismatch);
//   - self holds the VIP (ErrNotHolder);
//   - the requester is the other member (ErrNotPairMember), its key is the
//     trust store's (ErrUntrustedKey) and the request comes from its
//     address (ErrWrongSender);
//   - the next epoch is newer than the held one (ErrStale) and at most
//     MaxEpochJump ahead (ErrEpochJump).
func (p *Policy) AcceptRelease(self netip.Addr, held *Claim, kept *PairRecord, r *Release, from netip.Addr) error {
	if r.Mesh != p.Mesh {
		return fmt.Errorf("%w: %q", ErrWrongMesh, r.Mesh)
	}
	if held == nil || held.Holder != self {
		return ErrNotHolder
	}
	if r.VIP != held.VIP {
		return fmt.Errorf("%w: release for %v, holding %v", ErrPairMismatch, r.VIP, held.VIP)
	}
	pair := kept
	if pair == nil {
		pair = held.Pair
	}
	other, ok := pair.Other(self)
	if !ok || other.Addr != r.From {
		return fmt.Errorf("%w: %v", ErrNotPairMember, r.From)
	}
	k, ok := p.Trust.KeyByAddr(r.From)
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownNode, r.From)
	}
	if k != r.FromKey || other.Key != r.FromKey {
		return fmt.Errorf("%w: %v", ErrUntrustedKey, r.From)
	}
	if from.IsValid() && from.Unmap() != r.From {
		return fmt.Errorf("%w: from %v, release names %v", ErrWrongSender, from, r.From)
	}
	if r.NextEpoch > MaxEpoch {
		return fmt.Errorf("%w: release for %d, above %d", ErrEpochExhausted, r.NextEpoch, uint64(MaxEpoch))
	}
	if r.NextEpoch <= held.Epoch {
		return fmt.Errorf("%w: release for %d, holding %d", ErrStale, r.NextEpoch, held.Epoch)
	}
	if r.NextEpoch-held.Epoch > MaxEpochJump {
		return fmt.Errorf("%w: release for %d, holding %d", ErrEpochJump, r.NextEpoch, held.Epoch)
	}
	return nil
}
