package vip

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

// TestEngineCloseDeviceFromPathUp closes the device while the engine's
// path tick is inside PathUp, then lets PathUp ask the device for its
// peers, as tsng's PathUp does. The device's Close closes the engine (its
// TUN); the tick must not hold a lock the engine's Close needs while it
// waits for the device.
func TestEngineCloseDeviceFromPathUp(t *testing.T) {
	readPaths(t, func(t *testing.T, readAhead bool) {
		var trigger atomic.Bool
		var nd *cnode
		var once sync.Once
		tried := make(chan error, 1)
		c := newCluster(t, clusterOptions{n: 2, prober: fastProber, readAhead: readAhead,
			engine: func(o *EngineOptions) {
				inner := o.PathUp
				o.PathInterval = 5 * time.Millisecond
				o.PathUp = func(id NodeID) bool {
					if !trigger.Load() {
						return inner(id)
					}
					once.Do(func() {
						go nd.dev.Close()
						// Ask the device until it is closed: on the old
						// code one of these asks waits for the device's
						// lock while the device's Close waits for the
						// engine's.
						var err error
						for end := time.Now().Add(testenv.DeadlockTimeout); time.Now().Before(end); {
							if _, err = nd.dev.Stats(); err != nil {
								break
							}
						}
						tried <- err
					})
					return inner(id)
				}
			}})
		nd = c.nodes[0]
		probePeer(t, c)
		testenv.Within(t, "device Close from PathUp", func() {
			trigger.Store(true)
			if err := <-tried; err == nil {
				t.Error("device still answers after Close")
			}
			nd.dev.Close()
			nd.engine().Close()
		})
	})
}

// TestEngineCloseOrders closes the engine and the device in both orders
// while path ticks, probes and Apply run; each Close returns in time.
func TestEngineCloseOrders(t *testing.T) {
	for _, deviceFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("deviceFirst=%v", deviceFirst), func(t *testing.T) {
			c := newCluster(t, clusterOptions{n: 2, prober: fastProber,
				engine: func(o *EngineOptions) { o.PathInterval = time.Millisecond }})
			nd := c.nodes[0]
			probePeer(t, c)
			// Wait for traffic of the engine's own: probes answered.
			deadline := time.Now().Add(10 * time.Second)
			for nd.engine().Status().Probe.PacketsIn == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no probe traffic within 10 s: the closes would not run under probes")
				}
				time.Sleep(5 * time.Millisecond)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wgr sync.WaitGroup
			wgr.Add(1)
			go func() {
				defer wgr.Done()
				for ctx.Err() == nil {
					_ = nd.engine().Apply()
				}
			}()
			dev := nd.dev
			testenv.Within(t, "Close", func() {
				if deviceFirst {
					dev.Close()
					nd.engine().Close()
				} else {
					nd.engine().Close()
					dev.Close()
				}
			})
			cancel()
			wgr.Wait()
		})
	}
}

// probePeer makes node 1 a backend of a service, so that node 0 probes it
// and asks PathUp about it on every path tick.
func probePeer(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	serveName(t, b, 8080)
	if _, err := a.reg.Create(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.reg.PortAdd(ctx, "web", PortKey{TCP, 80}, []Backend{{b.info.ID, 8080}}); err != nil {
		t.Fatal(err)
	}
	c.spread()
	if err := a.engine().Apply(); err != nil {
		t.Fatal(err)
	}
}
