package vip

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/vipkit/vipkit/crdt"
)

// Reservation is a VIP's address as this node knows it: the reservation
// stored with the service (the address it was allocated at creation) and
// the effective address it uses now. They differ when the reservation
// collided with a node or with a VIP of lower id (AddrMoved).
type Reservation struct {
	Service ServiceID `json:"service"`
	Name    string    `json:"name"`
	// Reserved is the stored reservation; invalid when none is stored.
	Reserved netip.Addr `json:"reserved,omitzero"`
	// Addr is the effective address; invalid when the range had none free.
	Addr netip.Addr `json:"addr,omitzero"`
}

// AddrCollision is a node whose overlay address is a VIP's stored address
// reservation. Node addresses win, so the VIP has moved to another address
// (Effective); applications and caches that still use the old address
// reach the node instead. Either the node or the VIP should change: a node
// takes a new address from the config, and a VIP recreated gets a new one.
type AddrCollision struct {
	Node     NodeID     `json:"node"`
	NodeName string     `json:"node_name,omitempty"`
	Addr     netip.Addr `json:"addr"`
	Service  ServiceID  `json:"service"`
	Name     string     `json:"service_name"`
	// Effective is the address the VIP uses instead; invalid when none
	// was free.
	Effective netip.Addr `json:"effective_addr,omitzero"`
}

// String describes the collision for logs and the CLI.
func (c AddrCollision) String() string {
	node := c.NodeName
	if node == "" {
		node = c.Node.String()[:12]
	}
	moved := "it has no other address (the range is full)"
	if c.Effective.IsValid() {
		moved = "it moved to " + c.Effective.String()
	}
	return fmt.Sprintf("node %s's address %v is the reservation of VIP %s (id %s); %s", node, c.Addr, c.Name, c.Service, moved)
}

// storedReservation reads a service's stored address reservation from the
// replica (invalid when none is stored or it is malformed).
func (r *Registry) storedReservation(id ServiceID) netip.Addr {
	for _, f := range r.o.Replica.Fields(crdt.ServiceID(id)) {
		if f.Key == keyAddr && len(f.Value) == 4 {
			return netip.AddrFrom4([4]byte(f.Value))
		}
	}
	return netip.Addr{}
}

// Reservations returns the address reservations of every active service,
// in id order.
func (r *Registry) Reservations() []Reservation {
	views := r.List()
	out := make([]Reservation, 0, len(views))
	for _, v := range views {
		out = append(out, Reservation{Service: v.ID, Name: v.Name, Reserved: r.storedReservation(v.ID), Addr: v.Addr})
	}
	return out
}

// AddrCollisions returns the members whose overlay address is a VIP's
// stored reservation, in service id order. It reads what the Registry
// holds, so a partition's unknown VIPs are not in it.
func (r *Registry) AddrCollisions() []AddrCollision {
	return Collisions(r.Nodes(), r.Reservations())
}

// Collisions returns the nodes whose address is one of the reservations'
// stored address, in the reservations' order.
func Collisions(nodes []NodeInfo, res []Reservation) []AddrCollision {
	byAddr := make(map[netip.Addr]NodeInfo, len(nodes))
	for _, n := range nodes {
		if n.Addr.IsValid() {
			byAddr[n.Addr] = n
		}
	}
	var out []AddrCollision
	for _, s := range res {
		n, ok := byAddr[s.Reserved]
		if !s.Reserved.IsValid() || !ok {
			continue
		}
		c := AddrCollision{Node: n.ID, NodeName: n.Name, Addr: s.Reserved, Service: s.Service, Name: s.Name}
		if s.Addr != s.Reserved {
			c.Effective = s.Addr
		}
		out = append(out, c)
	}
	return out
}

// ErrNoNodeAddress means every usable address of the range is avoided.
var ErrNoNodeAddress = fmt.Errorf("%w: no address of the overlay range is free for a node", ErrLimit)

// ChooseNodeAddr picks an overlay address for a new node: it walks prefix
// from a start derived from seed (say the node's public key, so nodes that
// choose at the same time start apart) and returns the first usable address
// avoid does not report. avoid should report every known VIP reservation,
// stored and effective, and every known node address. The network and
// broadcast addresses are never chosen.
func ChooseNodeAddr(prefix netip.Prefix, seed []byte, avoid func(netip.Addr) bool) (netip.Addr, error) {
	first, n, err := hostRange(prefix)
	if err != nil {
		return netip.Addr{}, err
	}
	h := sha256.Sum256(append([]byte("tsunagi-node-addr/v1\x00"), seed...))
	off := binary.BigEndian.Uint64(h[:8]) % n
	for i := uint64(0); i < n; i++ {
		a := u32addr(first + uint32((off+i)%n))
		if !avoid(a) {
			return a, nil
		}
	}
	return netip.Addr{}, ErrNoNodeAddress
}
