package vip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/probe"
)

// Apply brings routing in line with the Registry: the peer table from
// Registry.Nodes, and every listener of every Routable service from
// Registry.List. Every routed VIP address is claimed in the NAT, so that
// one without listeners, like a listener without backends, refuses new
// flows at once (a RST or an ICMP port unreachable, see docs/empty-vips.md)
// instead of dropping them silently. Listeners, backends and VIP addresses that went away stop
// taking new bindings; their existing bindings drain until idle expiry with
// their original VIP address. Connect-check subscriptions and probed peers
// follow the backends in use. Call it from RegistryOptions.OnChange (it
// reads the Registry and never calls its mutating methods) and after
// membership changes. It returns the problems of listeners the NAT or the
// checker refused (also reported in Status), or ErrEngineClosed after
// Close.
func (e *Engine) Apply() error {
	e.cfgMu.Lock()
	defer e.cfgMu.Unlock()
	if e.closed {
		return ErrEngineClosed
	}
	now := e.clock.Now()
	pt := e.buildPeers()
	e.peers.Store(pt)

	desired := map[flow.Listener]*route{}
	usedPeers := map[NodeID]bool{}
	newSubs := map[subKey]*probe.Subscription{}
	services := map[ServiceID]bool{}
	vips := map[netip.Addr]bool{}
	var errs []error
	for _, v := range e.reg.List() {
		services[v.ID] = true
		if !v.Routable || !v.Addr.Is4() {
			continue
		}
		vips[v.Addr] = true
		for _, l := range v.Listeners {
			fl := flow.Listener{VIP: v.Addr, Proto: flow.Proto(l.Proto), Port: l.Port}
			r := &route{svc: v.ID, name: v.Name, key: l.Key(), gen: l.Generation, fl: fl, idle: time.Duration(l.IdleTimeout)}
			chk := l.Check.Effective()
			for _, b := range l.Backends {
				addr, ok := pt.addr[b.Node]
				if !ok || !addr.Is4() {
					r.missing = append(r.missing, b)
					continue
				}
				local := b.Node == e.self
				fb := flow.Backend{Peer: flow.LocalPeer, Addr: e.selfAddr, Port: b.Port}
				if !local {
					fb = flow.Backend{Peer: e.peerIDs[b.Node], Addr: addr, Port: b.Port}
					usedPeers[b.Node] = true
				}
				// A draining backend stays a NAT candidate (configured: its
				// counters go on), but the selector never picks it for a new
				// binding; Available ignores the flag, so bindings it has go
				// on (docs/backend-drain.md).
				pb := probe.Backend{Node: probe.NodeID(b.Node), Local: local, Proto: uint8(l.Proto), Addr: fb.AddrPort(), Disabled: l.Draining(b)}
				if l.Proto == TCP && l.Check.Enabled() {
					cc := probe.CheckConfig{Interval: time.Duration(chk.Interval), Timeout: time.Duration(chk.Timeout), Failures: chk.Failures, Successes: chk.Successes}
					k := subKey{fl: fl, b: fb, cfg: cc}
					sub := newSubs[k]
					if sub == nil {
						sub = e.subs[k]
					}
					if sub == nil {
						var err error
						sub, err = e.checker.Acquire(probe.CheckKey{Network: e.reg.Network(), Node: probe.NodeID(b.Node), Addr: fb.AddrPort()}, cc)
						if err != nil {
							r.err = errors.Join(r.err, fmt.Errorf("vip: connect check of %s on %s: %w", b, l.Key(), err))
						}
					}
					if sub != nil {
						newSubs[k] = sub
						pb.Check = sub
					}
				}
				r.cfg = append(r.cfg, b)
				r.backends = append(r.backends, fb)
				r.pbs = append(r.pbs, pb)
			}
			desired[fl] = r
		}
	}
	// The totals' listener → service map gains the new listeners before
	// the NAT has them (a removed listener keeps its entry until the NAT
	// forgets it: listenerGone).
	e.totalsMu.Lock()
	for fl, r := range desired {
		e.listenerService[fl] = r.svc
	}
	e.services = services
	e.totalsMu.Unlock()
	// Publish the new selection state first, so that the NAT's next Select
	// sees the new backends' health inputs, then the listeners.
	e.routes.Store(&routeTable{m: desired})
	// Remove first, so that a listener replaced on the same VIP never
	// counts twice against the per-VIP listener limit.
	for fl, r := range e.applied {
		if _, ok := desired[fl]; !ok {
			e.nat.RemoveListener(fl)
			e.draining[fl] = r
		}
	}
	for fl, r := range desired {
		if err := e.nat.SetListener(fl, flow.ListenerConfig{Backends: r.backends, IdleTimeout: r.idle}); err != nil {
			r.err = errors.Join(r.err, err)
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("vip: %s %s: %w", r.name, r.key, r.err))
		}
		delete(e.draining, fl)
	}
	e.applied = desired
	// Every routed VIP is claimed, so that an empty one (no listener)
	// refuses its traffic like a port without a listener.
	for a := range e.vips {
		if !vips[a] {
			e.nat.ReleaseVIP(a)
		}
	}
	for a := range vips {
		if err := e.nat.ClaimVIP(a); err != nil {
			errs = append(errs, fmt.Errorf("vip: VIP %v: %w", a, err))
			delete(vips, a)
		}
	}
	e.vips = vips
	for k, s := range e.subs {
		if newSubs[k] != s {
			s.Release()
		}
	}
	e.subs = newSubs
	e.used = usedPeers
	errs = append(errs, e.syncProbedLocked(now)...)
	e.pruneDrainingLocked()
	e.pruneTotals()
	e.applyErr = errors.Join(errs...)
	e.nat.HealthChanged()
	return e.applyErr
}

// buildPeers assigns stable compact peer ids to members and maps their
// overlay addresses. A member keeps its id while it is a member or a
// departed node that stored backends name (FormerNodes). Called with cfgMu held.
// +checklocks:e.cfgMu
func (e *Engine) buildPeers() *peerTable {
	pt := &peerTable{byAddr: map[uint32]flow.PeerID{}, node: map[flow.PeerID]NodeID{}, addr: map[NodeID]netip.Addr{}, name: map[NodeID]string{}, member: map[NodeID]bool{}}
	keep := map[NodeID]bool{}
	if e.reg.o.FormerNodes != nil {
		for _, n := range e.reg.o.FormerNodes() {
			pt.name[n.ID] = n.Name
			keep[n.ID] = true
		}
	}
	for _, n := range e.reg.Nodes() {
		keep[n.ID] = true
		pt.name[n.ID] = n.Name
		pt.member[n.ID] = true
		if n.ID == e.self {
			pt.addr[n.ID] = e.selfAddr
			continue
		}
		id, ok := e.peerIDs[n.ID]
		if !ok {
			id = e.nextPeer
			e.nextPeer++
			e.peerIDs[n.ID] = id
		}
		pt.node[id] = n.ID
		if n.Addr.Is4() {
			pt.addr[n.ID] = n.Addr
			a := n.Addr.As4()
			pt.byAddr[binary.BigEndian.Uint32(a[:])] = id
		}
	}
	// A node that is neither a member nor named by a stored backend gives
	// up its id, so the table holds no more than those; ids are never
	// reused (nextPeer only grows), so a binding that still carries a
	// dropped id can never reach another node.
	for id := range e.peerIDs {
		if !keep[id] {
			delete(e.peerIDs, id)
		}
	}
	return pt
}

// syncProbedLocked makes the prober track exactly the peers of configured
// backends and the peers that removed backends' active bindings still
// use: a draining UDP binding keeps its backend while the backend's path is
// healthy, which only probing tells. Called with cfgMu held.
// +checklocks:e.cfgMu
func (e *Engine) syncProbedLocked(now time.Time) []error {
	want := make(map[NodeID]bool, len(e.used))
	for id := range e.used {
		want[id] = true
	}
	pt := e.peers.Load()
	for _, b := range e.nat.DrainingBackends() {
		if b.Backend.Peer == flow.LocalPeer {
			continue
		}
		if id, ok := pt.node[b.Backend.Peer]; ok {
			want[id] = true
		}
	}
	var errs []error
	for id := range want {
		if !e.probed[id] {
			if err := e.prober.AddPeer(probe.NodeID(id), now); err != nil {
				errs = append(errs, fmt.Errorf("vip: probe %s: %w", id.String()[:12], err))
				continue
			}
			e.probed[id] = true
		}
	}
	for id := range e.probed {
		if !want[id] {
			e.prober.RemovePeer(probe.NodeID(id))
			delete(e.probed, id)
			delete(e.eligible, id)
		}
	}
	return errs
}

// pruneDrainingLocked forgets removed listeners whose bindings are gone.
// +checklocks:e.cfgMu
func (e *Engine) pruneDrainingLocked() {
	for fl := range e.draining {
		if _, ok := e.nat.ListenerStats(fl); !ok {
			delete(e.draining, fl)
		}
	}
}
