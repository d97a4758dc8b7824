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

// examplePair starts members a and b of a pair on a memory KV and a
// manual clock, and makes a the first holder by a promote.
func examplePair() (a, b *claim.Controller, kv *memkv.KV, clock *transporttest.ManualClock) {
	f := claimtest.NewFixture()
	clock = transporttest.NewManualClock()
	kv = memkv.New(memkv.Options{Clock: clock})
	start := func(n claimtest.Node) *claim.Controller {
		ctl, err := claim.NewController(claim.Config{
			Policy: f.Policy(), Self: n.Addr, Key: n.Key, VIP: f.VIP, Pair: f.Pair,
			KV: kv, Carrier: claimtest.NewFakeCarrier(n.Name, clock, nil), Store: new(claim.MemStore),
			Clock: clock, NoWatch: true,
		})
		if err != nil {
			panic(err)
		}
		if err := ctl.Start(); err != nil {
			panic(err)
		}
		return ctl
	}
	a, b = start(f.A), start(f.B)
	clock.Advance(time.Second)
	if _, err := a.Promote(context.Background(), claim.PromoteOptions{}); err != nil {
		panic(err)
	}
	return a, b, kv, clock
}

// An importer follows its node's role with Watch instead of polling
// Status. Here b watches while a holds, dies, and b takes over.
func ExampleController_Watch() {
	a, b, kv, clock := examplePair()
	defer kv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := b.Watch(ctx, 0)
	clock.Advance(3 * time.Second)
	a.Close() // its lease expires 20 s after its last renewal
	for i := 0; i < 250; i++ {
		clock.Advance(100 * time.Millisecond)
	}
	b.Close()
	for ch := range changes {
		fmt.Printf("%s epoch %d fenced %v carried %v\n", ch.Role, ch.Epoch, ch.Fenced, ch.Carried)
	}
	// Output:
	// replica epoch 0 fenced false carried false
	// replica epoch 1 fenced false carried false
	// primary epoch 2 fenced false carried true
	// primary epoch 2 fenced false carried false
}

// An importer guards its own writes to the same etcd with the holder's
// token: they commit while this node holds the VIP, and fail once it has
// moved.
func ExampleController_FenceToken() {
	a, b, kv, clock := examplePair()
	defer kv.Close()
	defer b.Close()
	write := func(tok claim.FenceToken, v string) bool {
		r, err := kv.Txn(context.Background(), claim.Txn{
			If: tok.Compares(), Then: []claim.Op{claim.Put("/app/row", []byte(v), 0)},
		})
		return err == nil && r.Succeeded
	}
	tok, err := a.FenceToken()
	if err != nil {
		panic(err)
	}
	fmt.Println("write while a holds:", write(tok, "1"))
	a.Close() // a dies; b fails over once a's lease expired
	for i := 0; i < 250; i++ {
		clock.Advance(100 * time.Millisecond)
	}
	fmt.Println("b holds:", b.Status().Role == claim.RoleHolder)
	fmt.Println("write with a's token after the move:", write(tok, "2"))
	// Output:
	// write while a holds: true
	// b holds: true
	// write with a's token after the move: false
}
