package vip

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/netip"
	"slices"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/probe"
)

// Status is this node's observation of one network's VIPs, as tsng's CLI
// (`vip status --json`) and web UI print it: the configuration with its
// revision, and the engine's counters and health observations. Counters are
// cumulative since the engine started (they reset on restart; watchers
// derive rates from them). They are IP forwarding counters, not delivered
// application bytes. Probe traffic is counted apart (Probe) and never in
// user traffic.
type Status struct {
	Network string     `json:"network"`
	Node    NodeID     `json:"node"`
	Addr    netip.Addr `json:"addr"` // this node's overlay address
	At      time.Time  `json:"at"`   // when the observation was taken (engine clock)

	Services []ServiceStatus `json:"services"`
	// Draining lists removed listeners (and listeners of a VIP whose
	// address moved) whose existing bindings still drain.
	Draining []ListenerStatus `json:"draining,omitempty"`

	// PassThrough is user traffic through the engine that is not VIP
	// traffic (straight to overlay addresses).
	PassThrough Traffic      `json:"pass_through"`
	Probe       ProbeTraffic `json:"probe"`
	Flow        FlowStatus   `json:"flow"`
	// Drops are the engine's own drops by reason: "queue-full" (engine-made
	// packets beyond EngineOptions.Queue), "too-big" (a packet larger than
	// wireguard-go's buffer), "unknown-peer" (a decrypted packet whose
	// source is no member's address), "host-write" (failed host writes),
	// "malformed" (a packet from a peer that is neither IPv4 nor IPv6).
	Drops map[string]uint64 `json:"drops,omitempty"`
	// Error reports listeners the engine could not apply.
	Error string `json:"error,omitempty"`
}

// Traffic counts IP packets and bytes in each direction: Out is toward the
// backend (or the overlay), In is back toward the client (the host).
type Traffic struct {
	PacketsOut uint64 `json:"packets_out"`
	BytesOut   uint64 `json:"bytes_out"`
	PacketsIn  uint64 `json:"packets_in"`
	BytesIn    uint64 `json:"bytes_in"`
}

// ProbeTraffic counts the data-plane probes, apart from user traffic.
type ProbeTraffic struct {
	PacketsOut uint64 `json:"packets_out"` // requests sent and replies to peers' requests
	BytesOut   uint64 `json:"bytes_out"`
	PacketsIn  uint64 `json:"packets_in"`
	BytesIn    uint64 `json:"bytes_in"`
	Rejected   uint64 `json:"rejected"` // malformed, late, unknown peer
	Answered   uint64 `json:"answered"` // peers' probes this node answered
	Expired    uint64 `json:"expired"`  // own probes that expired unanswered
}

// FlowStatus is the NAT's table and its drops.
type FlowStatus struct {
	Capacity    int               `json:"capacity"`
	Active      int               `json:"active"`
	Quarantined int               `json:"quarantined"`
	Created     uint64            `json:"created"`
	Failovers   uint64            `json:"udp_failovers"`
	Retargets   uint64            `json:"retargets"`
	Refused     uint64            `json:"refused"`
	Drops       map[string]uint64 `json:"drops,omitempty"`
}

// ServiceStatus is one VIP: its configuration, revision, effective address
// and name state, and its listeners' observations.
type ServiceStatus struct {
	ID           ServiceID        `json:"id"`
	Name         string           `json:"name"`
	Revision     Revision         `json:"revision"`
	Addr         netip.Addr       `json:"addr"`
	AddrMoved    bool             `json:"addr_moved,omitempty"`
	NameConflict string           `json:"name_conflict,omitempty"`
	Error        string           `json:"error,omitempty"`
	Routable     bool             `json:"routable"`
	Config       Service          `json:"config"`
	Listeners    []ListenerStatus `json:"listeners"`
}

// ListenerStatus is one listener's observation.
type ListenerStatus struct {
	Listener   string     `json:"listener"` // "tcp/443"
	VIP        netip.Addr `json:"vip"`
	Generation uint64     `json:"generation,omitempty"`
	// Routed is false for a listener of a service that is not routable.
	Routed   bool   `json:"routed"`
	Draining bool   `json:"draining,omitempty"`
	Error    string `json:"error,omitempty"`
	// Next is the backend a new flow would be bound to now; nil when none
	// is eligible.
	Next        *BackendRef `json:"next,omitempty"`
	Active      int         `json:"active_bindings"`
	Quarantined int         `json:"quarantined_bindings"`
	Created     uint64      `json:"bindings_created"`
	Failovers   uint64      `json:"udp_failovers"`
	Retargets   uint64      `json:"retargets"`
	Traffic
	Drops    map[string]uint64 `json:"drops,omitempty"`
	Backends []BackendStatus   `json:"backends"`
}

// BackendRef names a backend.
type BackendRef struct {
	Node     NodeID `json:"node"`
	NodeName string `json:"node_name,omitempty"`
	Port     uint16 `json:"port"`
}

// BackendStatus is one backend's health and traffic as this node sees it.
type BackendStatus struct {
	BackendRef
	Addr  netip.AddrPort `json:"addr,omitzero"`
	Local bool           `json:"local,omitempty"`
	// Reason is probe's health reason ("ok", "no-path", "probe-timeout",
	// "check-failed", "icmp-unreachable", "rtt-stale", "rtt-unknown"), or
	// "unknown-node" for a backend whose node has no overlay address.
	Reason           string     `json:"reason"`
	Eligible         bool       `json:"eligible"`
	CheckError       string     `json:"check_error,omitempty"`
	UnreachableUntil *time.Time `json:"unreachable_until,omitempty"`
	// RTTMillis is the smoothed path RTT when RTTKnown; SampleAgeMillis is
	// the newest sample's age, -1 without one.
	RTTMillis       float64 `json:"rtt_ms"`
	RTTKnown        bool    `json:"rtt_known"`
	SampleAgeMillis float64 `json:"sample_age_ms"`
	Active          int     `json:"active_bindings"`
	Traffic
	Drops map[string]uint64 `json:"drops,omitempty"`
}

// JSON returns the status as indented JSON.
func (s Status) JSON() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s) // every field marshals
	return b.Bytes()
}

func dropMap(d *[flow.NumDropReasons]uint64) map[string]uint64 {
	var m map[string]uint64
	for r, v := range d {
		if v == 0 {
			continue
		}
		if m == nil {
			m = map[string]uint64{}
		}
		m[flow.DropReason(r).String()] = v
	}
	return m
}

type bindKey struct {
	fl flow.Listener
	b  flow.Backend
}

type bindAgg struct {
	active int
	c      flow.Counters
}

// Status returns this node's observation of every service, listener and
// backend. It reads the NAT's tables (briefly taking its lock) and may be
// called at any time, also after Close (the counters then stay as they
// were).
func (e *Engine) Status() Status {
	now := e.clock.Now()
	st := Status{Network: e.reg.Network(), Node: e.self, Addr: e.selfAddr, At: now}

	agg := map[bindKey]*bindAgg{}
	for _, b := range e.nat.Bindings() {
		k := bindKey{b.Listener, b.Backend}
		a := agg[k]
		if a == nil {
			a = &bindAgg{}
			agg[k] = a
		}
		if b.State == flow.Active {
			a.active++
		}
		a.c.PacketsOut += b.PacketsOut
		a.c.BytesOut += b.BytesOut
		a.c.PacketsIn += b.PacketsIn
		a.c.BytesIn += b.BytesIn
		for r := range b.Drops {
			a.c.Drops[r] += b.Drops[r]
		}
	}

	e.cfgMu.Lock()
	applied := make(map[flow.Listener]*route, len(e.applied))
	for k, v := range e.applied {
		applied[k] = v
	}
	draining := make([]*route, 0, len(e.draining))
	for _, v := range e.draining {
		draining = append(draining, v)
	}
	if e.applyErr != nil {
		st.Error = e.applyErr.Error()
	}
	e.cfgMu.Unlock()
	pt := e.peers.Load()

	for _, v := range e.reg.List() {
		ss := ServiceStatus{
			ID: v.ID, Name: v.Name, Revision: v.Revision, Addr: v.Addr, AddrMoved: v.AddrMoved,
			NameConflict: v.NameConflict, Error: v.Err, Routable: v.Routable, Config: v.Service,
			Listeners: []ListenerStatus{},
		}
		for _, l := range v.Listeners {
			fl := flow.Listener{VIP: v.Addr, Proto: flow.Proto(l.Proto), Port: l.Port}
			r := applied[fl]
			if !v.Routable || r == nil || r.svc != v.ID {
				ls := ListenerStatus{Listener: l.Key().String(), VIP: v.Addr, Generation: l.Generation, Backends: []BackendStatus{}}
				for _, b := range l.Backends {
					ls.Backends = append(ls.Backends, BackendStatus{BackendRef: BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port}, Reason: "not-routed", SampleAgeMillis: -1})
				}
				ss.Listeners = append(ss.Listeners, ls)
				continue
			}
			ss.Listeners = append(ss.Listeners, e.listenerStatus(r, false, pt, agg, now))
		}
		st.Services = append(st.Services, ss)
	}
	slices.SortFunc(draining, func(a, b *route) int {
		return cmp.Or(a.fl.VIP.Compare(b.fl.VIP), cmp.Compare(a.fl.Proto, b.fl.Proto), cmp.Compare(a.fl.Port, b.fl.Port))
	})
	for _, r := range draining {
		ls := e.listenerStatus(r, true, pt, agg, now)
		ls.Next = nil
		st.Draining = append(st.Draining, ls)
	}

	ps, rs := e.prober.Stats(), e.responder.Stats()
	st.PassThrough = Traffic{
		PacketsOut: e.c.passOutPkts.Load(), BytesOut: e.c.passOutBytes.Load(),
		PacketsIn: e.c.passInPkts.Load(), BytesIn: e.c.passInBytes.Load(),
	}
	st.Probe = ProbeTraffic{
		PacketsOut: e.c.probeOutPkts.Load(), BytesOut: e.c.probeOutB.Load(),
		PacketsIn: e.c.probeInPkts.Load(), BytesIn: e.c.probeInB.Load(),
		Rejected: e.c.probeBad.Load(), Answered: rs.Answered, Expired: ps.Expired,
	}
	fs := e.nat.Stats()
	st.Flow = FlowStatus{
		Capacity: fs.Capacity, Active: fs.Active, Quarantined: fs.Quarantined, Created: fs.Created,
		Failovers: fs.Failovers, Retargets: fs.Retargets, Refused: fs.Refused, Drops: dropMap(&fs.Drops),
	}
	for name, v := range map[string]uint64{
		"queue-full": e.c.queueFull.Load(), "too-big": e.c.tooBig.Load(),
		"unknown-peer": e.c.unknownPeer.Load(), "host-write": e.c.hostWriteErr.Load(),
		"malformed": e.c.malformed.Load(),
	} {
		if v > 0 {
			if st.Drops == nil {
				st.Drops = map[string]uint64{}
			}
			st.Drops[name] = v
		}
	}
	return st
}

// ServiceStatus returns the status of one service (selected like
// Registry.Get: name, full id or unique id prefix).
func (e *Engine) ServiceStatus(sel string) (ServiceStatus, error) {
	v, err := e.reg.Get(sel)
	if err != nil {
		return ServiceStatus{}, err
	}
	for _, s := range e.Status().Services {
		if s.ID == v.ID {
			return s, nil
		}
	}
	return ServiceStatus{}, ErrNotFound
}

func (e *Engine) listenerStatus(r *route, draining bool, pt *peerTable, agg map[bindKey]*bindAgg, now time.Time) ListenerStatus {
	ls := ListenerStatus{Listener: r.key.String(), VIP: r.fl.VIP, Generation: r.gen, Routed: !draining, Draining: draining, Backends: []BackendStatus{}}
	if r.err != nil {
		ls.Error = r.err.Error()
	}
	if fs, ok := e.nat.ListenerStats(r.fl); ok {
		ls.Active, ls.Quarantined, ls.Created = fs.Active, fs.Quarantined, fs.Created
		ls.Failovers, ls.Retargets = fs.Failovers, fs.Retargets
		ls.Traffic = Traffic{PacketsOut: fs.PacketsOut, BytesOut: fs.BytesOut, PacketsIn: fs.PacketsIn, BytesIn: fs.BytesIn}
		ls.Drops = dropMap(&fs.Drops)
	}
	statuses, next := e.sel.Select(r.pbs, now, make([]probe.Status, 0, len(r.pbs)))
	if next >= 0 && !draining {
		b := r.cfg[next]
		ls.Next = &BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port}
	}
	for i, b := range r.cfg {
		s := statuses[i]
		bs := BackendStatus{
			BackendRef: BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port},
			Addr:       r.pbs[i].Addr, Local: r.pbs[i].Local,
			Reason: s.Reason.String(), Eligible: s.Eligible(),
			RTTKnown: s.RTTKnown, SampleAgeMillis: -1,
		}
		if s.RTTKnown {
			bs.RTTMillis = float64(s.RTT) / float64(time.Millisecond)
		}
		if s.SampleAge >= 0 {
			bs.SampleAgeMillis = float64(s.SampleAge) / float64(time.Millisecond)
		}
		if s.Err != nil {
			bs.CheckError = s.Err.Error()
		}
		if s.Reason == probe.ReasonICMPUnreachable {
			u := s.Until
			bs.UnreachableUntil = &u
		}
		if a := agg[bindKey{r.fl, r.backends[i]}]; a != nil {
			bs.Active = a.active
			bs.Traffic = Traffic{PacketsOut: a.c.PacketsOut, BytesOut: a.c.BytesOut, PacketsIn: a.c.PacketsIn, BytesIn: a.c.BytesIn}
			bs.Drops = dropMap(&a.c.Drops)
		}
		ls.Backends = append(ls.Backends, bs)
	}
	for _, b := range r.missing {
		ls.Backends = append(ls.Backends, BackendStatus{BackendRef: BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port}, Reason: "unknown-node", SampleAgeMillis: -1})
	}
	return ls
}
