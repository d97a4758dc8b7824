package vip

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport"
)

// admit is flow's Admit: the source must be in the overlay range, then the
// caller's rule applies.
func (e *Engine) admit(peer flow.PeerID, src, dst netip.Addr) bool {
	if !e.prefix.Contains(src) {
		return false
	}
	if e.o.Admit == nil {
		return true
	}
	return e.o.Admit(e.peers.Load().node[peer], src, dst)
}

// emit is flow's Emit: it copies the packet to the queue of its direction.
// A host datagram the NAT reassembled and let pass (one to an address that
// only drains, see flow.NAT.FromHost) leaves here, not through
// translateOut, so the probe port is guarded here too (toProbePort).
func (e *Engine) emit(dir flow.Direction, pkt []byte) {
	if dir == flow.ToOverlay {
		if e.toProbePort(pkt) {
			e.counters.hostProbe.Add(1)
			return
		}
		e.injectOverlay(append([]byte(nil), pkt...))
		return
	}
	select {
	case e.hostQ <- append([]byte(nil), pkt...):
	default:
		e.counters.queueFull.Add(1)
	}
}

// injectOverlay queues an engine-made packet for wireguard-go and, on a
// direct host, wakes a host Read that may be blocked, so that Read returns
// the packet even while the host is idle.
func (e *Engine) injectOverlay(pkt []byte) bool {
	select {
	case e.inject <- pkt:
	default:
		e.counters.queueFull.Add(1)
		return false
	}
	// pending is published before reading is looked at, and Read sets
	// reading before it looks at pending (both sequentially consistent):
	// either Read sees the packet, or this sees Read in the host.
	e.pending.Add(1)
	if e.direct != nil && e.reading.Load() {
		e.direct.InterruptRead()
	}
	return true
}

// takeInjected moves queued engine-made packets into bufs[n:] without
// blocking and returns the new count.
func (e *Engine) takeInjected(bufs [][]byte, sizes []int, offset, n int) int {
	for n < len(bufs) {
		select {
		case p := <-e.inject:
			e.pending.Add(-1)
			n = e.put(bufs, sizes, offset, n, p)
		default:
			return n
		}
	}
	return n
}

// pump reads the host in batches, runs each packet through the NAT and
// hands what goes to the overlay to Read.
func (e *Engine) pump() {
	defer close(e.pumpDone)
	for {
		var b *batch
		select {
		case b = <-e.free:
		case <-e.done:
			return
		}
		n, err := e.host.Read(b.bufs, b.sizes, 0)
		b.n = 0
		if n > 0 {
			e.fromHost(b, n)
		}
		if b.n > 0 {
			select {
			case e.full <- b:
			case <-e.done:
				return
			}
		} else {
			e.free <- b
		}
		if err != nil && n == 0 {
			// Like wireguard-go's TUN reader, a read error ends the
			// pump: Read then reports it. One that came with packets
			// is taken as transient (a TUN's tun.ErrTooManySegments
			// comes with the segments that fit): the pump reads on,
			// and a lasting error returns with none. (A copy, so that
			// err itself stays off the heap on the path.)
			hostErr := err
			e.hostErr.Store(&hostErr)
			e.deadOnce.Do(func() { close(e.hostDead) })
			return
		}
	}
}

// fromHost translates the n packets read into the pump's batch b and keeps
// the overlay-bound ones (see translateOut).
func (e *Engine) fromHost(b *batch, n int) {
	if len(b.pkts) < n {
		b.pkts, b.res = make([][]byte, len(b.bufs)), make([]flow.Result, len(b.bufs))
	}
	b.n = e.translateOut(b.bufs, b.sizes, 0, n, b.pkts, b.res, true)
}

// translateOut runs the n host packets bufs[i][offset:offset+sizes[i]]
// through the NAT, writes hairpinned ones back to the host and compacts the
// overlay-bound ones, in order, to the front; it returns how many those
// are. Buffers the engine owns (own) are compacted by swapping them;
// wireguard-go's stay in place (it ties each to a queue element), so a kept
// packet behind a dropped one is copied forward. pkts and res are scratch
// of at least n entries.
func (e *Engine) translateOut(bufs [][]byte, sizes []int, offset, n int, pkts [][]byte, res []flow.Result, own bool) int {
	now := e.clock.Now()
	for i := 0; i < n; i++ {
		pkts[i] = bufs[i][offset : offset+sizes[i]]
	}
	// One batch call: at large flow tables the NAT overlaps the cache
	// misses of a batch's lookups (flow's BenchmarkTranslate *-batch64).
	e.nat.FromHostBatch(pkts[:n], now, res[:n])
	var passPkts, passBytes uint64
	kept := 0
	e.reflect = e.reflect[:0]
	for i := 0; i < n; i++ {
		switch res[i].Verdict {
		case flow.Pass:
			if e.toProbePort(pkts[i]) {
				res[i].Verdict = flow.Drop
				e.counters.hostProbe.Add(1)
				continue
			}
			passPkts++
			passBytes += uint64(sizes[i])
			kept++
		case flow.Forward:
			if e.toProbePort(pkts[i]) {
				res[i].Verdict = flow.Drop
				e.counters.hostProbe.Add(1)
				continue
			}
			kept++
		case flow.Reflect:
			// With the headroom in front: a TUN writes its virtio
			// header there instead of copying the packet.
			e.reflect = append(e.reflect, bufs[i][:offset+sizes[i]])
		}
	}
	if len(e.reflect) > 0 {
		// Before the compaction, which may overwrite these in place.
		e.writeHost(e.reflect, offset)
		clear(e.reflect)
	}
	if kept < n {
		k := 0
		for i := 0; i < n; i++ {
			if v := res[i].Verdict; v != flow.Pass && v != flow.Forward {
				continue
			}
			if k != i {
				if own {
					bufs[k], bufs[i] = bufs[i], bufs[k]
					sizes[k] = sizes[i]
				} else {
					sizes[k] = copy(bufs[k][offset:], pkts[i])
				}
			}
			k++
		}
	}
	if passPkts > 0 {
		e.counters.passOutPkts.Add(passPkts)
		e.counters.passOutBytes.Add(passBytes)
	}
	e.flushHostQ()
	return kept
}

// toProbePort reports whether a host packet, as it leaves for the overlay
// (after the NAT), is UDP to the probe port of an overlay address. The
// probe port belongs to the engines: they make and answer probes
// themselves, and a peer takes what arrives there as this node's probes.
// A host process (any local user, through a proxy or a TUN) must not speak
// there as the node, so such packets are dropped and counted. A first
// fragment carries the port and is dropped; later ones, without it, can
// never be taken for a probe.
func (e *Engine) toProbePort(pkt []byte) bool {
	return probe.IsToPort(pkt, e.probePort) && e.prefix.Contains(packet.IPv4(pkt).Dst())
}

// flushHostQ writes the NAT's host-bound output (reassembled and
// refragmented datagrams) to the host.
func (e *Engine) flushHostQ() {
	for {
		select {
		case p := <-e.hostQ:
			e.writeHost([][]byte{p}, 0)
		default:
			return
		}
	}
}

func (e *Engine) writeHost(bufs [][]byte, offset int) {
	e.hostMu.Lock()
	_, err := e.host.Write(bufs, offset)
	e.hostMu.Unlock()
	if err != nil {
		e.counters.hostWriteErr.Add(1)
	}
}

// Read implements transport.PacketIO for wireguard-go: the packets to
// encrypt, translated host traffic and the engine's own packets. It blocks
// until at least one is available and returns ErrEngineClosed after Close,
// or the host's error if the host failed. On a direct host (see
// EngineOptions.ReadAhead) the host fills bufs itself, and the host's own
// errors pass through with the packets read before them, as from a TUN.
func (e *Engine) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if e.direct != nil {
		return e.readDirect(bufs, sizes, offset)
	}
	n := 0
	for n == 0 {
		if e.readBatch == nil {
			select {
			case b := <-e.full:
				e.readBatch, e.readPos = b, 0
			case p := <-e.inject:
				e.pending.Add(-1)
				n = e.put(bufs, sizes, offset, n, p)
			case <-e.done:
				return 0, ErrEngineClosed
			case <-e.hostDead:
				// Close closes done before the host, so a host that
				// failed because of Close reports ErrEngineClosed.
				if p := e.hostErr.Load(); p != nil && !e.isClosed() {
					return 0, fmt.Errorf("vip: engine host: %w", *p)
				}
				return 0, ErrEngineClosed
			}
		}
		if b := e.readBatch; b != nil {
			for e.readPos < b.n && n < len(bufs) {
				n = e.put(bufs, sizes, offset, n, b.bufs[e.readPos][:b.sizes[e.readPos]])
				e.readPos++
			}
			if e.readPos >= b.n {
				e.readBatch = nil
				e.free <- b
			}
		}
		n = e.takeInjected(bufs, sizes, offset, n)
	}
	return n, nil
}

// readDirect is Read on a host that can interrupt its Read: the host reads
// into bufs, the NAT translates there, and engine-made packets fill what
// room is left. An engine-made packet queued while the host is idle
// interrupts the host's Read (injectOverlay), so it leaves at once.
func (e *Engine) readDirect(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(e.directPkts) < len(bufs) {
		e.directPkts, e.directRes = make([][]byte, len(bufs)), make([]flow.Result, len(bufs))
	}
	for {
		if n := e.takeInjected(bufs, sizes, offset, 0); n > 0 {
			return n, nil
		}
		if e.isClosed() {
			return 0, ErrEngineClosed
		}
		e.reading.Store(true)
		if e.pending.Load() > 0 {
			e.reading.Store(false)
			continue
		}
		n, err := e.host.Read(bufs, sizes, offset)
		e.reading.Store(false)
		if n > 0 {
			n = e.translateOut(bufs, sizes, offset, n, e.directPkts, e.directRes, false)
			n = e.takeInjected(bufs, sizes, offset, n)
		}
		switch {
		case err == nil:
		case errors.Is(err, transport.ErrInterrupted):
			// Whatever woke it is in inject, taken above or on the
			// next turn.
		case e.isClosed():
			return n, ErrEngineClosed
		default:
			return n, fmt.Errorf("vip: engine host: %w", err)
		}
		if n > 0 {
			return n, nil
		}
		// Every packet read was hairpinned or dropped: read again.
	}
}

// put copies pkt into bufs[n] (dropping it if it does not fit) and returns
// the new count.
func (e *Engine) put(bufs [][]byte, sizes []int, offset, n int, pkt []byte) int {
	if len(bufs[n])-offset < len(pkt) {
		e.counters.tooBig.Add(1)
		return n
	}
	sizes[n] = copy(bufs[n][offset:], pkt)
	return n + 1
}

// Write implements transport.PacketIO for wireguard-go: the packets it
// decrypted. Probes to this node are answered or measured; the rest goes
// through the NAT's peer path (admission, reverse NAT) into the host. It
// returns len(bufs): drops are counted, not errors.
func (e *Engine) Write(bufs [][]byte, offset int) (int, error) {
	if e.isClosed() {
		return 0, ErrEngineClosed
	}
	now := e.clock.Now()
	pt := e.peers.Load()
	out := e.writeOut[:0]
	if cap(e.writeRun) < len(bufs) {
		e.writeRun = make([][]byte, 0, len(bufs))
		e.writeRunBufs = make([][]byte, 0, len(bufs))
		e.writeResults = make([]flow.Result, len(bufs))
	}
	// Packets go to the NAT in runs from one peer (a wireguard-go Write
	// carries one peer's packets), one batch call per run: at large flow
	// tables the NAT overlaps the runs' cache misses.
	run, runBufs := e.writeRun[:0], e.writeRunBufs[:0]
	runPeer := unknownPeer
	var passPkts, passBytes uint64
	for i := 0; i <= len(bufs); i++ {
		var pkt []byte
		peer := unknownPeer
		if i < len(bufs) {
			buf := bufs[i]
			if len(buf) < offset {
				continue
			}
			pkt = buf[offset:]
			v := packet.Version(pkt)
			if v != 4 && v != 6 {
				e.counters.malformed.Add(1) // wireguard-go drops these too; never hand them on
				continue
			}
			if ip := packet.IPv4(pkt); v == 4 && len(pkt) >= packet.IPv4MinHeaderLen {
				if id, ok := pt.byAddr[ip.Src32()]; ok {
					peer = id
				} else {
					e.counters.unknownPeer.Add(1)
				}
				if ip.Dst32() == e.local4 && probe.IsProbePacket(pkt, e.probePort) {
					e.handleProbe(pkt, pt, peer, now)
					continue
				}
			}
		}
		if len(run) > 0 && (i == len(bufs) || peer != runPeer) {
			res := e.writeResults[:len(run)]
			e.nat.FromPeerBatch(run, runPeer, now, res)
			for j := range run {
				switch res[j].Verdict {
				case flow.Pass:
					passPkts++
					passBytes += uint64(len(run[j]))
					out = append(out, runBufs[j])
				case flow.Forward:
					out = append(out, runBufs[j])
				}
			}
			clear(run)
			clear(runBufs)
			run, runBufs = run[:0], runBufs[:0]
		}
		if i < len(bufs) {
			run, runBufs, runPeer = append(run, pkt), append(runBufs, bufs[i]), peer
		}
	}
	e.writeRun, e.writeRunBufs = run, runBufs
	if passPkts > 0 {
		e.counters.passInPkts.Add(passPkts)
		e.counters.passInBytes.Add(passBytes)
	}
	if len(out) > 0 {
		e.writeHost(out, offset)
	}
	clear(out)
	e.writeOut = out[:0]
	e.flushHostQ()
	return len(bufs), nil
}
