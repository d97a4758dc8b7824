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
// cumulative since the engine started and reset only on restart, so
// watchers derive rates from them: a backend's counters survive the expiry
// of its bindings and last as long as the backend is configured (and while
// a removed one still drains); a removed backend's counts stay in its
// listener's, and a removed listener's in its VIP's Totals. They are IP
// forwarding counters, not delivered application bytes. Probe traffic is
// counted apart (Probe) and never in user traffic.
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
	// AddrCollisions lists members whose overlay address is a VIP's stored
	// reservation (the VIP then uses another address; see AddrCollision).
	AddrCollisions []AddrCollision `json:"addr_collisions,omitempty"`
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
	Rejected   uint64 `json:"rejected"` // malformed, late, unknown peer, over a peer's reply rate
	Answered   uint64 `json:"answered"` // peers' probes this node answered
	Expired    uint64 `json:"expired"`  // own probes that expired unanswered
	// HostDropped counts host packets to the probe port of an overlay
	// address, dropped: only the engine speaks there for this node.
	HostDropped uint64 `json:"host_dropped"`
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
	ID           ServiceID  `json:"id"`
	Name         string     `json:"name"`
	Revision     Revision   `json:"revision"`
	Addr         netip.Addr `json:"addr"`
	AddrMoved    bool       `json:"addr_moved,omitempty"`
	NameConflict string     `json:"name_conflict,omitempty"`
	Error        string     `json:"error,omitempty"`
	Routable     bool       `json:"routable"`
	// AddrCollision is set when a member's address is this VIP's stored
	// reservation (AddrMoved then says it uses another).
	AddrCollision *AddrCollision `json:"addr_collision,omitempty"`
	Config        Service        `json:"config"`
	// Totals are the VIP's cumulative counters: its listeners', including
	// removed listeners and backends, since the engine started.
	Totals    Totals           `json:"totals"`
	Listeners []ListenerStatus `json:"listeners"`
}

// Totals are a VIP's cumulative counters over all its listeners.
type Totals struct {
	Created   uint64 `json:"bindings_created"`
	Failovers uint64 `json:"udp_failovers"`
	Retargets uint64 `json:"retargets"`
	Traffic
	Drops map[string]uint64 `json:"drops,omitempty"`
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
	// DrainingBackends are removed backends whose bindings still drain
	// (Draining set), with their health: a UDP binding keeps such a
	// backend while it is eligible.
	DrainingBackends []BackendStatus `json:"draining_backends,omitempty"`
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
	// "check-failed", "icmp-unreachable", "rtt-stale", "rtt-unknown"),
	// "drained" for a backend under drain (see Drain), or
	// "unknown-node" for a backend whose node is a member without an IPv4
	// overlay address, or "departed" for one whose node is no member (it
	// left the member list; the backend stays configured until removed).
	Reason           string     `json:"reason"`
	Eligible         bool       `json:"eligible"`
	CheckError       string     `json:"check_error,omitempty"`
	UnreachableUntil *time.Time `json:"unreachable_until,omitempty"`
	// RTTMillis is the smoothed path RTT when RTTKnown; SampleAgeMillis is
	// the newest sample's age, -1 without one.
	RTTMillis       float64 `json:"rtt_ms"`
	RTTKnown        bool    `json:"rtt_known"`
	SampleAgeMillis float64 `json:"sample_age_ms"`
	// Draining is set for a removed backend whose bindings still drain.
	Draining bool `json:"draining,omitempty"`
	// Drain is set for a configured backend under drain: Reason is then
	// "drained" (it takes no new bindings, Eligible is false) and
	// PathReason is the health it has for the bindings it still carries.
	Drain      bool   `json:"drain,omitempty"`
	PathReason string `json:"path_reason,omitempty"`
	// Departed is set for a configured backend whose node is no member:
	// it gets no traffic, and `vip backend remove` takes it by its node id
	// (or the name this agent knew).
	Departed bool `json:"departed,omitempty"`
	Active   int  `json:"active_bindings"`
	// Created counts the bindings made to the backend; Failovers the UDP
	// bindings that moved away from it. Both and Traffic are cumulative
	// (see Status).
	Created   uint64 `json:"bindings_created"`
	Failovers uint64 `json:"udp_failovers"`
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

// vipCarry holds the counts of a service's listeners that the NAT forgot
// (removed, drained): part of the service's Totals.
type vipCarry struct {
	created, failovers, retargets uint64
	c                             flow.Counters
}

func (v *vipCarry) add(ls *flow.ListenerStats) {
	v.created += ls.Created
	v.failovers += ls.Failovers
	v.retargets += ls.Retargets
	v.c.PacketsOut += ls.PacketsOut
	v.c.BytesOut += ls.BytesOut
	v.c.PacketsIn += ls.PacketsIn
	v.c.BytesIn += ls.BytesIn
	for r := range v.c.Drops {
		v.c.Drops[r] += ls.Drops[r]
	}
}

func (v *vipCarry) totals() Totals {
	return Totals{
		Created: v.created, Failovers: v.failovers, Retargets: v.retargets,
		Traffic: Traffic{PacketsOut: v.c.PacketsOut, BytesOut: v.c.BytesOut, PacketsIn: v.c.PacketsIn, BytesIn: v.c.BytesIn},
		Drops:   dropMap(&v.c.Drops),
	}
}

// listenerGone is flow's OnListenerGone: a removed listener's final counts
// fold into its service's totals. It runs with the NAT's lock held.
func (e *Engine) listenerGone(ls flow.ListenerStats) {
	e.totalsMu.Lock()
	defer e.totalsMu.Unlock()
	if svc, ok := e.listenerService[ls.Listener]; ok {
		c := e.carried[svc]
		if c == nil {
			c = &vipCarry{}
			e.carried[svc] = c
		}
		c.add(&ls)
		delete(e.listenerService, ls.Listener)
	}
	e.totalsGen.Add(1)
}

// pruneTotals forgets the listener → service entries of listeners that
// are neither applied nor draining (a listener the NAT refused never
// reaches listenerGone) and the carried totals of services that are gone
// from the configuration and have no listener left. Called with cfgMu
// held, after pruneDrainingLocked.
// +checklocks:e.cfgMu
func (e *Engine) pruneTotals() {
	e.totalsMu.Lock()
	defer e.totalsMu.Unlock()
	for fl := range e.listenerService {
		if e.applied[fl] == nil && e.draining[fl] == nil {
			delete(e.listenerService, fl)
		}
	}
	if len(e.carried) == 0 {
		return
	}
	inNAT := make(map[ServiceID]bool, len(e.listenerService))
	for _, svc := range e.listenerService {
		inNAT[svc] = true
	}
	for svc := range e.carried {
		if !e.services[svc] && !inNAT[svc] {
			delete(e.carried, svc)
		}
	}
}

// Status returns this node's observation of every service, listener and
// backend. It reads the NAT's tables (briefly taking its lock) and may be
// called at any time, also after Close (the counters then stay as they
// were).
func (e *Engine) Status() Status {
	now := e.clock.Now()
	st := Status{Network: e.reg.Network(), Node: e.self, Addr: e.selfAddr, At: now}

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

	// One consistent view of the counters: the listeners the NAT has and
	// the carried counts of those it forgot. A listener forgotten between
	// the two reads (listenerGone) would count twice or not at all; then
	// read again.
	var (
		lstats  map[flow.Listener]flow.ListenerStats
		bstats  []flow.BackendStats
		carried map[ServiceID]Totals
	)
	for try := 0; ; try++ {
		gen := e.totalsGen.Load()
		lstats = make(map[flow.Listener]flow.ListenerStats, len(applied)+len(draining))
		for fl := range applied {
			if ls, ok := e.nat.ListenerStats(fl); ok {
				lstats[fl] = ls
			}
		}
		for _, r := range draining {
			if ls, ok := e.nat.ListenerStats(r.fl); ok {
				lstats[r.fl] = ls
			}
		}
		bstats = e.nat.BackendStats()
		e.totalsMu.Lock()
		carried = make(map[ServiceID]Totals, len(e.carried))
		for svc, c := range e.carried {
			carried[svc] = c.totals()
		}
		e.totalsMu.Unlock()
		if e.totalsGen.Load() == gen || try == 3 {
			break
		}
	}
	bmap := make(map[bindKey]*flow.BackendStats, len(bstats))
	drainingBackends := map[flow.Listener][]*flow.BackendStats{}
	for i := range bstats {
		b := &bstats[i]
		bmap[bindKey{b.Listener, b.Backend}] = b
		if !b.Configured {
			drainingBackends[b.Listener] = append(drainingBackends[b.Listener], b)
		}
	}
	totals := map[ServiceID]*Totals{}
	addTotals := func(svc ServiceID, ls flow.ListenerStats) {
		t := totals[svc]
		if t == nil {
			c := carried[svc]
			t = &c
			totals[svc] = t
		}
		t.Created += ls.Created
		t.Failovers += ls.Failovers
		t.Retargets += ls.Retargets
		t.PacketsOut += ls.PacketsOut
		t.BytesOut += ls.BytesOut
		t.PacketsIn += ls.PacketsIn
		t.BytesIn += ls.BytesIn
		for r, v := range ls.Drops {
			if v == 0 {
				continue
			}
			if t.Drops == nil {
				t.Drops = map[string]uint64{}
			}
			t.Drops[flow.DropReason(r).String()] += v
		}
	}
	for fl, r := range applied {
		if ls, ok := lstats[fl]; ok {
			addTotals(r.svc, ls)
		}
	}
	for _, r := range draining {
		if ls, ok := lstats[r.fl]; ok {
			addTotals(r.svc, ls)
		}
	}
	view := &statusView{pt: pt, lstats: lstats, backends: bmap, draining: drainingBackends, now: now}
	st.AddrCollisions = e.reg.AddrCollisions()
	collision := map[ServiceID]*AddrCollision{}
	for i := range st.AddrCollisions {
		collision[st.AddrCollisions[i].Service] = &st.AddrCollisions[i]
	}

	for _, v := range e.reg.List() {
		ss := ServiceStatus{
			ID: v.ID, Name: v.Name, Revision: v.Revision, Addr: v.Addr, AddrMoved: v.AddrMoved,
			NameConflict: v.NameConflict, Error: v.Err, Routable: v.Routable, Config: v.Service,
			Listeners: []ListenerStatus{},
		}
		if c := collision[v.ID]; c != nil {
			cc := *c
			ss.AddrCollision = &cc
		}
		if t := totals[v.ID]; t != nil {
			ss.Totals = *t
		} else {
			ss.Totals = carried[v.ID]
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
			ss.Listeners = append(ss.Listeners, e.listenerStatus(r, false, view))
		}
		st.Services = append(st.Services, ss)
	}
	slices.SortFunc(draining, func(a, b *route) int {
		return cmp.Or(a.fl.VIP.Compare(b.fl.VIP), cmp.Compare(a.fl.Proto, b.fl.Proto), cmp.Compare(a.fl.Port, b.fl.Port))
	})
	for _, r := range draining {
		ls := e.listenerStatus(r, true, view)
		ls.Next = nil
		st.Draining = append(st.Draining, ls)
	}

	ps, rs := e.prober.Stats(), e.responder.Stats()
	st.PassThrough = Traffic{
		PacketsOut: e.counters.passOutPkts.Load(), BytesOut: e.counters.passOutBytes.Load(),
		PacketsIn: e.counters.passInPkts.Load(), BytesIn: e.counters.passInBytes.Load(),
	}
	st.Probe = ProbeTraffic{
		PacketsOut: e.counters.probeOutPkts.Load(), BytesOut: e.counters.probeOutBytes.Load(),
		PacketsIn: e.counters.probeInPkts.Load(), BytesIn: e.counters.probeInBytes.Load(),
		Rejected: e.counters.probeBad.Load(), Answered: rs.Answered, Expired: ps.Expired,
		HostDropped: e.counters.hostProbe.Load(),
	}
	fs := e.nat.Stats()
	st.Flow = FlowStatus{
		Capacity: fs.Capacity, Active: fs.Active, Quarantined: fs.Quarantined, Created: fs.Created,
		Failovers: fs.Failovers, Retargets: fs.Retargets, Refused: fs.Refused, Drops: dropMap(&fs.Drops),
	}
	for name, v := range map[string]uint64{
		"queue-full": e.counters.queueFull.Load(), "too-big": e.counters.tooBig.Load(),
		"unknown-peer": e.counters.unknownPeer.Load(), "host-write": e.counters.hostWriteErr.Load(),
		"malformed": e.counters.malformed.Load(),
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

// statusView is what one Status call read, shared by its listeners.
type statusView struct {
	pt       *peerTable
	lstats   map[flow.Listener]flow.ListenerStats
	backends map[bindKey]*flow.BackendStats
	draining map[flow.Listener][]*flow.BackendStats // removed backends with bindings, per listener
	now      time.Time
}

func (e *Engine) listenerStatus(r *route, draining bool, v *statusView) ListenerStatus {
	pt, now := v.pt, v.now
	ls := ListenerStatus{Listener: r.key.String(), VIP: r.fl.VIP, Generation: r.gen, Routed: !draining, Draining: draining, Backends: []BackendStatus{}}
	if r.err != nil {
		ls.Error = r.err.Error()
	}
	if fs, ok := v.lstats[r.fl]; ok {
		ls.Active, ls.Quarantined, ls.Created = fs.Active, fs.Quarantined, fs.Created
		ls.Failovers, ls.Retargets = fs.Failovers, fs.Retargets
		ls.Traffic = Traffic{PacketsOut: fs.PacketsOut, BytesOut: fs.BytesOut, PacketsIn: fs.PacketsIn, BytesIn: fs.BytesIn}
		ls.Drops = dropMap(&fs.Drops)
	}
	statuses, next := e.selector.Select(r.pbs, now, make([]probe.Status, 0, len(r.pbs)))
	if next >= 0 && !draining {
		b := r.cfg[next]
		ls.Next = &BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port}
	}
	for i, b := range r.cfg {
		bs := backendStatus(BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port}, r.pbs[i], statuses[i])
		if r.pbs[i].Disabled {
			pb := r.pbs[i]
			pb.Disabled = false
			path := backendStatus(bs.BackendRef, pb, e.selector.Evaluate(&pb, now))
			path.Reason, path.PathReason, path.Drain, path.Eligible = "drained", path.Reason, true, false
			bs = path
		}
		bs.addCounters(v.backends[bindKey{r.fl, r.backends[i]}])
		ls.Backends = append(ls.Backends, bs)
	}
	for _, b := range r.missing {
		bs := BackendStatus{BackendRef: BackendRef{Node: b.Node, NodeName: pt.name[b.Node], Port: b.Port}, Reason: "unknown-node", SampleAgeMillis: -1}
		if !pt.member[b.Node] {
			bs.Reason, bs.Departed = "departed", true
		}
		ls.Backends = append(ls.Backends, bs)
	}
	for _, fb := range v.draining[r.fl] {
		if slices.Contains(r.backends, fb.Backend) {
			continue // configured again: listed above
		}
		pb := e.probeBackend(r.fl, fb.Backend)
		node := NodeID(pb.Node)
		bs := backendStatus(BackendRef{Node: node, NodeName: pt.name[node], Port: fb.Backend.Port}, pb, e.selector.Evaluate(&pb, now))
		bs.Draining = true
		bs.addCounters(fb)
		ls.DrainingBackends = append(ls.DrainingBackends, bs)
	}
	return ls
}

// backendStatus is one backend's health as the selector sees it.
func backendStatus(ref BackendRef, pb probe.Backend, s probe.Status) BackendStatus {
	bs := BackendStatus{
		BackendRef: ref, Addr: pb.Addr, Local: pb.Local,
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
	return bs
}

// addCounters fills in the NAT's cumulative counters of the backend (nil:
// none yet).
func (bs *BackendStatus) addCounters(fb *flow.BackendStats) {
	if fb == nil {
		return
	}
	bs.Active = fb.Active
	bs.Created, bs.Failovers = fb.Created, fb.Failovers
	bs.Traffic = Traffic{PacketsOut: fb.PacketsOut, BytesOut: fb.BytesOut, PacketsIn: fb.PacketsIn, BytesIn: fb.BytesIn}
	bs.Drops = dropMap(&fb.Drops)
}
