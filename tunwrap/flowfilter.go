package tunwrap

import (
	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport"
)

// FlowFilter is the Filter of a flow.NAT: Outbound is NAT.FromHost and
// Inbound NAT.FromPeer, both at the clock's time. Pass and Forward accept
// the packet, Reflect reflects it into the host, Drop and Consumed drop
// it. The NAT's Options.Emit should be the Wrapper's Emit, so that
// fragments and ICMP errors the NAT produces are injected.
type FlowFilter struct {
	NAT *flow.NAT
	// Clock gives the time of each packet; nil means transport.RealClock.
	Clock transport.Clock
}

var _ Filter = FlowFilter{}

func (f FlowFilter) now() transport.Clock {
	if f.Clock == nil {
		return transport.RealClock{}
	}
	return f.Clock
}

// Outbound implements Filter with NAT.FromHost.
func (f FlowFilter) Outbound(pkt []byte) Verdict {
	return verdictOf(f.NAT.FromHost(pkt, f.now().Now()).Verdict)
}

// Inbound implements Filter with NAT.FromPeer. A packet from a source no
// peer owns goes to the NAT as from peer 0, which owns no backend.
func (f FlowFilter) Inbound(pkt []byte, peer flow.PeerID, _ bool) Verdict {
	return verdictOf(f.NAT.FromPeer(pkt, peer, f.now().Now()).Verdict)
}

func verdictOf(v flow.Verdict) Verdict {
	switch v {
	case flow.Pass, flow.Forward:
		return Accept
	case flow.Reflect:
		return Reflect
	}
	return Drop
}

// Emit injects a packet the NAT produced (flow.Options.Emit): toward the
// overlay with InjectOutbound, into the host with InjectInbound. A full
// queue drops it and counts it in Stats.InjectDropped.
func (w *Wrapper) Emit(dir flow.Direction, pkt []byte) {
	if dir == flow.ToHost {
		_ = w.InjectInbound(pkt)
		return
	}
	_ = w.InjectOutbound(pkt)
}
