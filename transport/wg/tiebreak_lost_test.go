package wg

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// resendBind is a fakeBind that keeps every packet it sends, with its
// endpoint.
type resendBind struct {
	fakeBind
	// mu guards sends.
	mu sync.Mutex
	// +checklocks:mu
	sends []fakeRecv
}

func (f *resendBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range bufs {
		f.sends = append(f.sends, fakeRecv{p: bytes.Clone(b), ep: ep})
	}
	return nil
}

// TestTieBreakResendsOwnInitiation: when the tie-break drops the peer's
// crossing initiation, it sends our own pending initiation to that peer
// again, byte for byte, once. Our first copy may never have arrived (the
// peer was not listening yet); without the resend both sides would then
// wait for a response that never comes until wireguard-go's 5 s retry.
func TestTieBreakResendsOwnInitiation(t *testing.T) {
	epA := &wgtest.SimEndpoint{AddrPort: netip.MustParseAddrPort("10.9.0.1:51820")}
	clock := transporttest.NewManualClock()
	f := &resendBind{fakeBind: fakeBind{in: make(chan fakeRecv, 8)}}
	b, recv := openTieBreak(t, f, f.in, clock)
	ours := message(msgInitiation, initiationSize, 5)
	ours[100] = 0xab // something past the key, to check the copy is whole
	if err := b.Send([][]byte{ours}, epA); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Millisecond)
	if got := recv(fakeRecv{message(msgInitiation, initiationSize, 9), epA}); got != 0 {
		t.Fatalf("the crossing initiation with the greater key passed (%d bytes)", got)
	}
	f.mu.Lock()
	sends := append([]fakeRecv(nil), f.sends...)
	f.mu.Unlock()
	if len(sends) != 2 {
		t.Fatalf("%d packets sent, want our initiation and its resend", len(sends))
	}
	if !bytes.Equal(sends[1].p, ours) || sends[1].ep != epA {
		t.Fatalf("resent %d bytes to %v, want our %d-byte initiation to %v", len(sends[1].p), sends[1].ep, len(ours), epA)
	}
	// A second crossing initiation within the window is dropped too (the
	// rule stays symmetric) but ours is not sent a third time.
	clock.Advance(30 * time.Millisecond)
	if got := recv(fakeRecv{message(msgInitiation, initiationSize, 9), epA}); got != 0 {
		t.Fatalf("the second crossing initiation passed (%d bytes)", got)
	}
	f.mu.Lock()
	n := len(f.sends)
	f.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d packets sent after a second crossing, want 2 (one resend per initiation)", n)
	}
	if got := b.resent.Load(); got != 1 {
		t.Fatalf("resent counter %d, want 1", got)
	}
}

// TestLostInitiationThenCrossing: node a starts first and its initiation to
// b is lost (b's side is not reachable yet); b then starts and initiates
// while a's initiation is still inside the tie-break window. When a's lost
// initiation carries the smaller ephemeral key, a drops b's initiation;
// without the resend, neither side would then have a handshake in flight
// that could complete, and the leg would stay dead until wireguard-go's 5 s
// retry. The trial repeats with fresh keys until a has dropped b's
// initiation several times; each of those trials must still complete the
// handshake in a few round trips.
func TestLostInitiationThenCrossing(t *testing.T) {
	seed := testenv.Seed(t, 33)
	const wantDrops = 4
	drops := 0
	for trial := 0; trial < 40 && drops < wantDrops; trial++ {
		n := transporttest.NewNetwork(nil, seed+uint64(trial))
		if err := n.SetDefault(transporttest.LinkConfig{Latency: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		a := newRawNode(t, n, "a", "10.0.0.1")
		b := newRawNode(t, n, "b", "10.0.0.2")
		pa, pb := a.peer("10.0.0.1/32"), b.peer("10.0.0.2/32")
		pa.PersistentKeepalive, pb.PersistentKeepalive = 25*time.Second, 25*time.Second
		n.Cut(a.bind.Node(), b.bind.Node())
		a.start(t, pb)
		// a's first initiation reaches the cut link and is lost.
		deadline := time.Now().Add(5 * time.Second)
		for n.LinkStats(a.bind.Node(), b.bind.Node()).TotalDropped() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("trial %d: a sent no initiation towards b", trial)
			}
			time.Sleep(time.Millisecond) // polling a real-time wireguard-go device
		}
		n.HealLink(a.bind.Node(), b.bind.Node())
		start := time.Now()
		b.start(t, pa)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errA := a.dev.WaitHandshake(ctx, b.key.PublicKey())
		errB := b.dev.WaitHandshake(ctx, a.key.PublicKey())
		cancel()
		dropped := a.dev.CrossedInitiations()
		if dropped > 0 {
			drops++
		}
		if errA != nil || errB != nil {
			t.Fatalf("trial %d (seed %d): no handshake within 2 s of b's start (a dropped %d of b's initiations): a: %v, b: %v",
				trial, seed, dropped, errA, errB)
		}
		t.Logf("trial %d: handshake %v after b's start, a dropped %d crossing initiation(s)", trial, time.Since(start).Round(time.Millisecond), dropped)
		a.dev.Close()
		b.dev.Close()
		n.Close()
	}
	if drops < wantDrops {
		t.Fatalf("a dropped b's initiation in only %d trials: the test did not exercise the lost-initiation case", drops)
	}
}
