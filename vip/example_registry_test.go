package vip_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/vip"
)

// A network's configuration: create a VIP, add a listener with its backends
// atomically, and save a draft against the revision it was read at.
func ExampleRegistry() {
	ctx := context.Background()
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	var self vip.NodeID
	copy(self[:], key.Public().(ed25519.PublicKey))
	nodes := []vip.NodeInfo{{ID: self, Name: "server1", Addr: netip.MustParseAddr("100.80.0.1")}}

	rep, _ := crdt.Open(ctx, crdt.Config{Signer: key, Members: []crdt.AuthorID{crdt.AuthorID(self)}, Obsolete: vip.Obsolete, Check: vip.CheckField, Rank: vip.Rank})
	defer rep.Close()
	reg, _ := vip.NewRegistry(vip.RegistryOptions{Network: "home", Prefix: netip.MustParsePrefix("100.80.0.0/24"),
		Replica: rep, Nodes: func() []vip.NodeInfo { return nodes }, Rand: rand.NewChaCha8([32]byte{1})})

	reg.Create(ctx, "api")
	b, _ := reg.ResolveBackend("server1:6443")
	v, _ := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 443}, []vip.Backend{b})
	fmt.Println(v.Name, v.Listeners[0].Key(), len(v.Listeners[0].Backends), v.Routable)

	draft := v.Service.Clone()
	draft.Name = "web"
	if _, err := reg.Save(ctx, draft, v.Revision); err != nil {
		fmt.Println(err)
	}
	// The same draft again is stale: the service changed since v was read.
	_, err := reg.Save(ctx, draft, v.Revision)
	fmt.Println(err != nil)
	// Output:
	// api tcp/443 1 true
	// true
}
