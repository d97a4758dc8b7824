package vip

import (
	"errors"
	"net/netip"
	"testing"
)

func TestAllocateDeterministicAndAvoidsTaken(t *testing.T) {
	p := netip.MustParsePrefix("100.80.0.0/24")
	a1, err := Allocate(sid(1), p, func(netip.Addr) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := Allocate(sid(1), p, func(netip.Addr) bool { return false })
	if a1 != a2 {
		t.Fatalf("same id gave %v and %v", a1, a2)
	}
	seed, _ := Seed(sid(1), p)
	if a1 != seed {
		t.Fatalf("free range: got %v, want the seed %v", a1, seed)
	}
	b, _ := Allocate(sid(2), p, func(netip.Addr) bool { return false })
	if b == a1 {
		t.Logf("ids 1 and 2 share a seed (possible, unlikely)")
	}
	// Taken addresses are skipped, walking forward from the seed.
	taken := map[netip.Addr]bool{a1: true, a1.Next(): true}
	c, _ := Allocate(sid(1), p, func(a netip.Addr) bool { return taken[a] })
	if taken[c] || !p.Contains(c) {
		t.Fatalf("got taken or out-of-range %v", c)
	}
	// Never the network or broadcast address.
	small := netip.MustParsePrefix("100.80.0.0/30")
	seen := map[netip.Addr]bool{}
	for {
		a, err := Allocate(sid(3), small, func(a netip.Addr) bool { return seen[a] })
		if errors.Is(err, ErrRangeFull) {
			break
		}
		if a == small.Addr() || a == netip.MustParseAddr("100.80.0.3") {
			t.Fatalf("allocated %v", a)
		}
		seen[a] = true
	}
	if len(seen) != 2 {
		t.Fatalf("a /30 gave %d addresses, want 2", len(seen))
	}
	if _, err := Allocate(sid(1), netip.MustParsePrefix("fd00::/64"), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("IPv6 range: %v", err)
	}
}

// TestPartitionsConvergeOnOneHolder: two partitions each allocated the same
// address to a different service; once their states merge every node
// resolves the same holder (the lower id) and moves the other.
func TestPartitionsConvergeOnOneHolder(t *testing.T) {
	p := netip.MustParsePrefix("100.80.0.0/24")
	same := netip.MustParseAddr("100.80.0.10")
	node := netip.MustParseAddr("100.80.0.1")
	left := []AddrClaim{{sid(5), same}}
	right := []AddrClaim{{sid(3), same}}
	merged1 := append(append([]AddrClaim{}, left...), right...)
	merged2 := append(append([]AddrClaim{}, right...), left...)
	r1 := ResolveAddresses(p, []netip.Addr{node}, merged1)
	r2 := ResolveAddresses(p, []netip.Addr{node}, merged2)
	if r1[sid(3)] != r2[sid(3)] || r1[sid(5)] != r2[sid(5)] {
		t.Fatalf("arrival order changed the result: %v vs %v", r1, r2)
	}
	if r1[sid(3)].Addr != same || r1[sid(3)].Moved {
		t.Fatalf("lower id should keep %v: %+v", same, r1[sid(3)])
	}
	if r1[sid(5)].Addr == same || !r1[sid(5)].Moved || r1[sid(5)].Addr == node {
		t.Fatalf("higher id should move: %+v", r1[sid(5)])
	}
	// A node address always wins over a VIP reservation.
	r := ResolveAddresses(p, []netip.Addr{same}, right)
	if r[sid(3)].Addr == same || !r[sid(3)].Moved {
		t.Fatalf("node address not respected: %+v", r[sid(3)])
	}
}

func TestResolveNames(t *testing.T) {
	nodes := map[string]NodeID{"server1": nid(1)}
	holders, conflicts := ResolveNames(nodes, []NameClaim{{sid(9), "api"}, {sid(2), "api"}, {sid(4), "server1"}})
	if holders["api"] != sid(2) {
		t.Fatalf("api held by %v, want the lower id", holders["api"])
	}
	if _, ok := holders["server1"]; ok {
		t.Fatal("a service took a node's name")
	}
	if len(conflicts) != 2 || conflicts[0].Service != sid(4) || conflicts[0].Node == nil || conflicts[1].Service != sid(9) || conflicts[1].Winner != sid(2) {
		t.Fatalf("conflicts %+v", conflicts)
	}
}
