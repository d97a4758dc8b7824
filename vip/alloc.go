package vip

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// ErrRangeFull means the overlay range has no free address for a VIP.
var ErrRangeFull = fmt.Errorf("%w: overlay range has no free address", ErrLimit)

// hostRange returns the first usable address of an IPv4 prefix and how many
// usable addresses it has (network and broadcast excluded below /31).
func hostRange(p netip.Prefix) (first uint32, n uint64, err error) {
	p = p.Masked()
	if !p.Addr().Is4() {
		return 0, 0, fmt.Errorf("%w: overlay range %v: VIPs are IPv4 (the overlay carries IPv4 only)", ErrInvalid, p)
	}
	bits := 32 - p.Bits()
	base := binary.BigEndian.Uint32(p.Addr().AsSlice())
	size := uint64(1) << bits
	if bits >= 2 {
		return base + 1, size - 2, nil
	}
	return base, size, nil
}

func u32addr(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// Seed returns where id's walk through prefix starts: a hash of the service
// id, so every node computes the same walk for the same service.
func Seed(id ServiceID, prefix netip.Prefix) (netip.Addr, error) {
	first, n, err := hostRange(prefix)
	if err != nil {
		return netip.Addr{}, err
	}
	return u32addr(first + uint32(seedOffset(id, n))), nil
}

func seedOffset(id ServiceID, n uint64) uint64 {
	h := sha256.Sum256(append([]byte("tsunagi-vip-addr/v1\x00"), id[:]...))
	return binary.BigEndian.Uint64(h[:8]) % n
}

// Allocate walks prefix from id's seed and returns the first address for
// which taken is false. taken should report node addresses and other VIPs.
func Allocate(id ServiceID, prefix netip.Prefix, taken func(netip.Addr) bool) (netip.Addr, error) {
	first, n, err := hostRange(prefix)
	if err != nil {
		return netip.Addr{}, err
	}
	off := seedOffset(id, n)
	for i := uint64(0); i < n; i++ {
		a := u32addr(first + uint32((off+i)%n))
		if !taken(a) {
			return a, nil
		}
	}
	return netip.Addr{}, ErrRangeFull
}

// AddrClaim is a service's stored address reservation: the address it was
// allocated when created (invalid if none is stored yet).
type AddrClaim struct {
	ID        ServiceID
	Preferred netip.Addr
}

// AddrResult is a service's effective address.
type AddrResult struct {
	Addr netip.Addr
	// Moved is true when the effective address differs from the stored
	// reservation: it collided with a node or with a service of lower id
	// (after partitions merge, for one), and the walk found another.
	Moved bool
	Err   error // ErrRangeFull when no address was free
}

// ResolveAddresses decides every service's effective address from the same
// inputs on every node, so replicas that hold the same state agree. Services
// are taken in id order: each keeps its stored reservation unless it lies
// outside the range, is a node's address or was taken by a lower id; then it
// walks from its seed. Node addresses always win.
func ResolveAddresses(prefix netip.Prefix, nodes []netip.Addr, claims []AddrClaim) map[ServiceID]AddrResult {
	prefix = prefix.Masked()
	used := make(map[netip.Addr]bool, len(nodes)+len(claims))
	for _, a := range nodes {
		used[a] = true
	}
	sorted := slices.Clone(claims)
	slices.SortFunc(sorted, func(a, b AddrClaim) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	out := make(map[ServiceID]AddrResult, len(claims))
	first, n, rerr := hostRange(prefix)
	inRange := func(a netip.Addr) bool {
		if !a.Is4() || !prefix.Contains(a) {
			return false
		}
		v := binary.BigEndian.Uint32(a.AsSlice())
		return uint64(v-first) < n
	}
	for _, c := range sorted {
		if rerr != nil {
			out[c.ID] = AddrResult{Err: rerr}
			continue
		}
		if c.Preferred.IsValid() && inRange(c.Preferred) && !used[c.Preferred] {
			used[c.Preferred] = true
			out[c.ID] = AddrResult{Addr: c.Preferred}
			continue
		}
		a, err := Allocate(c.ID, prefix, func(a netip.Addr) bool { return used[a] })
		if err != nil {
			out[c.ID] = AddrResult{Err: err}
			continue
		}
		used[a] = true
		out[c.ID] = AddrResult{Addr: a, Moved: c.Preferred.IsValid()}
	}
	return out
}

// NameClaim is a service's name in a network.
type NameClaim struct {
	ID   ServiceID
	Name string
}

// NameConflict reports a service whose name is not effective.
type NameConflict struct {
	Service ServiceID
	Name    string
	// Node is set when a node has the name (node names take precedence);
	// otherwise Winner is the service of lower id that holds it.
	Node   *NodeID
	Winner ServiceID
}

func (c NameConflict) String() string {
	if c.Node != nil {
		return fmt.Sprintf("service %s: name %q belongs to node %s", c.Service, c.Name, c.Node.String()[:12])
	}
	return fmt.Sprintf("service %s: name %q belongs to service %s (lower id)", c.Service, c.Name, c.Winner)
}

// ResolveNames decides which service holds each name: node names take
// precedence, and ties between services go to the lowest id. It returns the
// effective holders and every conflict, in service id order.
func ResolveNames(nodes map[string]NodeID, claims []NameClaim) (map[string]ServiceID, []NameConflict) {
	sorted := slices.Clone(claims)
	slices.SortFunc(sorted, func(a, b NameClaim) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	holders := map[string]ServiceID{}
	var conflicts []NameConflict
	for _, c := range sorted {
		if node, ok := nodes[c.Name]; ok {
			conflicts = append(conflicts, NameConflict{Service: c.ID, Name: c.Name, Node: &node})
			continue
		}
		if w, ok := holders[c.Name]; ok {
			conflicts = append(conflicts, NameConflict{Service: c.ID, Name: c.Name, Winner: w})
			continue
		}
		holders[c.Name] = c.ID
	}
	return holders, conflicts
}
