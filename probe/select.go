package probe

import (
	"net/netip"
	"time"
)

// IP protocol numbers for Backend.Proto and UnreachableKey.Proto.
const (
	ProtoTCP uint8 = 6
	ProtoUDP uint8 = 17
)

// Backend is one backend of a listener as the selector sees it.
type Backend struct {
	Node  NodeID // the node the application runs on
	Local bool   // the node is this client itself: path RTT 0, no probe
	Proto uint8  // ProtoTCP or ProtoUDP
	// Addr is where the application listens: the node's overlay address
	// (or the local address for a local backend) and the application port.
	Addr netip.AddrPort
	// Check is the listener's subscription to the backend's TCP connect
	// check; nil when port checks are off (and always for UDP).
	Check    *Subscription
	Disabled bool // excluded by configuration
}

// Status is a backend's health at one time: whether it is eligible, why,
// and its path RTT. It is what status reports show per backend.
type Status struct {
	Reason Reason
	Err    error     // the last check error, with ReasonCheckFailed
	Until  time.Time // the end of the exclusion, with ReasonICMPUnreachable

	// RTT is the smoothed path RTT; it counts only when RTTKnown. A local
	// backend has RTT 0, known. An unknown or stale RTT is never ranked as
	// zero.
	RTT       time.Duration
	RTTKnown  bool
	SampleAge time.Duration // age of the newest RTT sample; -1 when there is none
}

// Eligible reports whether the backend may take new flows.
func (s Status) Eligible() bool { return s.Reason.Eligible() }

// Selector derives backend health from the prober (path and RTT per peer),
// the connect checks (through each Backend's Subscription) and the ICMP
// unreachable table, and picks the backend for a new flow. Its fields are
// set once before use; a nil Prober means no path is known (every remote
// backend is ReasonNoPath), a nil Unreachable means no port was reported.
//
// A Selector is safe for concurrent use if its parts are (they are). Evaluate
// and Select do not allocate (Select appends to a slice the caller reuses).
type Selector struct {
	Prober      *Prober
	Unreachable *Unreachable
}

// Evaluate returns b's status at now. Reasons apply in this order:
// disabled; for a remote backend no-path, probe-timeout; check-failed;
// icmp-unreachable; then, eligible, rtt-stale or rtt-unknown for a remote
// backend without a fresh sample, else ok.
func (s *Selector) Evaluate(b *Backend, now time.Time) Status {
	st := Status{SampleAge: -1}
	var path Reason
	if b.Local {
		st.RTTKnown, st.SampleAge, path = true, 0, ReasonOK
	} else if s.Prober == nil {
		path = ReasonNoPath
	} else {
		h := s.Prober.Health(b.Node, now)
		st.RTT, st.RTTKnown, st.SampleAge, path = h.RTT, h.RTTKnown, h.SampleAge, h.Reason
		if !st.RTTKnown {
			st.RTT = 0
		}
	}
	switch {
	case b.Disabled:
		st.Reason = ReasonDisabled
		return st
	case !path.Eligible():
		st.Reason = path
		return st
	}
	if b.Check != nil {
		if cs := b.Check.Status(); !cs.Passing {
			st.Reason, st.Err = ReasonCheckFailed, cs.LastErr
			return st
		}
	}
	if s.Unreachable != nil {
		if until, ok := s.Unreachable.Until(UnreachableKey{Node: b.Node, Proto: b.Proto, Addr: b.Addr}, now); ok {
			st.Reason, st.Until = ReasonICMPUnreachable, until
			return st
		}
	}
	st.Reason = path
	return st
}

// Select evaluates every backend at now, appending their statuses to st[:0]
// (reuse st across calls to avoid allocation), and returns the statuses and
// the index of the backend chosen by Pick, or -1 when none is eligible.
func (s *Selector) Select(bs []Backend, now time.Time, st []Status) ([]Status, int) {
	st = st[:0]
	for i := range bs {
		st = append(st, s.Evaluate(&bs[i], now))
	}
	return st, Pick(bs, st)
}

// Pick returns the index of the best eligible backend, or -1 when none is
// eligible. st[i] is bs[i]'s status. The rules, in order:
//
//  1. only eligible backends are candidates;
//  2. a known RTT (a local backend's 0 included) ranks before an unknown or
//     stale one, which is never treated as zero;
//  3. a lower smoothed RTT ranks first;
//  4. ties break by node id, then address, then position: the choice does
//     not depend on the order of the list.
func Pick(bs []Backend, st []Status) int {
	best := -1
	for i := range bs {
		if i >= len(st) || !st[i].Eligible() {
			continue
		}
		if best < 0 || better(&bs[i], &st[i], &bs[best], &st[best]) {
			best = i
		}
	}
	return best
}

func better(a *Backend, as *Status, b *Backend, bs *Status) bool {
	if as.RTTKnown != bs.RTTKnown {
		return as.RTTKnown
	}
	if as.RTTKnown && as.RTT != bs.RTT {
		return as.RTT < bs.RTT
	}
	if c := a.Node.compare(b.Node); c != 0 {
		return c < 0
	}
	return a.Addr.Compare(b.Addr) < 0 // equal: the earlier position stays best
}
