package vip

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// TestRegistryOnChangeRunsUnlocked: OnChange runs with no Registry lock
// held, so a receiver may edit the Registry from it (a controller that
// follows one change with another) and a receiver that waits for another
// goroutine's edit does not deadlock it.
func TestRegistryOnChangeRunsUnlocked(t *testing.T) {
	tn := newTestNet(t, 1, 1)
	rep, err := crdt.Open(context.Background(), crdt.Config{Network: tn.netID, Signer: tn.keys[0], Members: tn.members,
		Store: crdt.NewMemStore(), Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	var reg *Registry
	var first atomic.Bool
	edited := make(chan error, 1)
	reg, err = NewRegistry(RegistryOptions{Network: "home", Prefix: tn.prefix, Replica: rep, Nodes: tn.nodeList,
		Rand: rand.NewChaCha8([32]byte{7}),
		OnChange: func(ids []ServiceID, local bool) {
			if first.Swap(true) {
				return
			}
			func() {
				// Another goroutine's edit, awaited here: on a Registry
				// that calls OnChange under its mutation lock it waits
				// for this callback forever.
				go func() {
					_, err := reg.Create(context.Background(), "second")
					edited <- err
				}()
				select {
				case err := <-edited:
					edited <- err
				case <-time.After(5 * time.Second):
					edited <- context.DeadlineExceeded
				}
			}()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Create(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	if err := <-edited; err != nil {
		t.Fatalf("edit from another goroutine while OnChange ran: %v", err)
	}
	if _, err := reg.Get("second"); err != nil {
		t.Fatal(err)
	}
}

// TestRegistryRefreshKeepsNewest: refreshes that finish out of order never
// leave an older derived state in place of a newer one.
func TestRegistryRefreshKeepsNewest(t *testing.T) {
	tn := newTestNet(t, 1, 2)
	reg := tn.regs[0]
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := reg.Create(ctx, "svc"+string(rune('a'+i))); err != nil {
				t.Error(err)
			}
		}()
		go func() { defer wg.Done(); reg.Merged([]ServiceID{{}}) }()
	}
	wg.Wait()
	if got := len(reg.List()); got != 20 {
		t.Fatalf("List has %d services after 20 creates, want 20", got)
	}
}

type nopCarrier struct{}

func (nopCarrier) Send(context.Context, NodeID, []byte) error { return nil }

// TestReplicatorPeersRunsUnlocked: the rotation asks Peers with no
// Replicator lock held, so Peers may call the Replicator (here Stop, as an
// agent whose membership just emptied would).
func TestReplicatorPeersRunsUnlocked(t *testing.T) {
	tn := newTestNet(t, 2, 3)
	clk := transporttest.NewManualClock()
	var p *Replicator
	var asked atomic.Int32
	p, err := NewReplicator(ReplicatorOptions{Registry: tn.regs[0], Carrier: nopCarrier{}, Clock: clk, Seed: 1,
		Peers: func() []NodeID {
			asked.Add(1)
			p.Stop()
			return []NodeID{tn.nodes[1].ID}
		}})
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	testenv.Within(t, "a rotation whose Peers stops the Replicator", func() { clk.Advance(2 * DefaultRotation) })
	if asked.Load() == 0 {
		t.Fatal("Peers never asked")
	}
	if n := p.Stats().Rotations; n != 0 {
		t.Errorf("%d rotations ran after Peers stopped the Replicator", n)
	}
}
