package wg

import (
	"errors"
	"log/slog"

	"github.com/vipkit/vipkit/transport"
)

// UAPIDir is where wg(8) looks for a userspace device's socket:
// UAPIDir/NAME.sock answers `wg show NAME` and `wg showconf NAME`.
const UAPIDir = "/var/run/wireguard"

// ErrUAPIDir means the socket directory is not one only root can change.
var ErrUAPIDir = errors.New("wg: UAPI socket directory is not root's alone")

// ErrUAPIInUse means another process serves a device of the same name in
// the socket directory. The directory is shared by every network
// namespace on the host, so two devices there need different names.
var ErrUAPIInUse = errors.New("wg: UAPI socket name in use")

// UAPIOptions configures ServeUAPI.
type UAPIOptions struct {
	// Dir is the socket directory (UAPIDir when empty).
	Dir string
	// Logger receives refused operations (a `wg set`); nil discards.
	Logger *slog.Logger
	// Clock sets the connections' deadlines (RealClock when nil).
	Clock transport.Clock
}
