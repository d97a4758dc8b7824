//go:build linux

package keelvip_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipkit/vipkit/claim"
	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
)

// vipLifetime returns the VIP's valid_lft on link in h (-1: absent).
func vipLifetime(t *testing.T, h *netns.Host, link string, vip netip.Addr) int {
	t.Helper()
	lk, err := h.Netlink().LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	as, err := h.Netlink().AddrList(lk, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip == vip {
			return a.ValidLft
		}
	}
	return -1
}

// TestLinkCarrierDeadline: CarryUntil writes valid_lft = floor(time left),
// refreshes it on a later deadline, drops the address (ErrDeadlinePassed)
// when under a second is left or the deadline has passed, and its own
// CLOCK_BOOTTIME timer drops it at the deadline; Carry writes forever.
func TestLinkCarrierDeadline(t *testing.T) {
	testenv.NeedRoot(t)
	h := keelvip.NewTUNHostT(t, "lft")
	m := mustMesh(t)
	vip := m.VIP
	c := keelvip.NewLinkCarrier(h.Netlink(), "wg0", nil, m, nil)
	ctx := context.Background()
	now := claim.BootClock{}.Now

	if err := c.CarryUntil(ctx, vip, now().Add(5500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := vipLifetime(t, h, "wg0", vip); got != 5 && got != 4 {
		t.Fatalf("valid_lft %d, want floor(5.5 s) = 5", got)
	}
	if err := c.CarryUntil(ctx, vip, now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := vipLifetime(t, h, "wg0", vip); got < 28 || got > 30 {
		t.Fatalf("valid_lft after the extension %d, want about 29", got)
	}
	for _, d := range []time.Duration{900 * time.Millisecond, 0, -time.Hour} {
		if err := c.CarryUntil(ctx, vip, now().Add(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := c.CarryUntil(ctx, vip, now().Add(d)); !errors.Is(err, claim.ErrDeadlinePassed) {
			t.Fatalf("%v left: %v, want ErrDeadlinePassed", d, err)
		}
		if got := vipLifetime(t, h, "wg0", vip); got != -1 {
			t.Fatalf("%v left: the address is still there (valid_lft %d)", d, got)
		}
	}
	// The helper's own timer drops it at the deadline (the kernel would
	// too, on its lifetime; both count here).
	deadline := now().Add(1500 * time.Millisecond)
	if err := c.CarryUntil(ctx, vip, deadline); err != nil {
		t.Fatal(err)
	}
	for vipLifetime(t, h, "wg0", vip) != -1 {
		if now().Sub(deadline) > time.Second {
			t.Fatalf("address still there %v after its deadline", now().Sub(deadline))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Carry(ctx, vip); err != nil {
		t.Fatal(err)
	}
	if got := vipLifetime(t, h, "wg0", vip); got != 1<<32-1 {
		t.Fatalf("Carry: valid_lft %d, want forever", got)
	}
}
