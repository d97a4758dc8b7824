package tsng

import (
	"errors"
	"fmt"
	"os"

	"github.com/vipkit/vipkit/transport/wg"
)

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid // +checklocksignore: a test hook, not changed while a network runs

// uapiDir is where the UAPI socket goes; tests replace it.
var uapiDir = wg.UAPIDir // +checklocksignore: a test hook, not changed while a network runs

// startUAPILocked serves the network's device read-only for `wg show`
// (tun mode, unless the config turns it off). Only root offers it: the
// socket lives in /var/run/wireguard, root's directory. A name another
// process serves there fails the start: every network namespace on the
// host shares the directory, so `wg show` would show the other device.
// Any other failure to serve it is logged and does not stop the network.
//
// +checklocks:n.mu
func (n *netRuntime) startUAPILocked(dev *wg.Device) error {
	if n.cfg.Mode != "tun" || (n.cfg.UAPI != nil && !*n.cfg.UAPI) {
		return nil
	}
	log := n.d.log.With("network", n.cfg.Name)
	if geteuid() != 0 {
		log.Info("no UAPI socket: the agent does not run as root, so `wg show` will not list this device", "interface", n.tunName)
		return nil
	}
	s, err := dev.ServeUAPI(n.tunName, wg.UAPIOptions{Dir: uapiDir, Logger: log.With("part", "uapi")})
	if errors.Is(err, wg.ErrUAPIInUse) {
		return fmt.Errorf("%s.tun: interface name %q is taken on this host: %w; every network namespace shares %s, so set tun to a name no other agent or WireGuard device here uses (or uapi to false)",
			n.where(), n.tunName, err, uapiDir)
	}
	if err != nil {
		log.Warn("no UAPI socket for `wg show`", "interface", n.tunName, "err", err)
		return nil
	}
	n.uapi = s
	log.Info("UAPI socket (read-only) for wg show", "path", s.Path(), "interface", n.tunName)
	return nil
}

// where is the network's config path, such as `networks[0] (home)`.
func (n *netRuntime) where() string {
	return fmt.Sprintf("networks[%d] (%s)", n.index.Load(), n.cfg.Name)
}
