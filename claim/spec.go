package claim

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// ValidateVIP checks the VIP of a node's spec: it must be an IPv6 address
// inside the overlay prefix (ErrVIPOutsidePrefix), not the node's own
// address (ErrVIPIsMember), inside the /112 region of the node's address
// (ErrVIPOutsideRegion), and outside every peer's allowed IPs
// (ErrVIPInPeerAllowedIPs). A peer's allowed IPs are those of its own
// address and subnets; the VIP /128 that the controller routes to a holder
// is not part of a peer's declared allowed IPs and must not be passed here.
func ValidateVIP(vip netip.Addr, overlay netip.Prefix, self netip.Addr, peerAllowed []netip.Prefix) error {
	if !validAddr(vip) {
		return fmt.Errorf("%w: %v is not an IPv6 address", ErrMalformed, vip)
	}
	if !overlay.IsValid() || !overlay.Contains(vip) {
		return fmt.Errorf("%w: %v not in %v", ErrVIPOutsidePrefix, vip, overlay)
	}
	if vip == self {
		return fmt.Errorf("%w: %v", ErrVIPIsMember, vip)
	}
	if !Region(self).Contains(vip) {
		return fmt.Errorf("%w: %v not in %v", ErrVIPOutsideRegion, vip, Region(self))
	}
	for _, p := range peerAllowed {
		if p.Contains(vip) {
			return fmt.Errorf("%w: %v in %v", ErrVIPInPeerAllowedIPs, vip, p)
		}
	}
	return nil
}

// Allocate picks a free /128 inside the /112 region of holder, within the
// overlay prefix. It never returns the region's first address (the subnet
// anycast address), the holder, an address in reserved (every VIP the node
// knows or declares, and the members' addresses), or an address inside any
// peer's allowed IPs. rng chooses where the search starts (nil: the first
// free address from the bottom); the search then walks the region, so it
// fails with ErrRegionFull only when every address is taken.
func Allocate(overlay netip.Prefix, holder netip.Addr, reserved []netip.Addr, peerAllowed []netip.Prefix, rng *rand.Rand) (netip.Addr, error) {
	if !validAddr(holder) || !overlay.IsValid() || !overlay.Contains(holder) || overlay.Bits() > 112 {
		return netip.Addr{}, fmt.Errorf("%w: holder %v in overlay %v", ErrVIPOutsidePrefix, holder, overlay)
	}
	taken := make(map[netip.Addr]bool, len(reserved)+1)
	taken[holder] = true
	for _, a := range reserved {
		taken[a] = true
	}
	base := Region(holder).Addr().As16()
	start := uint32(1)
	if rng != nil {
		start = 1 + rng.Uint32N(0xffff)
	}
	for i := uint32(0); i < 0xffff; i++ {
		low := 1 + (start-1+i)%0xffff
		a := base
		binary.BigEndian.PutUint16(a[14:], uint16(low))
		cand := netip.AddrFrom16(a)
		if taken[cand] {
			continue
		}
		ok := true
		for _, p := range peerAllowed {
			if p.Contains(cand) {
				ok = false
				break
			}
		}
		if ok {
			return cand, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: %v", ErrRegionFull, Region(holder))
}
