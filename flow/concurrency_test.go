package flow

import (
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/packet"
)

// Both packet sides, the clock-driven sweep and the control API run at
// once (checked by -race), and the bounds hold throughout.
func TestConcurrentSidesSweepAndControl(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Capacity = 64 })
	setTCP(t, f, be1, be2)
	setUDP(t, f, be1, be2)
	var mu sync.Mutex
	var replies [][]byte
	var wg sync.WaitGroup
	const iters = 3000
	wg.Add(4)
	go func() { // host side
		defer wg.Done()
		for i := range iters {
			p := udpTo(uint16(1000+i%100), "x")
			if i%3 == 0 {
				p = syn(uint16(2000+i%50), uint32(i))
			}
			if f.nat.FromHost(p, f.clock.Now()).Verdict == Forward {
				mu.Lock()
				replies = append(replies, p)
				mu.Unlock()
			}
		}
	}()
	go func() { // peer side
		defer wg.Done()
		for i := range iters {
			mu.Lock()
			var p []byte
			if len(replies) > 0 {
				p = replyTo(replies[i%len(replies)], packet.TCPFlagACK, "y")
			}
			mu.Unlock()
			if p != nil {
				f.nat.FromPeerBatch([][]byte{p}, be1.Peer, f.clock.Now(), make([]Result, 1))
			}
		}
	}()
	go func() { // time
		defer wg.Done()
		for range iters / 10 {
			f.clock.Advance(7 * time.Second)
		}
	}()
	go func() { // control
		defer wg.Done()
		for i := range iters / 10 {
			f.nat.HealthChanged()
			if i%2 == 0 {
				f.nat.RemoveBackend(lUDP, be1)
			} else {
				if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}); err != nil {
					t.Errorf("SetListener: %v", err)
					return
				}
			}
			_ = f.nat.Bindings()
			_ = f.nat.Stats()
		}
	}()
	wg.Wait()
	st := f.nat.Stats()
	if st.Active+st.Quarantined > 64 {
		t.Fatalf("st.Active+st.Quarantined = %v, want <= %v", st.Active+st.Quarantined, 64)
	}
	if st.Created <= 0 {
		t.Fatalf("st.Created = %v, want > 0", st.Created)
	}
	if err := f.nat.Close(); err != nil {
		t.Fatalf("f.nat.Close(): %v", err)
	}
	if got := f.res.InUse(); got != 0 {
		t.Fatalf("f.res.InUse() = %v, want %v", got, 0)
	}
}
