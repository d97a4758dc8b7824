package tsng

import (
	"os"

	"github.com/vipkit/vipkit/transport/wg"
)

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid // +checklocksignore: a test hook, not changed while a network runs

// uapiDir is where the UAPI socket goes; tests replace it.
var uapiDir = wg.UAPIDir // +checklocksignore: a test hook, not changed while a network runs

// startUAPILocked serves the network's device read-only for `wg show`
// (tun mode, unless the config turns it off). Only root offers it: the
// socket lives in /var/run/wireguard, root's directory. Failing to serve
// it is logged and does not stop the network.
//
// +checklocks:n.mu
func (n *netRuntime) startUAPILocked(dev *wg.Device) {
	if n.cfg.Mode != "tun" || (n.cfg.UAPI != nil && !*n.cfg.UAPI) {
		return
	}
	log := n.d.log.With("network", n.cfg.Name)
	if geteuid() != 0 {
		log.Info("no UAPI socket: the agent does not run as root, so `wg show` will not list this device", "interface", n.tunName)
		return
	}
	s, err := dev.ServeUAPI(n.tunName, wg.UAPIOptions{Dir: uapiDir, Logger: log.With("part", "uapi")})
	if err != nil {
		log.Warn("no UAPI socket for `wg show`", "interface", n.tunName, "err", err)
		return
	}
	n.uapi = s
	log.Info("UAPI socket (read-only) for wg show", "path", s.Path(), "interface", n.tunName)
}
