//go:build linux

package keelvip

import (
	"context"
	"io"

	"os/signal"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
}

func runHelper(ctx context.Context, m *Mesh, raw []byte, exe, setpriv string, logw io.Writer) error {
	return RunHelper(ctx, HelperOptions{Mesh: m, MeshRaw: raw, Exe: exe, Setpriv: setpriv, Log: logw})
}

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
