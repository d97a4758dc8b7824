package vip

import (
	"fmt"
	"net/netip"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/probe"
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
func (e *Engine) emit(dir flow.Direction, pkt []byte) {
	q := e.inject
	if dir == flow.ToHost {
		q = e.hostQ
	}
	select {
	case q <- append([]byte(nil), pkt...):
	default:
		e.counters.queueFull.Add(1)
	}
}

// injectOverlay queues an engine-made packet for wireguard-go.
func (e *Engine) injectOverlay(pkt []byte) bool {
	select {
	case e.inject <- pkt:
		return true
	default:
		e.counters.queueFull.Add(1)
		return false
	}
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
		if err != nil {
			// Like wireguard-go's TUN reader, a read error ends the
			// pump: Read then reports it.
			e.hostErr.Store(&err)
			e.deadOnce.Do(func() { close(e.hostDead) })
			return
		}
	}
}

// fromHost translates the n packets read into b: overlay-bound ones stay
// (compacted to the front), hairpinned ones are written back to the host.
func (e *Engine) fromHost(b *batch, n int) {
	now := e.clock.Now()
	k := 0
	var passPkts, passBytes uint64
	e.reflect = e.reflect[:0]
	// One batch call: at large flow tables the NAT overlaps the cache
	// misses of a batch's lookups (flow's BenchmarkTranslate *-batch64).
	if len(b.pkts) < n {
		b.pkts, b.res = make([][]byte, len(b.bufs)), make([]flow.Result, len(b.bufs))
	}
	for i := 0; i < n; i++ {
		b.pkts[i] = b.bufs[i][:b.sizes[i]]
	}
	e.nat.FromHostBatch(b.pkts[:n], now, b.res[:n])
	for i := 0; i < n; i++ {
		size := b.sizes[i]
		pkt := b.pkts[i]
		switch r := b.res[i]; r.Verdict {
		case flow.Pass:
			passPkts++
			passBytes += uint64(size)
			fallthrough
		case flow.Forward:
			b.bufs[k], b.bufs[i] = b.bufs[i], b.bufs[k]
			b.sizes[k] = size
			k++
		case flow.Reflect:
			e.reflect = append(e.reflect, pkt)
		}
	}
	b.n = k
	if passPkts > 0 {
		e.counters.passOutPkts.Add(passPkts)
		e.counters.passOutBytes.Add(passBytes)
	}
	if len(e.reflect) > 0 {
		e.writeHost(e.reflect, 0)
		clear(e.reflect)
	}
	e.flushHostQ()
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
// or the host's error if the host failed.
func (e *Engine) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n := 0
	for n == 0 {
		if e.readBatch == nil {
			select {
			case b := <-e.full:
				e.readBatch, e.readPos = b, 0
			case p := <-e.inject:
				n = e.put(bufs, sizes, offset, n, p)
			case <-e.done:
				return 0, ErrEngineClosed
			case <-e.hostDead:
				if p := e.hostErr.Load(); p != nil {
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
		for n < len(bufs) {
			select {
			case p := <-e.inject:
				n = e.put(bufs, sizes, offset, n, p)
				continue
			default:
			}
			break
		}
	}
	return n, nil
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
