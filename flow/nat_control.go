package flow

import (
	"fmt"
	"net/netip"
)

// kind returns the kind of address vi makes its VIP: routed while it has
// listeners or is claimed, draining while only bindings remain.
func (vi *vipInfo) kind() uint8 {
	switch {
	case vi == nil:
		return vipNone
	case vi.listeners > 0 || vi.claimed:
		return vipRouted
	case vi.bindings > 0:
		return vipDraining
	}
	return vipNone
}

// vipRefLocked counts listeners and bindings per VIP (dl, db) and claims
// (dc: +1 claims, -1 releases, 0 leaves the claim), forgets a VIP when
// nothing is left, and republishes the lock-free VIP set when an address
// appears, disappears or changes its kind.
// +checklocks:n.mu
func (n *NAT) vipRefLocked(vip uint32, dl, db, dc int) {
	vi := n.vipInfo[vip]
	was := vi.kind()
	if vi == nil {
		vi = &vipInfo{}
		n.vipInfo[vip] = vi
	}
	vi.listeners += dl
	vi.bindings += db
	if dc != 0 {
		vi.claimed = dc > 0
	}
	now := vi.kind()
	if now == vipNone {
		delete(n.vipInfo, vip)
	}
	if now != was {
		n.publishVIPsLocked()
	}
}

// +checklocks:n.mu
func (n *NAT) publishVIPsLocked() {
	addrs := make([]vipEntry, 0, len(n.vipInfo))
	for a, vi := range n.vipInfo {
		addrs = append(addrs, vipEntry{a, vi.kind()})
	}
	n.vips.Store(newVIPSet(addrs))
}

// drainingLocked reports whether a is a VIP address that only drains: no
// listener and no claim, only bindings. Only those bindings' flows on it
// are the NAT's; everything else to and from it passes, since the address
// may now be a node's (a VIP moves when a node's address wins it).
// +checklocks:n.mu
func (n *NAT) drainingLocked(a uint32) bool { return n.vips.Load().kind(a) == vipDraining }

// SetListener creates or updates a listener: its VIP becomes a VIP (FromHost
// translates traffic to it; peers may no longer use it), and new flows to it
// are bound to one of cfg.Backends. Updating a removed listener that still
// drains revives it. Errors match ErrInvalidListener, ErrInvalidBackend,
// ErrLimit or ErrClosed.
func (n *NAT) SetListener(l Listener, cfg ListenerConfig) error {
	if !l.VIP.Is4() || l.VIP.IsUnspecified() || l.VIP == n.o.LocalAddr || (l.Proto != ProtoTCP && l.Proto != ProtoUDP) || l.Port == 0 {
		return fmt.Errorf("%w: %v", ErrInvalidListener, l)
	}
	if cfg.IdleTimeout < 0 {
		return fmt.Errorf("%w: %v: negative idle timeout", ErrInvalidListener, l)
	}
	if len(cfg.Backends) > n.o.MaxBackends {
		return fmt.Errorf("%w: %v has %d backends, at most %d", ErrLimit, l, len(cfg.Backends), n.o.MaxBackends)
	}
	for _, b := range cfg.Backends {
		if err := n.checkBackend(b); err != nil {
			return err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	k := listenerKey{addr4(l.VIP), l.Port, l.Proto}
	li, ok := n.listenerByKey[k]
	var ls *listenerState
	if ok {
		ls = n.listeners[li]
		if ls.removed {
			if vi := n.vipInfo[k.vip]; vi != nil && vi.listeners >= n.o.MaxListenersPerVIP {
				return fmt.Errorf("%w: %v: more than %d listeners on the VIP", ErrLimit, l, n.o.MaxListenersPerVIP)
			}
			ls.removed = false
			n.vipRefLocked(k.vip, +1, 0, 0)
		}
	} else {
		if vi := n.vipInfo[k.vip]; vi != nil && vi.listeners >= n.o.MaxListenersPerVIP {
			return fmt.Errorf("%w: %v: more than %d listeners on the VIP", ErrLimit, l, n.o.MaxListenersPerVIP)
		}
		ls = &listenerState{listener: l, key: k}
		if len(n.freeListeners) > 0 {
			ls.slot = n.freeListeners[len(n.freeListeners)-1]
			n.freeListeners = n.freeListeners[:len(n.freeListeners)-1]
			n.listeners[ls.slot] = ls
		} else {
			ls.slot = uint32(len(n.listeners))
			n.listeners = append(n.listeners, ls)
		}
		n.listenerByKey[k] = ls.slot
		n.vipRefLocked(k.vip, +1, 0, 0)
	}
	ls.backends = append(ls.backends[:0:0], cfg.Backends...)
	n.configureBackendsLocked(ls)
	ls.idle = int64(cfg.IdleTimeout)
	if ls.idle == 0 {
		ls.idle = n.idleUDP
		if l.Proto == ProtoTCP {
			ls.idle = n.idleTCP
		}
	}
	return nil
}

func (n *NAT) checkBackend(b Backend) error {
	if !b.Addr.Is4() || b.Addr.IsUnspecified() || b.Port == 0 {
		return fmt.Errorf("%w: %v", ErrInvalidBackend, b.AddrPort())
	}
	if (b.Addr == n.o.LocalAddr) != (b.Peer == LocalPeer) {
		return fmt.Errorf("%w: %v with peer %d: the local address belongs to LocalPeer only", ErrInvalidBackend, b.AddrPort(), b.Peer)
	}
	return nil
}

// RemoveListener stops new bindings to l; its bindings continue until they
// expire. The VIP stays claimed while any of its listeners or bindings
// remain. It reports whether l was configured.
func (n *NAT) RemoveListener(l Listener) bool {
	if !l.VIP.Is4() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.removeListenerLocked(listenerKey{addr4(l.VIP), l.Port, l.Proto})
}

// +checklocks:n.mu
func (n *NAT) removeListenerLocked(k listenerKey) bool {
	li, ok := n.listenerByKey[k]
	if !ok || n.listeners[li].removed {
		return false
	}
	ls := n.listeners[li]
	ls.removed = true
	ls.backends = nil
	n.configureBackendsLocked(ls)
	n.vipRefLocked(k.vip, -1, 0, 0)
	if ls.refs == 0 {
		n.forgetListenerLocked(ls)
	}
	return true
}

// +checklocks:n.mu
func (n *NAT) forgetListenerLocked(ls *listenerState) {
	if n.o.OnListenerGone != nil {
		n.o.OnListenerGone(ls.stats())
	}
	delete(n.listenerByKey, ls.key)
	n.listeners[ls.slot] = nil
	n.freeListeners = append(n.freeListeners, ls.slot)
}

// RemoveBackend stops new bindings of l to b; existing bindings continue
// until they expire. It reports whether b was a backend of l.
func (n *NAT) RemoveBackend(l Listener, b Backend) bool {
	if !l.VIP.Is4() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	li, ok := n.listenerByKey[listenerKey{addr4(l.VIP), l.Port, l.Proto}]
	if !ok {
		return false
	}
	ls := n.listeners[li]
	for i, c := range ls.backends {
		if c == b {
			ls.backends = append(ls.backends[:i:i], ls.backends[i+1:]...)
			n.configureBackendsLocked(ls)
			return true
		}
	}
	return false
}

// ClaimVIP claims vip even while it has no listener: an empty VIP, which
// resolves but cannot accept traffic. Its packets from the host are then
// the NAT's and refused like those to a port without a listener (a RST or
// an ICMP port unreachable, see Options.ReplyRate) instead of passing.
// It fails with ErrInvalidListener for an address that is not IPv4 or is
// LocalAddr, and with ErrClosed after Close.
func (n *NAT) ClaimVIP(vip netip.Addr) error {
	if !vip.Is4() || vip == n.o.LocalAddr {
		return fmt.Errorf("%w: VIP %v", ErrInvalidListener, vip)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	n.vipRefLocked(addr4(vip), 0, 0, +1)
	return nil
}

// ReleaseVIP undoes ClaimVIP; the VIP stays claimed while it has
// listeners or bindings. It reports whether vip was claimed.
func (n *NAT) ReleaseVIP(vip netip.Addr) bool {
	if !vip.Is4() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	a := addr4(vip)
	vi := n.vipInfo[a]
	if vi == nil || !vi.claimed {
		return false
	}
	n.vipRefLocked(a, 0, 0, -1)
	return true
}

// RemoveVIP removes every listener of vip (see RemoveListener) and returns
// how many there were.
func (n *NAT) RemoveVIP(vip netip.Addr) int {
	if !vip.Is4() {
		return 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	a := addr4(vip)
	var keys []listenerKey
	for k := range n.listenerByKey {
		if k.vip == a {
			keys = append(keys, k)
		}
	}
	c := 0
	for _, k := range keys {
		if n.removeListenerLocked(k) {
			c++
		}
	}
	return c
}

// HealthChanged tells the NAT that backend availability may have changed:
// each UDP binding asks Selector.Available once more on its next datagram
// and fails over when its backend is unavailable.
func (n *NAT) HealthChanged() { n.gen.Add(1) }

// Close releases all bindings, fragments and every reserved port, and stops
// the sweep. Later packets are dropped with ReasonClosed and control methods
// return ErrClosed. Close is idempotent.
func (n *NAT) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	if n.timer != nil {
		n.timer.Stop()
	}
	n.logLen = 0
	for id := range n.slots[:n.fresh] {
		b := &n.slots[id]
		if b.state == 0 {
			continue
		}
		orig, reply := n.tuples(uint32(id))
		n.reserver.Release(orig.proto(), netip.AddrPortFrom(addrFrom(reply.src()), reply.sport()), reply.dport())
	}
	// Drop the table itself: a million-flow table is ~230 MB.
	n.idx = index{}
	n.slots, n.cold, n.fresh, n.freeHead = nil, nil, 0, noID
	n.classes, n.classMap, n.classFree = nil, map[classKey]uint32{}, nil
	n.wheel = nil
	n.inUse, n.quarantined = 0, 0
	n.frags.reset()
	n.listeners, n.listenerByKey, n.vipInfo, n.backendAddrRefs = nil, map[listenerKey]uint32{}, map[uint32]*vipInfo{}, map[uint32]int{}
	n.vips.Store(nil)
	return nil
}
