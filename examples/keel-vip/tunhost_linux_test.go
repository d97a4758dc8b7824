//go:build linux

package keelvip

import (
	"testing"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/transport/netns"
)

// NewTUNHostT returns a fresh network namespace with a kernel TUN named
// wg0 up in it, the interface a member carries its VIPs on; both are
// removed when the test ends. It is exported for the external tests.
func NewTUNHostT(t *testing.T, name string) *netns.Host {
	t.Helper()
	h := netns.NewHostT(t, name)
	if err := h.Do(func() error {
		dev, err := tun.CreateTUN("wg0", 1420)
		if err == nil {
			t.Cleanup(func() { dev.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.SetUp("wg0"); err != nil {
		t.Fatal(err)
	}
	return h
}
