package flow

// +checklocks:n.mu
func (n *NAT) selectLocked(ls *listenerState, why SelectReason, prev Backend, now int64) int {
	if len(ls.backends) == 0 || ls.removed {
		return -1
	}
	i := n.o.Selector.Select(SelectRequest{
		Listener:   ls.listener,
		Candidates: ls.backends,
		Reason:     why,
		Prev:       prev,
		Now:        n.timeOf(now),
	})
	if i < 0 || i >= len(ls.backends) {
		return -1
	}
	return i
}

// hasRoomLocked reports whether one more binding fits, expiring what is due
// first when the table is full.
// +checklocks:n.mu
func (n *NAT) hasRoomLocked(now int64) bool {
	if n.inUse < n.o.Capacity {
		return true
	}
	n.expireLocked(now)
	return n.inUse < n.o.Capacity
}

// bindLocked creates a binding for client tuple k (which must have no
// forward entry) to backend be.
// +checklocks:n.mu
func (n *NAT) bindLocked(k tuple, ls *listenerState, be Backend, now int64, isn uint32, synData bool) (uint32, DropReason) {
	if !n.hasRoomLocked(now) {
		n.refused++
		return noID, ReasonCapacity
	}
	proto := k.proto()
	hairpin := be.Addr == n.o.LocalAddr
	baddr := addr4(be.Addr)
	laddr := n.local
	if hairpin {
		laddr = k.dst()
	}
	bap := be.AddrPort()
	// A reply tuple must be unique in the index (it could collide with
	// another binding's client tuple in contrived hairpin cases): hold
	// colliding ports until a free one is found, then give them back.
	var held [8]uint16
	nheld := 0
	var rk tuple
	found := false
	for nheld < len(held) {
		p, err := n.reserver.Reserve(proto, bap)
		if err != nil {
			break
		}
		rk = mkTuple(baddr, laddr, be.Port, p, proto)
		if n.idx.find(rk) == nil {
			found = true
			break
		}
		held[nheld] = p
		nheld++
	}
	for _, p := range held[:nheld] {
		n.reserver.Release(proto, bap, p)
	}
	if !found {
		return noID, ReasonNoPort
	}
	if n.idx.find(k) != nil { // cannot happen: callers retire k first
		n.reserver.Release(proto, bap, rk.dport())
		return noID, ReasonNoFlow
	}
	var id uint32
	if n.freeHead != noID {
		id = n.freeHead
		n.freeHead = n.cold[id].wheelNext
	} else {
		id = n.fresh
		n.fresh++
	}
	n.idx.insert(k, id, dirFwd, 0, 0)
	n.idx.insert(rk, id, dirRev, 0, 0)

	b := &n.slots[id]
	*b = binding{
		idle:  ls.idle,
		class: n.classRefLocked(ls, be),
		isn:   isn,
		gen:   n.gen.Load(),
		state: stActive,
	}
	n.cold[id] = bindingCold{
		client: k.src(), clientPort: k.sport(), shadow: rk.dport(),
		wheelPrev: noID, wheelNext: noID, wheelBucket: noID,
	}
	if hairpin {
		b.state |= stHairpin
	}
	if synData {
		b.state |= stSynData
	}
	b.deadline = now + b.idle
	ls.refs++
	ls.active++
	ls.created++
	bs := n.classes[b.class].bs
	bs.active++
	bs.created++
	n.inUse++
	n.created++
	n.vipRefLocked(k.dst(), 0, +1, 0)
	n.backendAddrRefs[baddr]++
	n.wheelLink(id)
	n.syncLocked(id, now)
	n.armLocked()
	return id, ReasonNone
}

// rebindLocked asks the selector for another backend for binding id and,
// when it names a different one and there is room, retires id and binds the
// flow anew. It reports the binding to use.
// +checklocks:n.mu
func (n *NAT) rebindLocked(id uint32, why SelectReason, now int64) (uint32, bool) {
	b := &n.slots[id]
	ls := n.classes[b.class].ls
	cur := n.backendOf(b)
	i := n.selectLocked(ls, why, cur, now)
	if i < 0 || ls.backends[i] == cur {
		return id, false
	}
	if !n.hasRoomLocked(now) {
		n.refused++
		ls.counters.Drops[ReasonCapacity]++
		n.drops[ReasonCapacity].Add(1)
		return id, false
	}
	k, _ := n.tuples(id)
	isn, synData := b.isn, b.state&stSynData != 0
	n.retireLocked(id, now)
	nid, r := n.bindLocked(k, ls, ls.backends[i], now, isn, synData)
	if r != ReasonNone {
		// The reserver failed; the old binding is already retired. Count it;
		// the packet goes out on nothing: the caller re-looks up.
		ls.counters.Drops[r]++
		n.drops[r].Add(1)
		return noID, true
	}
	return nid, true
}

// +checklocks:n.mu
func (n *NAT) backendOf(b *binding) Backend {
	c := &n.classes[b.class]
	return Backend{Peer: c.peer, Addr: addrFrom(c.addr), Port: c.port}
}
