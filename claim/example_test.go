package claim_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/claim/memkv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// A claim is signed by its holder and checked by every receiver against its
// trust store, the pair record and the claim it already holds.
func ExamplePolicy_Accept() {
	f := claimtest.NewFixture() // members a and b, their trust store, the pair record
	policy := &claim.Policy{Mesh: f.Mesh, Trust: f.Trust, Overlay: f.Overlay}

	held, _ := claim.NewClaim(f.A.Key, f.A.Addr, 1, f.Pair)
	next, _ := claim.NewClaim(f.B.Key, f.B.Addr, 2, f.Pair)

	fmt.Println(policy.Accept(held, f.Pair, next, f.B.Addr))
	fmt.Println(policy.Accept(next, f.Pair, held, f.A.Addr)) // a replay of the old claim
	// Output:
	// <nil>
	// claim: stale epoch: epoch 1, holding 2
}

// A controller tends one VIP on one member. Here a pair shares a memory KV
// on a manual clock; a promote bootstraps the first holder, and when the
// holder's lease expires the replica takes over.
func ExampleController() {
	f := claimtest.NewFixture()
	clock := transporttest.NewManualClock()
	kv := memkv.New(memkv.Options{Clock: clock})
	defer kv.Close()

	start := func(n claimtest.Node) (*claim.Controller, *claimtest.FakeCarrier) {
		carrier := claimtest.NewFakeCarrier(n.Name, clock, nil)
		ctl, err := claim.NewController(claim.Config{
			Policy: f.Policy(), Self: n.Addr, Key: n.Key, VIP: f.VIP, Pair: f.Pair,
			KV: kv, Carrier: carrier, Store: new(claim.MemStore), Clock: clock, NoWatch: true,
		})
		if err != nil {
			panic(err)
		}
		if err := ctl.Start(); err != nil {
			panic(err)
		}
		return ctl, carrier
	}
	a, aCarrier := start(f.A)
	b, bCarrier := start(f.B)
	defer b.Close()
	clock.Advance(time.Second)

	if _, err := a.Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		panic(err)
	}
	clock.Advance(10 * time.Second)
	fmt.Println("a carries:", aCarrier.Carried(f.VIP), "b carries:", bCarrier.Carried(f.VIP))

	a.Close() // a dies; its lease expires 20 s after its last renewal
	for i := 0; i < 250; i++ {
		clock.Advance(100 * time.Millisecond)
	}
	st := b.Status()
	fmt.Println("b carries:", bCarrier.Carried(f.VIP), "role:", st.Role, "epoch:", st.Epoch)
	// Output:
	// a carries: true b carries: false
	// b carries: true role: primary epoch: 2
}
