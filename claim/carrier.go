package claim

import (
	"context"
	"net/netip"
)

// Carrier puts a VIP on the node and routes it through the overlay. The
// reference controller implements it with netlink and wireguard-go (add the
// /128 with preferred_lft 0, so the address answers connections but is never
// chosen as a source; put the /128 in the allowed IPs of the holder's
// WireGuard peer). Package claim/claimtest has a recording fake.
//
// Every method is idempotent: adding a carried address, or routing a VIP to
// the peer it is already routed to, succeeds. Implementations are safe for
// concurrent use.
type Carrier interface {
	// Carry adds vip/128 to the node's overlay interface, preferred_lft 0.
	Carry(ctx context.Context, vip netip.Addr) error
	// Drop removes vip/128 from the node's interface.
	Drop(ctx context.Context, vip netip.Addr) error
	// Route puts vip/128 in the allowed IPs of the peer whose overlay
	// address is holder, taking it from any other peer. The zero holder
	// removes the route (nobody holds the VIP, or this node does).
	Route(ctx context.Context, vip, holder netip.Addr) error
}
