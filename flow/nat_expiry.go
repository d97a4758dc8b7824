package flow

import (
	"net/netip"
	"time"
)

// retireLocked moves an active binding to quarantine, from time at: its
// client tuple no longer matches; its shadow port stays reserved and late
// replies are dropped until at + Quarantine.
// +checklocks:n.mu
func (n *NAT) retireLocked(id uint32, at int64) {
	b := &n.slots[id]
	if b.state&stActive == 0 {
		return
	}
	orig, _ := n.tuples(id)
	n.idx.remove(orig)
	b.state = b.state&^stActive | stQuarantined
	b.deadline = at + n.quarantine
	ls := n.classes[b.class].ls
	ls.active--
	ls.quarantined++
	bs := n.classes[b.class].bs
	bs.active--
	bs.quarantined++
	n.quarantined++
	n.wheelUnlink(id)
	n.wheelLink(id)
	n.syncLocked(id, at)
}

// expireOneLocked applies idle expiry and quarantine end to binding id at
// now, as the sweep would, and reports whether the binding is gone.
// +checklocks:n.mu
func (n *NAT) expireOneLocked(id uint32, now int64) bool {
	b := &n.slots[id]
	if b.state&stActive != 0 && now >= b.deadline {
		n.retireLocked(id, b.deadline)
	}
	if b.state&stQuarantined != 0 && now >= b.deadline {
		n.freeLocked(id)
		return true
	}
	return false
}

// freeLocked ends a quarantined binding and releases its port.
// +checklocks:n.mu
func (n *NAT) freeLocked(id uint32) {
	b := &n.slots[id]
	orig, reply := n.tuples(id)
	n.idx.remove(reply)
	n.wheelUnlink(id)
	n.reserver.Release(orig.proto(), netip.AddrPortFrom(addrFrom(reply.src()), reply.sport()), reply.dport())
	ls := n.classes[b.class].ls
	n.backendFreedLocked(n.classes[b.class].bs, n.countersOf(id))
	n.classUnrefLocked(b.class)
	ls.quarantined--
	ls.refs--
	n.quarantined--
	n.inUse--
	n.vipRefLocked(orig.dst(), 0, -1, 0)
	if n.backendAddrRefs[reply.src()]--; n.backendAddrRefs[reply.src()] <= 0 {
		delete(n.backendAddrRefs, reply.src())
	}
	if ls.removed && ls.refs == 0 {
		n.forgetListenerLocked(ls)
	}
	*b = binding{}
	n.cold[id] = bindingCold{wheelPrev: noID, wheelNext: n.freeHead, wheelBucket: noID}
	n.freeHead = id
}

// Expiry wheel: one list per SweepInterval tick, wheelSize ticks around.
// An entry sits in the bucket of its deadline (clamped to the wheel's
// reach); packets extend deadlines without moving entries, and the sweep
// moves entries whose deadline has moved on.
const (
	wheelBits = 13
	wheelSize = 1 << wheelBits
	wheelMask = wheelSize - 1
)

// +checklocks:n.mu
func (n *NAT) bucketFor(deadline int64) uint32 {
	t := deadline / n.tickLen
	if t < n.wheelTick {
		t = n.wheelTick
	}
	if t-n.wheelTick >= wheelSize {
		t = n.wheelTick + wheelSize - 1
	}
	return uint32(t & wheelMask)
}

// +checklocks:n.mu
func (n *NAT) wheelLink(id uint32) {
	b := &n.cold[id]
	bk := n.bucketFor(n.slots[id].deadline)
	b.wheelBucket = bk
	b.wheelPrev = noID
	b.wheelNext = n.wheel[bk]
	if b.wheelNext != noID {
		n.cold[b.wheelNext].wheelPrev = id
	}
	n.wheel[bk] = id
}

// +checklocks:n.mu
func (n *NAT) wheelUnlink(id uint32) {
	b := &n.cold[id]
	if b.wheelBucket == noID {
		return
	}
	if b.wheelPrev != noID {
		n.cold[b.wheelPrev].wheelNext = b.wheelNext
	} else {
		n.wheel[b.wheelBucket] = b.wheelNext
	}
	if b.wheelNext != noID {
		n.cold[b.wheelNext].wheelPrev = b.wheelPrev
	}
	b.wheelPrev, b.wheelNext, b.wheelBucket = noID, noID, noID
}

// expireLocked retires active bindings and frees quarantined ones whose
// deadline is at or before now.
// +checklocks:n.mu
func (n *NAT) expireLocked(now int64) {
	n.flushLocked()
	if u := uint32(now >> untilShift); int32(u-n.sweptUntil) > 0 {
		n.sweptUntil = u
	}
	nowTick := now / n.tickLen
	if nowTick < n.wheelTick {
		nowTick = n.wheelTick
	}
	start := n.wheelTick
	if nowTick-start >= wheelSize {
		start = nowTick - wheelSize + 1
	}
	for t := start; t <= nowTick; t++ {
		bk := uint32(t & wheelMask)
		id := n.wheel[bk]
		for id != noID {
			b := &n.slots[id]
			next := n.cold[id].wheelNext
			if b.deadline <= now && b.state&stActive != 0 {
				n.retireLocked(id, b.deadline)
			}
			if b.deadline <= now {
				n.freeLocked(id)
			} else if nb := n.bucketFor(b.deadline); nb != n.cold[id].wheelBucket {
				n.wheelUnlink(id)
				n.wheelLink(id)
				if b.state&stActive != 0 {
					n.syncLocked(id, now) // the deadline moved on: so does until
				}
			}
			id = next
		}
	}
	n.wheelTick = nowTick
}

// +checklocks:n.mu
func (n *NAT) armLocked() {
	if n.armed || n.closed || (n.inUse == 0 && n.frags.count() == 0) {
		return
	}
	n.armed = true
	if n.timer == nil {
		n.timer = n.clock.AfterFunc(n.o.SweepInterval, n.sweep)
	} else {
		n.timer.Reset(n.o.SweepInterval)
	}
}

// sweep runs on the clock: it expires bindings and fragments independently
// of traffic.
func (n *NAT) sweep() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.armed = false
	if n.closed {
		return
	}
	now := n.ns(n.clock.Now())
	n.expireLocked(now)
	n.expireFragsLocked(now)
	n.armLocked()
}

// Expire retires and frees every binding and drops every incomplete
// datagram whose time has come at now. The clock-driven sweep calls it every
// SweepInterval; callers only need it to force expiry at an exact time.
func (n *NAT) Expire(now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	t := n.ns(now)
	n.expireLocked(t)
	n.expireFragsLocked(t)
}
