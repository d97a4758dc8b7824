package probe

import (
	"errors"
	"fmt"

	"github.com/vipkit/vipkit/transport"
)

// Sentinel errors. Functions wrap them with %w and add detail; match them
// with errors.Is.
var (
	// ErrInvalidOptions is returned by the constructors and by Acquire
	// when an option is out of range (negative durations, a probe timeout
	// spanning more outstanding probes than MaxOutstanding, ...). The
	// message names the option.
	ErrInvalidOptions = errors.New("probe: invalid options")

	// ErrInvalidConfig is another name for ErrInvalidOptions: the same
	// error value, so errors.Is matches either.
	//
	// Deprecated: use ErrInvalidOptions.
	ErrInvalidConfig = ErrInvalidOptions

	// ErrMalformed is returned by ParseMessage, Prober.HandleReply and
	// Responder for a probe message that is too short, too long or lacks the
	// magic.
	ErrMalformed = errors.New("probe: malformed probe message")

	// ErrVersion is returned for a well-framed probe message of a version
	// this package does not speak. Such a request is never answered.
	ErrVersion = errors.New("probe: unsupported probe version")

	// ErrMessageType is returned when a request arrives where a reply is
	// expected or the other way round (a Responder never answers a reply, so
	// two responders cannot loop).
	ErrMessageType = errors.New("probe: unexpected probe message type")

	// ErrSession is returned by Prober.HandleReply for a reply to a probe of
	// another Prober (an earlier run of the agent, or another network).
	ErrSession = errors.New("probe: reply from another prober session")

	// ErrUnmatchedReply is returned by Prober.HandleReply for a reply that
	// matches no outstanding probe: late (after the probe expired),
	// duplicated, replayed, for a sequence never sent, or with a wrong nonce.
	// It never produces an RTT sample.
	ErrUnmatchedReply = errors.New("probe: reply matches no outstanding probe")

	// ErrUnknownPeer is returned for a peer the Prober does not track.
	ErrUnknownPeer = errors.New("probe: unknown peer")

	// ErrPeerLimit is returned by Prober.AddPeer when MaxPeers peers are
	// already tracked. The message names the limit.
	ErrPeerLimit = errors.New("probe: probed peer limit reached")

	// ErrPacket is returned by ParseIPv4UDP and Responder.RespondIPv4 for a
	// packet that is not a well-formed, unfragmented IPv4/UDP datagram with
	// valid checksums.
	ErrPacket = errors.New("probe: malformed IPv4/UDP packet")

	// ErrNotProbe is returned by Responder.RespondIPv4 for a valid UDP
	// datagram that is not addressed to the probe port.
	ErrNotProbe = errors.New("probe: not a probe packet")

	// ErrShortBuffer is returned when an output buffer cannot hold a
	// packet.
	ErrShortBuffer = errors.New("probe: output buffer too short")

	// ErrCheckLimit is returned by Checker.Acquire and Scheduler.Acquire when
	// a new check target would exceed the active TCP check limit (32 by
	// default). The message names the limit. Subscribing to a target that is
	// already checked never fails this way: checks are shared.
	ErrCheckLimit = errors.New("probe: active TCP check limit reached")

	// ErrCheckTimeout is the last error of a connect check that did not
	// complete within its timeout.
	ErrCheckTimeout = errors.New("probe: connect check timed out")

	// ErrUnreachableFull is returned by Unreachable.Report when the table
	// holds MaxEntries unexpired entries; the report is counted as dropped.
	ErrUnreachableFull = errors.New("probe: unreachable table full")

	// ErrClosed is returned by the methods of a closed Checker or Driver. It
	// matches transport.ErrClosed and net.ErrClosed.
	ErrClosed = fmt.Errorf("probe: %w", transport.ErrClosed)
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
}
