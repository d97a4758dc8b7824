package probe

import "fmt"

// Reason is why a backend (or a peer's path) is or is not eligible. After
// ReasonOK the reasons are listed in precedence order: when several apply,
// the first one is reported. ReasonOK, ReasonRTTUnknown and ReasonRTTStale are eligible; the
// others exclude.
type Reason uint8

// Health reasons.
const (
	// ReasonOK: the path is up, a fresh RTT sample exists and every check
	// passes.
	ReasonOK Reason = iota
	// ReasonDisabled: the backend is disabled by configuration.
	ReasonDisabled
	// ReasonNoPath: the engine reports no data path to the peer (no
	// handshake, no route), or the prober does not track the peer.
	ReasonNoPath
	// ReasonProbeTimeout: MissLimit (2) consecutive probes to the peer
	// expired unanswered.
	ReasonProbeTimeout
	// ReasonCheckFailed: the TCP connect check failed Failures (2) times in a
	// row and has not yet succeeded Successes (1) times; Status.Err holds the
	// last error.
	ReasonCheckFailed
	// ReasonICMPUnreachable: the backend port was reported unreachable by an
	// ICMP error; Status.Until says when it becomes eligible again.
	ReasonICMPUnreachable
	// ReasonRTTStale: the path is up but the newest RTT sample is older than
	// StaleAfter (10 s). Eligible; ranked after backends with a known RTT.
	ReasonRTTStale
	// ReasonRTTUnknown: the path is up but no probe has been answered yet.
	// Eligible; ranked after backends with a known RTT.
	ReasonRTTUnknown
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonOK:              "ok",
	ReasonDisabled:        "disabled",
	ReasonNoPath:          "no-path",
	ReasonProbeTimeout:    "probe-timeout",
	ReasonCheckFailed:     "check-failed",
	ReasonICMPUnreachable: "icmp-unreachable",
	ReasonRTTStale:        "rtt-stale",
	ReasonRTTUnknown:      "rtt-unknown",
}

// String returns the reason's status name ("ok", "no-path", ...).
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Eligible reports whether a backend with this reason may be selected.
func (r Reason) Eligible() bool {
	return r == ReasonOK || r == ReasonRTTStale || r == ReasonRTTUnknown
}
