package vip_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/vip"
)

// An engine between a host stack and wireguard-go: here the host is one end
// of a channel pair and time is a manual clock; an agent passes a netstack
// host or a kernel TUN, and hands the engine to wg.NewDevice.
func ExampleNewEngine() {
	ctx := context.Background()
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	var self vip.NodeID
	copy(self[:], key.Public().(ed25519.PublicKey))
	nodes := []vip.NodeInfo{{ID: self, Name: "gw", Addr: netip.MustParseAddr("100.80.0.1")}}

	replica, err := crdt.Open(ctx, crdt.Config{Signer: key, Members: []crdt.AuthorID{crdt.AuthorID(self)}, Store: crdt.NewMemStore(), Obsolete: vip.Obsolete, Check: vip.CheckField, Rank: vip.Rank})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer replica.Close()
	var engine *vip.Engine
	reg, err := vip.NewRegistry(vip.RegistryOptions{
		Network: "home", Prefix: netip.MustParsePrefix("100.80.0.0/16"), Replica: replica,
		Nodes: func() []vip.NodeInfo { return nodes }, Rand: rand.NewChaCha8([32]byte{1}),
		// Routing follows the configuration once it is committed.
		OnChange: func([]vip.ServiceID, bool) {
			if engine != nil {
				engine.Apply()
			}
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	host, _ := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	engine, err = vip.NewEngine(vip.EngineOptions{Registry: reg, Self: self, Host: host, Clock: transporttest.NewManualClock()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer engine.Close()

	reg.Create(ctx, "api")
	off := false
	reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 443}, []vip.Backend{{Node: self, Port: 8443}})
	reg.PortSet(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 443}, vip.PortSettings{PortCheck: &off})

	dns := engine.DNSOptions()
	addr, _ := dns.Lookup("api")
	fmt.Println("api.home resolves in the overlay:", dns.Allow(netip.MustParseAddr("100.80.0.9")) && reg.Prefix().Contains(addr))
	st, _ := engine.ServiceStatus("api")
	l := st.Listeners[0]
	fmt.Printf("%s next=%s local=%v reason=%s rtt=%vms\n", l.Listener, l.Next.NodeName, l.Backends[0].Local, l.Backends[0].Reason, l.Backends[0].RTTMillis)
	// Output:
	// api.home resolves in the overlay: true
	// tcp/443 next=gw local=true reason=ok rtt=0ms
}
