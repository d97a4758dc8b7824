package flow

import (
	"cmp"
	"slices"
)

// BackendStats is a snapshot of one backend of a listener: a configured
// backend, or a removed one whose bindings still drain.
//
// Its counters are cumulative: they cover every binding the backend had
// since it was configured on the listener, including bindings that have
// since expired, and they are kept for as long as the backend stays
// configured (or still has bindings). Once a removed backend's last
// binding is gone its entry goes too; its traffic stays counted in its
// listener's Counters (ListenerStats), which cover every backend. They
// reset only with the NAT.
type BackendStats struct {
	Listener Listener
	Backend  Backend
	// Configured reports whether the backend is one of the listener's
	// current candidates; false for a removed backend that drains.
	Configured  bool
	Active      int    // active bindings
	Quarantined int    // quarantined bindings
	Created     uint64 // bindings made to it
	Failovers   uint64 // UDP bindings moved away from it
	Retargets   uint64 // TCP bindings moved away from it by a retransmitted SYN
	// Counters are the user traffic of its bindings, live and gone; Drops
	// holds the per-binding reasons (quarantined, peer-mismatch,
	// frag-needed, no-emit).
	Counters
}

// backendState is the NAT's state of one backend of a listener, guarded
// by the NAT's mu.
type backendState struct {
	ls                            *listenerState
	be                            Backend
	configured                    bool
	active, quarantined           int
	created, failovers, retargets uint64
	gone                          Counters // of freed bindings
}

func (c *Counters) add(o *Counters) {
	c.PacketsOut += o.PacketsOut
	c.BytesOut += o.BytesOut
	c.PacketsIn += o.PacketsIn
	c.BytesIn += o.BytesIn
	for r := range c.Drops {
		c.Drops[r] += o.Drops[r]
	}
}

// backendStateLocked returns ls's state of be, creating it (as not
// configured) when there is none.
// +checklocks:n.mu
func (n *NAT) backendStateLocked(ls *listenerState, be Backend) *backendState {
	if bs := ls.byBackend[be]; bs != nil {
		return bs
	}
	if ls.byBackend == nil {
		ls.byBackend = make(map[Backend]*backendState)
	}
	bs := &backendState{ls: ls, be: be}
	ls.byBackend[be] = bs
	return bs
}

// configureBackendsLocked marks exactly ls.backends as configured and
// forgets removed backends without bindings.
// +checklocks:n.mu
func (n *NAT) configureBackendsLocked(ls *listenerState) {
	for _, bs := range ls.byBackend {
		bs.configured = false
	}
	for _, be := range ls.backends {
		n.backendStateLocked(ls, be).configured = true
	}
	for be, bs := range ls.byBackend {
		if !bs.configured && bs.active+bs.quarantined == 0 {
			delete(ls.byBackend, be)
		}
	}
}

// backendFreedLocked folds the counters c of a freed (quarantined) binding
// into its backend's state.
// +checklocks:n.mu
func (n *NAT) backendFreedLocked(bs *backendState, c Counters) {
	bs.gone.add(&c)
	bs.quarantined--
	if !bs.configured && bs.active+bs.quarantined == 0 && bs.ls.byBackend[bs.be] == bs {
		delete(bs.ls.byBackend, bs.be)
	}
}

func (bs *backendState) stats() BackendStats {
	return BackendStats{
		Listener: bs.ls.listener, Backend: bs.be, Configured: bs.configured,
		Active: bs.active, Quarantined: bs.quarantined,
		Created: bs.created, Failovers: bs.failovers, Retargets: bs.retargets,
		Counters: bs.gone,
	}
}

// backendsInOrder returns ls's backend states: the configured ones in
// configuration order, then the draining ones by address and port.
func backendsInOrder(ls *listenerState) []*backendState {
	out := make([]*backendState, 0, len(ls.byBackend))
	for _, be := range ls.backends {
		if bs := ls.byBackend[be]; bs != nil && !slices.Contains(out, bs) {
			out = append(out, bs)
		}
	}
	k := len(out)
	for _, bs := range ls.byBackend {
		if !bs.configured {
			out = append(out, bs)
		}
	}
	slices.SortFunc(out[k:], func(a, b *backendState) int {
		return cmp.Or(a.be.Addr.Compare(b.be.Addr), cmp.Compare(a.be.Port, b.be.Port), cmp.Compare(a.be.Peer, b.be.Peer))
	})
	return out
}

// BackendStats returns a snapshot of every backend of every listener
// (removed listeners that still drain included), listener by listener:
// configured backends in configuration order, then removed ones that
// drain. Its cost is one pass over the bindings (their live counters) under
// the NAT's lock; DrainingBackends is the cheap query for bindings alone.
func (n *NAT) BackendStats() []BackendStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.flushLocked()
	var out []BackendStats
	at := make(map[*backendState]int)
	for _, ls := range n.listeners {
		if ls == nil {
			continue
		}
		for _, bs := range backendsInOrder(ls) {
			at[bs] = len(out)
			out = append(out, bs.stats())
		}
	}
	for id := range n.slots[:n.fresh] {
		b := &n.slots[id]
		if b.state == 0 {
			continue
		}
		if i, ok := at[n.classes[b.class].bs]; ok {
			c := n.countersOf(uint32(id))
			out[i].Counters.add(&c)
		}
	}
	return out
}

// DrainingBackends returns the removed backends (of configured and of
// removed listeners) that still have active bindings, without their
// counters. It costs a pass over the listeners' backends, not over the
// bindings: the vip engine asks it every path tick, to keep probing the
// peers such bindings use.
func (n *NAT) DrainingBackends() []BackendStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []BackendStats
	for _, ls := range n.listeners {
		if ls == nil {
			continue
		}
		for _, bs := range ls.byBackend {
			if !bs.configured && bs.active > 0 {
				st := bs.stats()
				st.Counters = Counters{}
				out = append(out, st)
			}
		}
	}
	return out
}
