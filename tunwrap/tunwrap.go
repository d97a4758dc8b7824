// Package tunwrap puts vipkit's packet path into an existing wireguard-go
// program: Wrap wraps the program's tun.Device, and the program hands the
// wrapper to device.NewDevice instead of the bare TUN. It is vipkit's
// counterpart of Tailscale's tstun.Wrapper.
//
//	host stack ⇄ TUN ⇄ [tunneler's own TUN filter] ⇄ Wrapper(Filter) ⇄ wireguard-go ⇄ Bind
//
// The Wrapper takes care of what a tun.Device middleware must get right
// with wireguard-go:
//
//   - Peer identity. tun.Device.Write carries no peer, so Options.PeerOf
//     maps a decrypted packet's source address to the peer that sent it
//     (wireguard-go admitted that source through the peer's AllowedIPs, so
//     the source identifies the peer).
//   - Serialization. wireguard-go calls Write from one goroutine per peer
//     at once; the Wrapper serializes them, so the Filter's inbound side
//     runs one batch at a time.
//   - Batch-safe drops. The buffers belong to wireguard-go. An inbound drop
//     leaves the packet out of the slice handed to the TUN; an outbound
//     batch is read into the Wrapper's own buffers and only the packets the
//     Filter keeps are copied into wireguard-go's (wireguard-go ties each
//     of its read buffers to a queue element, so they cannot be swapped).
//   - Read-ahead. A reader goroutine reads the inner TUN into a ring of
//     Options.ReadAhead batches and runs ahead of wireguard-go's Read,
//     which takes the oldest batch; so Read waits only when the host has
//     sent nothing, and the reader only when the ring is full. It is what
//     lets Read return an injected packet while no host traffic arrives.
//   - Injection both ways. InjectOutbound queues a packet for wireguard-go
//     to encrypt as if the host had sent it; InjectInbound writes a packet
//     into the host as if a peer had sent it. Both copy the packet, may be
//     called from inside the Filter (flow's Emit does) and never block on
//     the packet path: a full queue drops and counts.
//
// Order relative to the tunneler's own filter: the Wrapper belongs between
// wireguard-go and the tunneler's filter, so Wrap the TUN the filter
// already wraps. The tunneler's filter then sees the host's view (VIP
// addresses: the client connects to the VIP, replies come from it) and
// wireguard-go's AllowedIPs see the overlay view (the backend's overlay
// address after translation). Outbound: host → tunneler's filter →
// Filter.Outbound → wireguard-go. Inbound: wireguard-go → Filter.Inbound →
// tunneler's filter → host. Injected packets skip the Filter; an inbound
// injection passes through the tunneler's filter like any packet written to
// the wrapped TUN.
//
// FlowFilter adapts a flow.NAT; the vip engine, a transport.PacketIO
// wrapper, composes with a TUN through wg.PacketIOFromTUN and
// wg.TUNFromPacketIO instead.
package tunwrap

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/packet"
	"github.com/vipkit/vipkit/transport"
)

// Errors.
var (
	// ErrClosed means the Wrapper is closed. It matches transport.ErrClosed,
	// like every package's ErrClosed, and os.ErrClosed, which
	// wireguard-go checks to stop its TUN goroutines.
	ErrClosed = fmt.Errorf("tunwrap: closed: %w: %w", transport.ErrClosed, os.ErrClosed)
	// ErrQueueFull means an injection queue is full; the packet was dropped and
	// counted.
	ErrQueueFull = errors.New("tunwrap: injection queue full")
	// ErrPacketSize means an injected packet is empty or longer than the TUN's
	// buffers.
	ErrPacketSize = errors.New("tunwrap: bad injected packet size")
)

// Verdict is what the Wrapper does with a packet after the Filter saw it.
type Verdict uint8

const (
	// Accept: hand the packet on (the Filter may have rewritten it in place).
	Accept Verdict = iota
	// Drop: the packet goes no further; the Filter refused or consumed it.
	Drop
	// Reflect: the packet, rewritten in place, goes back the way it came
	// (into the host for an outbound packet, to wireguard-go for an inbound
	// one): a hairpin.
	Reflect
)

// Filter is the packet path the Wrapper runs. Outbound and Inbound may
// rewrite pkt in place, but not beyond its length; they must not keep pkt
// after returning. Outbound runs on wireguard-go's TUN reader goroutine,
// under the Wrapper's read lock (Read's), Inbound under its write lock
// (Write's): each side is called by one goroutine at a time, the two sides
// concurrently. Holding the lock across the batch is what serializes each
// side without per-packet cost, so the contract is: the Filter must not
// block, and must not call the Wrapper's Read or Write (it would wait for
// itself). It may call InjectOutbound, InjectInbound, Emit, Stats and
// Close, which take neither lock.
type Filter interface {
	// Outbound sees a packet the host sent, before wireguard-go encrypts it.
	Outbound(pkt []byte) Verdict
	// Inbound sees a packet wireguard-go decrypted, before the host gets it.
	// peer is Options.PeerOf's answer for its source; ok is false when
	// PeerOf knows no peer for it.
	Inbound(pkt []byte, peer flow.PeerID, ok bool) Verdict
}

// Options configure Wrap.
type Options struct {
	// Filter is the packet path; nil accepts everything.
	Filter Filter
	// PeerOf maps the source address of a decrypted packet to its peer.
	// It is called under the write lock, once per packet, and must not
	// block or call the Wrapper's Read or Write (see Filter). nil reports
	// no peer for any source.
	PeerOf func(src netip.Addr) (flow.PeerID, bool)
	// QueueLen bounds each injection queue, in packets; 0 means 1024.
	QueueLen int
	// BufSize is the size of the Wrapper's read buffers and of injected
	// packets' buffers; 0 means 65535 (a TUN with offloads returns
	// segments of up to 64 KiB).
	BufSize int
	// ReadAhead is how many batches the reader goroutine may read from the
	// inner TUN before Read takes them, each of the TUN's BatchSize
	// buffers of BufSize bytes. 0 means enough batches for 16 packets, at
	// least 2 and at most 8; 1 makes the reader wait for each batch to be
	// taken.
	ReadAhead int
}

// Stats counts what a Wrapper did.
type Stats struct {
	OutboundDropped, InboundDropped     uint64 // packets the Filter dropped
	OutboundReflected, InboundReflected uint64 // hairpins
	InjectedOutbound, InjectedInbound   uint64 // packets injected and delivered
	InjectDropped                       uint64 // injections refused: queue full
	Oversized                           uint64 // longer than wireguard-go's buffer: dropped
}

// Offset is the headroom the Wrapper leaves in front of injected inbound
// packets: wireguard-go's transport header, which also covers the 10-byte
// virtio header a Linux TUN with offloads writes there.
const Offset = 16

// Wrapper is a tun.Device around another one with a Filter in its path.
// Its methods are safe for concurrent use.
type Wrapper struct {
	tun    tun.Device
	filter Filter
	peerOf func(netip.Addr) (flow.PeerID, bool) // +checklocksignore: set by New, read-only after
	bufSz  int

	// The reader goroutine fills the batches of a ring: it takes an empty
	// one from empty, reads the inner TUN into it and sends it on full;
	// Read takes it from full and, once all its packets are handed on,
	// back to empty. Both channels hold every batch, so neither send ever
	// blocks. cur is a batch Read has only partly handed on (wireguard-go
	// offered fewer buffers than it holds), from packet curPos.
	bs    int // the inner TUN's batch size
	empty chan *rbatch
	full  chan *rbatch
	// rmu serializes Read and guards cur and curPos.
	rmu syncx.Mutex
	// +checklocks:rmu
	cur *rbatch
	// +checklocks:rmu
	curPos int

	outQ chan []byte // InjectOutbound → Read

	// wmu serializes Write and the inbound injections' writes, and guards
	// kept, a Write's surviving packets.
	wmu syncx.Mutex
	// +checklocks:wmu
	kept [][]byte
	// inMu guards inQ, the injected inbound packets, with Offset headroom.
	inMu syncx.Mutex
	// +checklocks:inMu
	inQ      [][]byte
	inLen    atomic.Int32 // len(inQ), read without inMu on the packet path
	queueLen int          // +checklocksignore: set by New, read-only after
	// inPath counts the Read and Write calls running the Filter. An
	// inbound injection made while one runs (from inside the Filter, or
	// from an Emit called under a NAT's lock) only queues its packet and
	// never touches wmu: the call running the Filter writes the queue once
	// the Filter is done (Write before releasing wmu, Read right after
	// its batch). So no lock is taken from inside the Filter.
	inPath atomic.Int32

	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // the reader goroutine has returned

	st struct {
		outDrop, inDrop, outRefl, inRefl, injOut, injIn, injDrop, oversized atomic.Uint64
	}
}

// rbatch is one read of the inner TUN.
type rbatch struct {
	bufs  [][]byte
	sizes []int
	n     int
	err   error
}

var _ tun.Device = (*Wrapper)(nil)

// Wrap returns a Wrapper around t and starts its reader goroutine, which
// Close stops. The Wrapper owns t: Close closes it.
func Wrap(t tun.Device, o Options) *Wrapper {
	if o.QueueLen <= 0 {
		o.QueueLen = 1024
	}
	if o.BufSize <= 0 {
		o.BufSize = 65535
	}
	if o.PeerOf == nil {
		o.PeerOf = func(netip.Addr) (flow.PeerID, bool) { return 0, false }
	}
	bs := max(t.BatchSize(), 1)
	depth := o.ReadAhead
	if depth <= 0 {
		depth = min(max(16/bs, 2), 8)
	}
	w := &Wrapper{
		tun: t, filter: o.Filter, peerOf: o.PeerOf, bufSz: o.BufSize, bs: bs,
		empty: make(chan *rbatch, depth), full: make(chan *rbatch, depth),
		outQ:     make(chan []byte, o.QueueLen),
		queueLen: o.QueueLen,
		closed:   make(chan struct{}), done: make(chan struct{}),
	}
	for range depth {
		b := &rbatch{bufs: make([][]byte, bs), sizes: make([]int, bs)}
		for i := range b.bufs {
			b.bufs[i] = make([]byte, Offset+o.BufSize)
		}
		w.empty <- b
	}
	go w.readLoop()
	return w
}

// readLoop reads the inner TUN into the ring's empty batches until the
// Wrapper or the inner TUN closes.
func (w *Wrapper) readLoop() {
	defer close(w.done)
	for {
		var b *rbatch
		select {
		case b = <-w.empty:
		case <-w.closed:
			return
		}
		b.n, b.err = w.tun.Read(b.bufs, b.sizes, Offset)
		w.full <- b // never blocks: full has room for every batch
		if b.err != nil && errors.Is(b.err, os.ErrClosed) {
			return
		}
	}
}

// File implements tun.Device: the inner TUN's file.
func (w *Wrapper) File() *os.File { return w.tun.File() }

// MTU implements tun.Device: the inner TUN's MTU.
func (w *Wrapper) MTU() (int, error) { return w.tun.MTU() }

// Name implements tun.Device: the inner TUN's name.
func (w *Wrapper) Name() (string, error) { return w.tun.Name() }

// Events implements tun.Device: the inner TUN's events.
func (w *Wrapper) Events() <-chan tun.Event { return w.tun.Events() }

// BatchSize implements tun.Device: the inner TUN's batch size.
func (w *Wrapper) BatchSize() int { return w.bs }

// Read implements tun.Device for wireguard-go: packets for peers. Injected
// outbound packets come first; then the oldest batch read from the inner
// TUN (and any later ones already read, while bufs has room), of which
// only the packets the Filter accepts are copied into bufs (a reflected
// one is written back into the host). A packet longer than its buffer in
// bufs is dropped and counted in Stats.Oversized. Read may return 0
// packets when all of them were dropped. Calls are serialized.
func (w *Wrapper) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	select {
	case <-w.closed:
		return 0, ErrClosed
	default:
	}
	if n := w.readInjected(bufs, sizes, offset, 0); n > 0 {
		return n, nil
	}
	b := w.cur
	if b == nil {
		select {
		case <-w.closed:
			return 0, ErrClosed
		case p := <-w.outQ:
			return w.readInjected(bufs, sizes, offset, w.put(bufs, sizes, offset, 0, p, &w.st.injOut)), nil
		case b = <-w.full:
		case <-w.done:
			// The reader stopped (the inner TUN closed); it sent its
			// last batch before.
			select {
			case b = <-w.full:
			default:
				return 0, ErrClosed
			}
		}
	}
	n := 0
	var err error
	w.inPath.Add(1)
	for {
		i := w.curPos
		for ; i < b.n && n < len(bufs); i++ {
			pkt := b.bufs[i][Offset : Offset+b.sizes[i]]
			v := Accept
			if w.filter != nil {
				v = w.filter.Outbound(pkt)
			}
			switch v {
			case Accept:
				n = w.put(bufs, sizes, offset, n, pkt, nil)
			case Reflect:
				w.st.outRefl.Add(1)
				w.injectInbound(pkt)
			default:
				w.st.outDrop.Add(1)
			}
		}
		if i < b.n { // bufs is full: the rest waits for the next Read
			w.cur, w.curPos = b, i
			break
		}
		w.cur, w.curPos = nil, 0
		err = b.err
		w.empty <- b // never blocks: empty has room for every batch
		if err != nil || n == len(bufs) {
			break
		}
		select {
		case b = <-w.full:
			continue
		default:
		}
		break
	}
	w.inPath.Add(-1)
	// Reflected packets and the Filter's inbound injections were queued
	// without a kick: write them now.
	w.kickInbound()
	if err != nil && errors.Is(err, os.ErrClosed) {
		err = ErrClosed
	}
	return n, err
}

// put copies pkt into bufs[n] and returns the new count, counting it in
// delivered if that is not nil; a packet longer than the buffer is dropped
// and counted (Stats.Oversized), never cut short.
func (w *Wrapper) put(bufs [][]byte, sizes []int, offset, n int, pkt []byte, delivered *atomic.Uint64) int {
	if len(pkt) > len(bufs[n])-offset {
		w.st.oversized.Add(1)
		return n
	}
	sizes[n] = copy(bufs[n][offset:], pkt)
	if delivered != nil {
		delivered.Add(1)
	}
	return n + 1
}

// readInjected moves queued outbound injections into bufs[n:] without
// blocking and returns the new count.
func (w *Wrapper) readInjected(bufs [][]byte, sizes []int, offset, n int) int {
	for n < len(bufs) {
		select {
		case p := <-w.outQ:
			n = w.put(bufs, sizes, offset, n, p, &w.st.injOut)
		default:
			return n
		}
	}
	return n
}

// Write implements tun.Device for wireguard-go: packets decrypted from
// peers, all from one peer per call, from several goroutines at once. The
// calls are serialized; each packet goes through Filter.Inbound with the
// peer PeerOf names, and the accepted ones are written to the inner TUN in
// one call. Drops are counted, not errors: Write returns len(bufs) unless
// the inner TUN fails.
func (w *Wrapper) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-w.closed:
		return 0, ErrClosed
	default:
	}
	w.wmu.Lock()
	kept := w.kept[:0]
	w.inPath.Add(1)
	for _, b := range bufs {
		pkt := b[offset:]
		v := Accept
		if w.filter != nil {
			var peer flow.PeerID
			var ok bool
			if packet.Version(pkt) == 4 && len(pkt) >= packet.IPv4MinHeaderLen {
				peer, ok = w.peerOf(packet.IPv4(pkt).Src())
			}
			v = w.filter.Inbound(pkt, peer, ok)
		}
		switch v {
		case Accept:
			kept = append(kept, b)
		case Reflect:
			w.st.inRefl.Add(1)
			_ = w.InjectOutbound(pkt) // a full queue is counted
		default:
			w.st.inDrop.Add(1)
		}
	}
	w.inPath.Add(-1)
	var err error
	if len(kept) > 0 {
		_, err = w.tun.Write(kept, offset)
	}
	clear(kept)
	w.kept = kept[:0]
	w.flushInLocked()
	w.wmu.Unlock()
	w.kickInbound()
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			err = ErrClosed
		}
		return 0, err
	}
	return len(bufs), nil
}

// InjectOutbound queues a copy of pkt, a whole IP packet, for wireguard-go
// to encrypt and send as if the host had sent it; the Filter does not see
// it. It fails with ErrQueueFull (counted in Stats.InjectDropped),
// ErrPacketSize or ErrClosed.
func (w *Wrapper) InjectOutbound(pkt []byte) error {
	if len(pkt) == 0 || len(pkt) > w.bufSz {
		return fmt.Errorf("%w: %d bytes", ErrPacketSize, len(pkt))
	}
	select {
	case <-w.closed:
		return ErrClosed
	default:
	}
	select {
	case w.outQ <- append([]byte(nil), pkt...):
		return nil
	default:
		w.st.injDrop.Add(1)
		return ErrQueueFull
	}
}

// InjectInbound writes a copy of pkt, a whole IP packet, into the host as
// if a peer had sent it; the Filter does not see it. It does not block on
// a Write in progress: the packet is queued and the holder of the write
// lock writes it. It fails with ErrQueueFull (counted), ErrPacketSize or
// ErrClosed.
func (w *Wrapper) InjectInbound(pkt []byte) error {
	if len(pkt) == 0 || len(pkt) > w.bufSz {
		return fmt.Errorf("%w: %d bytes", ErrPacketSize, len(pkt))
	}
	select {
	case <-w.closed:
		return ErrClosed
	default:
	}
	if !w.injectInbound(pkt) {
		return ErrQueueFull
	}
	w.kickInbound()
	return nil
}

// injectInbound queues a copy of pkt with Offset headroom.
func (w *Wrapper) injectInbound(pkt []byte) bool {
	b := make([]byte, Offset+len(pkt))
	copy(b[Offset:], pkt)
	w.inMu.Lock()
	defer w.inMu.Unlock()
	if len(w.inQ) >= w.queueLen {
		w.st.injDrop.Add(1)
		return false
	}
	w.inQ = append(w.inQ, b)
	w.inLen.Store(int32(len(w.inQ)))
	return true
}

// kickInbound writes queued inbound injections unless a writer holds the
// lock (it writes them before releasing it) or a Read or Write is running
// the Filter (it writes them once the Filter is done; see inPath). The
// loop closes the window between that writer's flush and its unlock. With
// nothing queued it costs one atomic load, so Write calls it after every
// batch.
//
// The injector stores inLen before it loads inPath, and a Filter's caller
// decrements inPath before it loads inLen (all sequentially consistent):
// either the injector sees no Filter running, or that caller sees the
// packet.
//
// +checklocksignore: the analyzer does not model TryLock, so it cannot see
// that flushInLocked runs with w.wmu held.
func (w *Wrapper) kickInbound() {
	for w.inLen.Load() != 0 && w.inPath.Load() == 0 && w.wmu.TryLock() {
		w.flushInLocked()
		w.wmu.Unlock()
	}
}

// flushInLocked writes the queued inbound injections.
//
// +checklocks:w.wmu
func (w *Wrapper) flushInLocked() {
	if w.inLen.Load() == 0 {
		return
	}
	w.inMu.Lock()
	q := w.inQ
	w.inQ = nil
	w.inLen.Store(0)
	w.inMu.Unlock()
	if len(q) == 0 {
		return
	}
	if _, err := w.tun.Write(q, Offset); err == nil {
		w.st.injIn.Add(uint64(len(q)))
	}
}

// Stats returns the Wrapper's counters.
func (w *Wrapper) Stats() Stats {
	return Stats{
		OutboundDropped: w.st.outDrop.Load(), InboundDropped: w.st.inDrop.Load(),
		OutboundReflected: w.st.outRefl.Load(), InboundReflected: w.st.inRefl.Load(),
		InjectedOutbound: w.st.injOut.Load(), InjectedInbound: w.st.injIn.Load(),
		InjectDropped: w.st.injDrop.Load(), Oversized: w.st.oversized.Load(),
	}
}

// Close closes the inner TUN, stops the reader goroutine and makes Read,
// Write and the injections return ErrClosed. It is idempotent and returns
// the inner TUN's Close error.
func (w *Wrapper) Close() error {
	w.closeOnce.Do(func() {
		close(w.closed)
		w.closeErr = w.tun.Close()
		<-w.done
	})
	return w.closeErr
}
