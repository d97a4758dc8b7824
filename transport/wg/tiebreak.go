package wg

import (
	"bytes"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Crossing handshake initiations.
//
// When two peers send each other a handshake initiation at the same moment,
// the two initiations cross on the wire. Each side consumes the other's
// initiation as the responder, which replaces its own pending initiation;
// the response to its own initiation then matches nothing ("invalid
// response message") and neither side gets a session it may send with.
// wireguard-go retries after RekeyTimeout (5 s) plus up to 333 ms of
// jitter, and a response sent in the meantime can even suppress that retry.
// Peers that both keep a persistent keepalive re-initiate on a fixed period
// with no jitter, so once their phases are within one one-way delay of each
// other their initiations cross every time: on a 250 ms RTT link a leg can
// stay dead for minutes. The end-to-end tests saw exactly that.
//
// tieBreakBind resolves the crossing deterministically without knowing any
// key: an initiation carries its sender's ephemeral public key in clear, so
// both sides see both ephemerals and can agree on one winner. A node whose
// own initiation to an endpoint is still unanswered (sent less than
// tieBreakWindow ago, no response since) drops an initiation arriving from
// that endpoint whose ephemeral key is greater than its own. The winner's
// initiation is consumed by the other side, whose response completes the
// winner's handshake; the loser's initiation is dropped once, as if lost.
// Both sides apply the same rule to the same two keys, so exactly one
// initiation survives.
//
// The rule assumes the winner's initiation reaches the loser. It need not:
// a node that starts while its peer is already up sends its first
// initiation before the peer can hear it (or the network loses it), and
// then answers the peer's initiation, sent a moment later, by dropping it.
// Neither side would have a handshake in flight that can complete, and the
// leg would stay dead until wireguard-go's 5 s retry. So the winner, when
// it drops the loser's initiation, sends its own pending initiation to the
// loser again, byte for byte, once per initiation. If the first copy did
// arrive, the loser refuses the repeat as a replay (its timestamp is not
// newer than the one it consumed) and nothing changes; if it was lost, the
// repeat completes the handshake one round trip later.
//
// Nothing else changes: transport data, keepalives, responses and cookie
// replies pass untouched, and an initiation is only ever dropped when this
// node has its own pending initiation to the same endpoint, which carries
// the handshake on. The check on the data path is a length and a type byte.

const (
	// tieBreakWindow bounds how long an unanswered initiation of ours
	// makes us drop the peer's: a crossing initiation arrives within one
	// round trip of ours, and an older unanswered one was probably lost,
	// in which case the peer's initiation should go through.
	tieBreakWindow = time.Second

	msgInitiation     = 1
	msgResponse       = 2
	initiationSize    = 148 // device.MessageInitiationSize
	responseSize      = 92  // device.MessageResponseSize
	ephemeralOffset   = 8   // type (1), reserved (3), sender index (4)
	ephemeralKeyBytes = 32

	// maxPending bounds the endpoints remembered; past it, Send forgets
	// every initiation older than tieBreakWindow (they no longer count).
	maxPending = 1024
)

// pendingInit is this node's last initiation to one endpoint.
type pendingInit struct {
	at     time.Time
	msg    [initiationSize]byte // the whole initiation, for the resend
	resent bool                 // sent again once already
}

// tieBreakBind wraps a conn.Bind with the crossing-initiation tie-break.
type tieBreakBind struct {
	conn.Bind
	clock transport.Clock

	// mu guards pending.
	mu syncx.Mutex
	// pending holds our initiations in flight, by the endpoint's
	// DstToString.
	// +checklocks:mu
	pending map[string]pendingInit

	dropped atomic.Uint64 // the peer's crossing initiations dropped
	resent  atomic.Uint64 // our initiations sent again after a drop
}

func newTieBreakBind(b conn.Bind, clock transport.Clock) *tieBreakBind {
	return &tieBreakBind{Bind: b, clock: transport.Or(clock), pending: map[string]pendingInit{}}
}

// isMessage reports whether p is a WireGuard message of type typ and size n:
// the type byte followed by three reserved zero bytes.
func isMessage(p []byte, typ byte, n int) bool {
	return len(p) == n && p[0] == typ && p[1] == 0 && p[2] == 0 && p[3] == 0
}

// Open implements conn.Bind, wrapping every receive function.
func (b *tieBreakBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, p, err := b.Bind.Open(port)
	if err != nil {
		return nil, p, err
	}
	out := make([]conn.ReceiveFunc, len(fns))
	for i, fn := range fns {
		out[i] = b.receive(fn)
	}
	return out, p, nil
}

func (b *tieBreakBind) receive(fn conn.ReceiveFunc) conn.ReceiveFunc {
	return func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		n, err := fn(packets, sizes, eps)
		for i := 0; i < n; i++ {
			switch size := sizes[i]; {
			case size == initiationSize && isMessage(packets[i][:size], msgInitiation, initiationSize):
				drop, resend := b.losesCrossing(packets[i][:size], eps[i])
				if drop {
					// wireguard-go skips anything shorter than a
					// keepalive: this drops the packet in place.
					sizes[i] = 0
					b.dropped.Add(1)
				}
				if resend != nil && b.Bind.Send([][]byte{resend}, eps[i]) == nil {
					b.resent.Add(1)
				}
			case size == responseSize && isMessage(packets[i][:size], msgResponse, responseSize):
				b.answered(eps[i])
			}
		}
		return n, err
	}
}

// losesCrossing reports whether the initiation init from ep crosses a
// pending initiation of ours with a smaller ephemeral key. When it does and
// ours has not been sent again yet, resend is a copy of ours to send to ep.
func (b *tieBreakBind) losesCrossing(init []byte, ep conn.Endpoint) (drop bool, resend []byte) {
	if ep == nil {
		return false, nil
	}
	key := ep.DstToString()
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.pending[key]
	if !ok {
		return false, nil
	}
	if now.Sub(p.at) >= tieBreakWindow {
		delete(b.pending, key)
		return false, nil
	}
	ours := p.msg[ephemeralOffset : ephemeralOffset+ephemeralKeyBytes]
	if bytes.Compare(ours, init[ephemeralOffset:ephemeralOffset+ephemeralKeyBytes]) >= 0 {
		return false, nil
	}
	if !p.resent {
		p.resent = true
		b.pending[key] = p
		resend = bytes.Clone(p.msg[:])
	}
	return true, resend
}

// answered forgets the pending initiation to ep: a response came back.
func (b *tieBreakBind) answered(ep conn.Endpoint) {
	if ep == nil {
		return
	}
	key := ep.DstToString()
	b.mu.Lock()
	delete(b.pending, key)
	b.mu.Unlock()
}

// Send implements conn.Bind, noting every initiation it sends.
func (b *tieBreakBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	for _, p := range bufs {
		if isMessage(p, msgInitiation, initiationSize) && ep != nil {
			var pi pendingInit
			copy(pi.msg[:], p)
			pi.at = b.clock.Now()
			key := ep.DstToString()
			b.mu.Lock()
			if len(b.pending) >= maxPending {
				for k, q := range b.pending {
					if pi.at.Sub(q.at) >= tieBreakWindow {
						delete(b.pending, k)
					}
				}
			}
			b.pending[key] = pi
			b.mu.Unlock()
		}
	}
	return b.Bind.Send(bufs, ep)
}

// Close implements conn.Bind and forgets every pending initiation.
func (b *tieBreakBind) Close() error {
	b.mu.Lock()
	clear(b.pending)
	b.mu.Unlock()
	return b.Bind.Close()
}
