package vip

import (
	"context"
	"crypto/ed25519"
	"net/netip"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// TestEnginePeerIDsBounded: members come and go 1000 times; the engine's
// table of compact peer ids keeps the current members and the departed
// nodes that stored backends still name, not every node ever seen. A
// node that stays keeps its id throughout, and a departed node's id is
// never handed to another node.
func TestEnginePeerIDsBounded(t *testing.T) {
	ctx := context.Background()
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	var self NodeID
	copy(self[:], key.Public().(ed25519.PublicKey))
	stay := NodeInfo{ID: NodeID{0xaa}, Name: "stay", Addr: netip.MustParseAddr("100.80.0.2")}
	var mu sync.Mutex
	nodes := []NodeInfo{{ID: self, Name: "gw", Addr: netip.MustParseAddr("100.80.0.1")}, stay}
	var former []NodeInfo
	rep, err := crdt.Open(ctx, crdt.Config{Signer: key, Members: []crdt.AuthorID{crdt.AuthorID(self)}, Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	reg, err := NewRegistry(RegistryOptions{Network: "home", Prefix: netip.MustParsePrefix("100.80.0.0/16"), Replica: rep,
		Nodes:       func() []NodeInfo { mu.Lock(); defer mu.Unlock(); return append([]NodeInfo(nil), nodes...) },
		FormerNodes: func() []NodeInfo { mu.Lock(); defer mu.Unlock(); return append([]NodeInfo(nil), former...) }})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(EngineOptions{Registry: reg, Self: self, Host: &recHost{done: make(chan struct{})}, Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ids := func() (n int, stayID uint64, all map[uint64]NodeID) {
		e.cfgMu.Lock()
		defer e.cfgMu.Unlock()
		all = map[uint64]NodeID{}
		for node, id := range e.peerIDs {
			all[uint64(id)] = node
		}
		return len(e.peerIDs), uint64(e.peerIDs[stay.ID]), all
	}
	if err := e.Apply(); err != nil {
		t.Fatal(err)
	}
	_, stayID, _ := ids()
	seen := map[uint64]NodeID{}
	const rounds = 1000
	for i := range rounds {
		churn := NodeInfo{ID: NodeID{byte(i), byte(i >> 8), 1}, Name: "churn", Addr: netip.MustParseAddr("100.80.0.3")}
		mu.Lock()
		nodes = []NodeInfo{nodes[0], stay, churn}
		// One departed node is still named by a stored backend.
		former = nil
		if i > 0 {
			former = []NodeInfo{{ID: NodeID{byte(i - 1), byte((i - 1) >> 8), 1}, Name: "churn-before"}}
		}
		mu.Unlock()
		if err := e.Apply(); err != nil {
			t.Fatal(err)
		}
		n, s, all := ids()
		if s != stayID {
			t.Fatalf("round %d: the staying member's peer id changed from %d to %d", i, stayID, s)
		}
		for id, node := range all {
			if prev, ok := seen[id]; ok && prev != node {
				t.Fatalf("round %d: peer id %d went to another node", i, id)
			}
			seen[id] = node
		}
		if n > 3 {
			t.Fatalf("round %d: %d peer ids held for 2 members and 1 departed node named by a backend", i, n)
		}
	}
}
