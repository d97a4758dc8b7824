package keelvip

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"

	"github.com/vipkit/vipkit/claim"
)

// LogLevelEnv names the environment variable that sets the level of every
// keel-vip process's log (debug, info, warn or error; info when unset or
// unknown). The helper passes its environment to the controller and the
// listener, so one setting covers the node. At debug, the helper also logs
// wireguard-go's handshakes and keepalives, the listener logs every request
// it forwards, and the controller logs every answered call on the members'
// channel.
const LogLevelEnv = "KEEL_VIP_LOG_LEVEL"

// logLevel reads LogLevelEnv.
func logLevel() slog.Level {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(LogLevelEnv))) {
	case "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// newLog returns the text logger of one of a node's processes.
func newLog(w io.Writer, node, proc string) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: logLevel()})).With("node", node, "proc", proc)
}

// loggedChannel logs, at debug, every call the controller makes on the
// members' channel and its outcome (errors are reported by the controller
// itself, at warn).
type loggedChannel struct {
	claim.Channel
	log *slog.Logger
}

func (c loggedChannel) Announce(ctx context.Context, peer netip.Addr, cl *claim.Claim) error {
	err := c.Channel.Announce(ctx, peer, cl)
	c.log.Debug("announce", "peer", peer, "epoch", cl.Epoch, "holder", cl.Holder, "err", err)
	return err
}

func (c loggedChannel) Release(ctx context.Context, peer netip.Addr, r *claim.Release) (*claim.Claim, error) {
	cl, err := c.Channel.Release(ctx, peer, r)
	c.log.Debug("release", "peer", peer, "next_epoch", r.NextEpoch, "err", err)
	return cl, err
}

func (c loggedChannel) Epoch(ctx context.Context, peer netip.Addr, vip netip.Addr) (*claim.Claim, error) {
	cl, err := c.Channel.Epoch(ctx, peer, vip)
	var ep uint64
	if cl != nil {
		ep = cl.Epoch
	}
	c.log.Debug("epoch", "peer", peer, "epoch", ep, "err", err)
	return cl, err
}

// HandOver implements claim.HandOverChannel when the wrapped channel does.
func (c loggedChannel) HandOver(ctx context.Context, peer netip.Addr, vip netip.Addr) error {
	hc, ok := c.Channel.(claim.HandOverChannel)
	if !ok {
		return fmt.Errorf("%w: the members' channel has no hand-over", claim.ErrNoHandOver)
	}
	err := hc.HandOver(ctx, peer, vip)
	c.log.Debug("handover", "peer", peer, "err", err)
	return err
}
