//go:build linux

package keelvip

import (
	"context"

	"os/signal"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
}

func runHelper(ctx context.Context, o HelperOptions) error { return RunHelper(ctx, o) }

func dropAll(ctx context.Context, m *Mesh) error {
	c := NewLinkCarrier(&netlink.Handle{}, m.Interface, nil, m, nil)
	if m.EventLog != "" {
		if l, err := OpenEventLog(m.EventLog, m.Self.ID, bootNow); err == nil {
			c.log = l
			defer l.Close()
		}
	}
	return c.DropAll(ctx)
}
