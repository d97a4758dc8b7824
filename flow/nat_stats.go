package flow

import (
	"net/netip"
)

// +checklocks:n.mu
func (n *NAT) countersOf(id uint32) Counters {
	b := &n.slots[id]
	c := Counters{PacketsOut: b.pktsOut, BytesOut: b.bytesOut, PacketsIn: b.pktsIn, BytesIn: b.bytesIn}
	for r, s := range bindingDropSlot {
		if s > 0 {
			c.Drops[r] = uint64(n.cold[id].drops[s-1])
		}
	}
	return c
}

// Bindings returns a snapshot of every active and quarantined binding.
func (n *NAT) Bindings() []BindingInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.flushLocked()
	out := make([]BindingInfo, 0, n.inUse)
	for id := range n.slots[:n.fresh] {
		b := &n.slots[id]
		if b.state == 0 {
			continue
		}
		orig, reply := n.tuples(uint32(id))
		st := Active
		if b.state&stQuarantined != 0 {
			st = Quarantined
		}
		out = append(out, BindingInfo{
			Listener: n.classes[b.class].ls.listener,
			Backend:  n.backendOf(b),
			Client:   netip.AddrPortFrom(addrFrom(orig.src()), orig.sport()),
			Shadow:   netip.AddrPortFrom(addrFrom(reply.dst()), reply.dport()),
			State:    st,
			Hairpin:  b.state&stHairpin != 0,
			Expires:  n.timeOf(b.deadline),
			Counters: n.countersOf(uint32(id)),
		})
	}
	return out
}

// ListenerStats returns a snapshot of listener l, including a removed
// listener that still drains. It reports false for an unknown listener.
func (n *NAT) ListenerStats(l Listener) (ListenerStats, bool) {
	if !l.VIP.Is4() {
		return ListenerStats{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	li, ok := n.listenerByKey[listenerKey{addr4(l.VIP), l.Port, l.Proto}]
	if !ok {
		return ListenerStats{}, false
	}
	return n.listeners[li].stats(), true
}

func (ls *listenerState) stats() ListenerStats {
	return ListenerStats{
		Listener: ls.listener, Removed: ls.removed, Backends: len(ls.backends),
		Active: ls.active, Quarantined: ls.quarantined,
		Created: ls.created, Retargets: ls.retargets, Failovers: ls.failovers,
		Counters: ls.counters,
	}
}

// Stats returns a snapshot of the NAT's counters.
func (n *NAT) Stats() Stats {
	n.mu.Lock()
	s := Stats{
		Capacity: n.o.Capacity, Active: n.inUse - n.quarantined, Quarantined: n.quarantined,
		Created: n.created, Failovers: n.failovers, Retargets: n.retargets, Refused: n.refused,
		FragPending: n.frags.count(), FragBytes: n.frags.bytes,
		Reassembled: n.reassembled, Fragmented: n.fragmented, ICMPSent: n.icmpSent,
	}
	n.mu.Unlock()
	for r := range s.Drops {
		s.Drops[r] = n.drops[r].Load()
	}
	return s
}
