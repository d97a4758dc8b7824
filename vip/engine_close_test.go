package vip

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/wg"
)

// closeDeadline bounds every Close in these tests. A Close that takes
// longer is a deadlock: the test dumps every goroutine and ends the binary
// instead of leaving CI hung.
const closeDeadline = 5 * time.Second

// within runs f and waits for it up to closeDeadline.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(closeDeadline):
		// A deadlocked Close cannot be cleaned up after: end the binary
		// with every goroutine's stack rather than hang in the cleanups.
		// (A panic on the test's goroutine would run them first.)
		debug.SetTraceback("all")
		msg := fmt.Sprintf("%s: %s still running after %v", t.Name(), what, closeDeadline)
		go func() { panic(msg) }()
		select {}
	}
}

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
						for end := time.Now().Add(closeDeadline); time.Now().Before(end); {
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
		within(t, "device Close from PathUp", func() {
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
			ctx, cancel := context.WithCancel(context.Background())
			var wgr sync.WaitGroup
			wgr.Add(1)
			go func() {
				defer wgr.Done()
				for ctx.Err() == nil {
					_ = nd.engine().Apply()
				}
			}()
			// Wait for traffic of the engine's own: probes answered.
			deadline := time.Now().Add(10 * time.Second)
			for nd.engine().Status().Probe.PacketsIn == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			var dev *wg.Device = nd.dev
			within(t, "Close", func() {
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
