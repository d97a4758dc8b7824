package vip

import (
	"slices"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/probe"
)

// pathTick passes the data-path input to the prober and tells the NAT when
// a peer's eligibility changed, so that UDP bindings fail over.
func (e *Engine) pathTick() {
	if e.isClosed() {
		return
	}
	// PathUp is the user's: it runs with no engine lock held (it may ask
	// the WireGuard device, whose Close closes this engine). The ids are a
	// snapshot; a peer that Apply drops meanwhile is skipped below, and one
	// it adds is asked on the next tick.
	var ids []NodeID
	var ups []bool
	if e.o.PathUp != nil {
		e.cfgMu.Lock()
		ids = e.pathIDs[:0]
		for id := range e.probed {
			ids = append(ids, id)
		}
		e.pathIDs = ids[:0]
		e.cfgMu.Unlock()
		ups = e.pathUps[:0]
		for _, id := range ids {
			ups = append(ups, e.o.PathUp(id))
		}
		e.pathUps = ups[:0]
		if e.isClosed() {
			return
		}
	}

	now := e.clock.Now()
	changed := false
	e.cfgMu.Lock()
	_ = e.syncProbedLocked(now) // no peer is added here: draining peers were probed
	e.pruneTotals()
	for i, id := range ids {
		if _, ok := e.probed[id]; ok {
			_ = e.prober.SetPath(probe.NodeID(id), ups[i])
		}
	}
	for id := range e.probed {
		el := e.prober.Health(probe.NodeID(id), now).Eligible()
		if prev, ok := e.eligible[id]; !ok || prev != el {
			e.eligible[id] = el
			changed = true
		}
	}
	e.pruneDrainingLocked()
	e.cfgMu.Unlock()
	if changed {
		e.nat.HealthChanged()
	}
	e.pathMu.Lock()
	if !e.isClosed() {
		e.pathTimer.Reset(e.pathEvery)
	}
	e.pathMu.Unlock()
}

// engineSelector is the Engine seen as flow's Selector: flow calls it with
// its lock held, which serializes the use of the scratch slices.
type engineSelector Engine

func (s *engineSelector) Select(req flow.SelectRequest) int {
	e := (*Engine)(s)
	bs := e.backendsFor(req.Listener, req.Candidates)
	var i int
	e.selStatus, i = e.selector.Select(bs, req.Now, e.selStatus[:0])
	return i
}

func (s *engineSelector) Available(l flow.Listener, b flow.Backend, now time.Time) bool {
	e := (*Engine)(s)
	pb := e.probeBackend(l, b)
	pb.Disabled = false // a draining backend keeps the bindings it has
	return e.selector.Evaluate(&pb, now).Eligible()
}

// backendsFor returns the probe view of cands: the route's own slice when
// the NAT's candidates are the applied ones (always, but for a change in
// flight), else one built in the scratch slice.
func (e *Engine) backendsFor(l flow.Listener, cands []flow.Backend) []probe.Backend {
	r := e.routes.Load().m[l]
	if r != nil && slices.Equal(r.backends, cands) {
		return r.pbs
	}
	e.selBackends = e.selBackends[:0]
	for _, c := range cands {
		e.selBackends = append(e.selBackends, e.probeBackend(l, c))
	}
	return e.selBackends
}

// probeBackend returns the probe view of backend b of listener l.
func (e *Engine) probeBackend(l flow.Listener, b flow.Backend) probe.Backend {
	if r := e.routes.Load().m[l]; r != nil {
		for i := range r.backends {
			if r.backends[i] == b {
				return r.pbs[i]
			}
		}
	}
	pb := probe.Backend{Local: b.Peer == flow.LocalPeer, Proto: uint8(l.Proto), Addr: b.AddrPort()}
	if b.Peer == flow.LocalPeer {
		pb.Node = probe.NodeID(e.self)
	} else {
		pb.Node = probe.NodeID(e.peers.Load().node[b.Peer])
	}
	return pb
}

// portUnreachable is flow's OnPortUnreachable: the backend is excluded for
// UnreachableHold (flow then re-asks Available of UDP bindings).
func (e *Engine) portUnreachable(l flow.Listener, b flow.Backend) {
	pb := e.probeBackend(l, b)
	_, _ = e.unreach.Report(probe.UnreachableKey{Node: pb.Node, Proto: pb.Proto, Addr: pb.Addr}, e.clock.Now())
}

// sendProbe is the prober driver's send: a probe request through the
// tunnel to the peer's overlay address.
func (e *Engine) sendProbe(p probe.Probe) {
	addr, ok := e.peers.Load().addr[NodeID(p.Peer)]
	if !ok {
		return
	}
	pkt, err := p.AppendIPv4(make([]byte, 0, probe.PacketLen), e.selfAddr, addr, e.probePort)
	if err != nil {
		return
	}
	if e.injectOverlay(pkt) {
		e.counters.probeOutPkts.Add(1)
		e.counters.probeOutBytes.Add(uint64(len(pkt)))
	}
}

// handleProbe answers a probe request or measures a probe reply; probes
// never reach the host and never count as user traffic.
func (e *Engine) handleProbe(pkt []byte, pt *peerTable, peer flow.PeerID, now time.Time) {
	e.counters.probeInPkts.Add(1)
	e.counters.probeInBytes.Add(uint64(len(pkt)))
	_, dst, payload, err := probe.ParseIPv4UDP(pkt)
	if err != nil || len(payload) < 4 || dst.Port() != e.probePort {
		e.counters.probeBad.Add(1)
		return
	}
	switch probe.MessageType(payload[3]) {
	case probe.TypeRequest:
		if peer == unknownPeer { // only members are answered
			e.counters.probeBad.Add(1)
			return
		}
		if !e.replyAllowed(peer, now) {
			e.counters.probeBad.Add(1)
			return
		}
		reply, err := e.responder.RespondIPv4(pkt, make([]byte, 0, probe.PacketLen))
		if err != nil {
			e.counters.probeBad.Add(1)
			return
		}
		if e.injectOverlay(reply) {
			e.counters.probeOutPkts.Add(1)
			e.counters.probeOutBytes.Add(uint64(len(reply)))
		}
	case probe.TypeReply:
		node, ok := pt.node[peer]
		if !ok {
			e.counters.probeBad.Add(1)
			return
		}
		if e.prober.HandleReply(probe.NodeID(node), payload, now) != nil {
			e.counters.probeBad.Add(1)
		}
	default:
		e.counters.probeBad.Add(1)
	}
}

// Probe replies per peer: a member's prober sends one request per interval
// (1 s by default, 250 ms at the fastest anyone configures), so a member
// asking for more than probeReplyRate a second (after a burst of as many)
// is flooding. Its excess is refused and counted with the rejected probes:
// replies go through the engine's own queue ahead of host traffic, and a
// flood answered in full would crowd the host out.
const probeReplyRate = 64

// replyBucket is one peer's token bucket for probe replies.
type replyBucket struct {
	tokens float64
	at     time.Time
}

// replyAllowed takes a token from peer's bucket. It runs on Write's
// goroutine, which owns replyBuckets.
func (e *Engine) replyAllowed(peer flow.PeerID, now time.Time) bool {
	if e.replyBuckets == nil {
		e.replyBuckets = map[flow.PeerID]*replyBucket{}
	}
	b := e.replyBuckets[peer]
	if b == nil {
		b = &replyBucket{tokens: probeReplyRate, at: now}
		e.replyBuckets[peer] = b
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(probeReplyRate, b.tokens+d.Seconds()*probeReplyRate)
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
