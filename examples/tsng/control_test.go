package tsng

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/vip"
)

func TestControlChannel(t *testing.T) {
	a, b := netip.MustParseAddr("127.0.0.21"), netip.MustParseAddr("127.0.0.22")
	ka, ida := testKey("A")
	kb, idb := testKey("B")
	keys := map[vip.NodeID]ed25519.PrivateKey{ida: ka, idb: kb}
	addrs := map[vip.NodeID]netip.Addr{ida: a, idb: b}
	peer := func(x netip.Addr) (vip.NodeID, bool) {
		for id, ad := range addrs {
			if ad == x {
				return id, true
			}
		}
		return vip.NodeID{}, false
	}
	addr := func(id vip.NodeID) (netip.Addr, bool) { x, ok := addrs[id]; return x, ok }
	var mu sync.Mutex
	got := map[vip.NodeID][]string{}
	mk := func(self netip.Addr, me vip.NodeID) *Control {
		c, err := NewControl(context.Background(), ControlOptions{Net: KernelNet{Self: self}, Self: self, Port: 51931, Key: keys[me], Peer: peer, Addr: addr, MaxFrame: 1024,
			Handle: func(_ context.Context, from vip.NodeID, f []byte) error {
				mu.Lock()
				got[me] = append(got[me], from.String()[:2]+":"+string(f))
				mu.Unlock()
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca, cb := mk(a, ida), mk(b, idb)
	for _, f := range []string{"one", "two", "three"} {
		if err := ca.Send(context.Background(), idb, []byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	cb.Send(context.Background(), ida, []byte("back"))
	if err := ca.Send(context.Background(), idb, make([]byte, 1025)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got[idb]) == 3 && len(got[ida]) == 1
	})
	mu.Lock()
	if got[idb][0] != ida.String()[:2]+":one" || got[idb][2] != ida.String()[:2]+":three" || got[ida][0] != idb.String()[:2]+":back" {
		t.Fatalf("frames %v", got)
	}
	mu.Unlock()
	// A connection from an address that is no member's is refused.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.23")}}
	conn, err := d.Dial("tcp", "127.0.0.22:51931")
	if err == nil {
		conn.Write([]byte{0, 0, 0, 1, 'x'})
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, rerr := conn.Read(make([]byte, 1))
		conn.Close()
		if rerr == nil {
			t.Fatal("unauthenticated connection stayed open")
		}
	}
	waitFor(t, func() bool { return cb.Stats().Refused >= 1 })
	ca.Close()
	cb.Close()
	if err := ca.Send(context.Background(), idb, []byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
