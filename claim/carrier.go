package claim

import (
	"context"
	"net/netip"
	"time"
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
//
// The Controller calls every method with its own lock held: the calls are
// the fence, and a Carry that began before a Drop must not finish after it.
// A method must therefore return promptly (bound netlink and UAPI calls)
// and must not call the Controller.
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

// LeasedCarrier is a Carrier that lets the OS enforce the fence. With a KV,
// the Controller adds the VIP through CarryUntil with the deadline by which
// it must be gone: DropAfter after the send of the last renewal etcd
// answered. Every answered renewal calls CarryUntil again with the later
// deadline. A holder that stops renewing for any reason (it crashed, it is
// frozen by SIGSTOP or a cgroup freeze, it cannot reach the carrier) thus
// loses the address at the deadline by the OS's own timer, without any
// step of its own. Without a KV there is no lease, and the Controller
// calls Carry (no deadline).
//
// The deadline is a time on the Controller's Clock: in production
// BootClock, so it is an absolute CLOCK_BOOTTIME instant, shared by every
// process of the host. The reference controller (examples/keel-vip) writes
// the address with valid_lft = floor(time left) in seconds and drops it
// when less than a second is left.
type LeasedCarrier interface {
	Carrier
	// CarryUntil adds vip/128 (preferred_lft 0), or refreshes it if
	// carried, so that it is gone by itself at deadline. When less than
	// MinCarryLeft is left, or the deadline has passed, it drops the
	// address instead and returns ErrDeadlinePassed.
	CarryUntil(ctx context.Context, vip netip.Addr, deadline time.Time) error
}

// MinCarryLeft is the least time before its deadline for which a
// LeasedCarrier still writes the address: the kernel counts address
// lifetimes in whole seconds.
const MinCarryLeft = time.Second
