package vip

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

func TestAddrCollisions(t *testing.T) {
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	var self NodeID
	copy(self[:], key.Public().(ed25519.PublicKey))
	var mu sync.Mutex
	nodes := []NodeInfo{{ID: self, Name: "server1", Addr: netip.MustParseAddr("100.80.0.1")}}
	var netID crdt.NetworkID
	rep, err := crdt.Open(context.Background(), crdt.Config{Network: netID, Signer: key, Members: []crdt.AuthorID{crdt.AuthorID(self)}, Obsolete: Obsolete})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	reg, err := NewRegistry(RegistryOptions{Network: "home", Prefix: netip.MustParsePrefix("100.80.0.0/24"), Replica: rep,
		Nodes: func() []NodeInfo { mu.Lock(); defer mu.Unlock(); return append([]NodeInfo(nil), nodes...) }})
	if err != nil {
		t.Fatal(err)
	}
	v, err := reg.Create(context.Background(), "api")
	if err != nil {
		t.Fatal(err)
	}
	if c := reg.AddrCollisions(); len(c) != 0 {
		t.Fatalf("collisions before any: %v", c)
	}
	res := reg.Reservations()
	if len(res) != 1 || res[0].Reserved != v.Addr || res[0].Addr != v.Addr || res[0].Name != "api" {
		t.Fatalf("reservations: %+v, want api at %v", res, v.Addr)
	}

	// A member joins with the VIP's reserved address: the VIP moves, and
	// the collision names both.
	var other NodeID
	other[0] = 9
	mu.Lock()
	nodes = append(nodes, NodeInfo{ID: other, Name: "server3", Addr: v.Addr})
	mu.Unlock()
	reg.Refresh()
	got := reg.AddrCollisions()
	moved, _ := reg.ByID(v.ID)
	if len(got) != 1 || got[0].Node != other || got[0].Addr != v.Addr || got[0].Service != v.ID || got[0].Effective != moved.Addr || !moved.AddrMoved {
		t.Fatalf("collisions %+v (view %+v), want server3 on api's %v", got, moved, v.Addr)
	}
	if s := got[0].String(); s == "" || !contains(s, "server3", v.Addr.String(), moved.Addr.String(), "api") {
		t.Fatalf("collision text %q", s)
	}
	if r := reg.Reservations(); r[0].Reserved != v.Addr || r[0].Addr != moved.Addr {
		t.Fatalf("reservations after the move: %+v", r)
	}
}

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func TestChooseNodeAddr(t *testing.T) {
	p := netip.MustParsePrefix("100.80.0.0/29") // .1 to .6
	avoid := map[netip.Addr]bool{}
	for _, a := range []string{"100.80.0.1", "100.80.0.2", "100.80.0.3", "100.80.0.4", "100.80.0.6"} {
		avoid[netip.MustParseAddr(a)] = true
	}
	for seed := range 64 {
		a, err := ChooseNodeAddr(p, []byte{byte(seed)}, func(a netip.Addr) bool { return avoid[a] })
		if err != nil || a != netip.MustParseAddr("100.80.0.5") {
			t.Fatalf("seed %d: %v, %v; want the only free address 100.80.0.5", seed, a, err)
		}
	}
	// Different seeds start at different addresses.
	seen := map[netip.Addr]bool{}
	for seed := range 64 {
		a, err := ChooseNodeAddr(p, []byte{byte(seed)}, func(netip.Addr) bool { return false })
		if err != nil || !p.Contains(a) || a == p.Addr() || a == netip.MustParseAddr("100.80.0.7") {
			t.Fatalf("seed %d: %v, %v", seed, a, err)
		}
		seen[a] = true
	}
	if len(seen) < 4 {
		t.Fatalf("64 seeds chose only %v", seen)
	}
	avoid[netip.MustParseAddr("100.80.0.5")] = true
	if _, err := ChooseNodeAddr(p, nil, func(a netip.Addr) bool { return avoid[a] }); !errors.Is(err, ErrNoNodeAddress) || !errors.Is(err, ErrLimit) {
		t.Fatalf("full range: %v, want ErrNoNodeAddress", err)
	}
}
