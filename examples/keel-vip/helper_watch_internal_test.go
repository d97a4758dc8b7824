//go:build linux

package keelvip

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipkit/vipkit/internal/testenv"
)

// TestHelperFollowsControllerProcess: the helper drops every VIP when the
// controller process it serves exits, and when a controller process it
// has not served before (a restart) sends its first request.
func TestHelperFollowsControllerProcess(t *testing.T) {
	testenv.NeedRoot(t)
	h, _, _, _ := testHelper(t)
	host := NewTUNHostT(t, "watch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.ctx = ctx
	h.carrier = NewLinkCarrier(host.Netlink(), "wg0", nil, h.m, nil)
	vip := h.m.VIP
	carried := func() bool {
		lk, err := host.Netlink().LinkByName("wg0")
		if err != nil {
			t.Fatal(err)
		}
		as, _ := host.Netlink().AddrList(lk, netlink.FAMILY_V6)
		for _, a := range as {
			if a.IP.Equal(vip.AsSlice()) {
				return true
			}
		}
		return false
	}
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	first, second := start(), start()

	h.controllerSeen(first.Process.Pid)
	if err := h.carrier.Carry(ctx, vip); err != nil {
		t.Fatal(err)
	}
	h.controllerSeen(first.Process.Pid) // the same process: nothing changes
	if !carried() {
		t.Fatal("the VIP went on a request of the same controller")
	}
	// A new controller process: it holds nothing yet, so the VIP goes.
	h.controllerSeen(second.Process.Pid)
	if carried() {
		t.Fatal("a restarted controller's first request left the VIP on")
	}
	// The controller process exits: the VIP goes at once.
	if err := h.carrier.Carry(ctx, vip); err != nil {
		t.Fatal(err)
	}
	_ = second.Process.Kill()
	_ = second.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for carried() {
		if time.Now().After(deadline) {
			t.Fatal("the VIP stayed after the controller process exited")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
