package wg

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Impairment is what a UDPBind does to the packets it sends to one
// destination (or to all). The zero value sends every packet at once.
type Impairment struct {
	// Latency delays every packet.
	Latency time.Duration
	// Jitter varies the delay uniformly in [Latency-Jitter, Latency+Jitter]
	// (never below 0). Like netem's, jitter reorders packets.
	Jitter time.Duration
	// Loss is the probability in [0,1] that a packet is dropped.
	Loss float64
}

// Validate reports an impairment outside its ranges.
func (i Impairment) Validate() error {
	if i.Latency < 0 || i.Jitter < 0 {
		return fmt.Errorf("%w: negative latency or jitter (%v, %v)", ErrBadImpairment, i.Latency, i.Jitter)
	}
	if !(i.Loss >= 0 && i.Loss <= 1) {
		return fmt.Errorf("%w: loss %v outside [0,1]", ErrBadImpairment, i.Loss)
	}
	return nil
}

func (i Impairment) isZero() bool { return i == Impairment{} }

// ErrBadImpairment reports an Impairment outside its ranges.
var ErrBadImpairment = errors.New("wg: bad impairment")

// UDPDropReason says why a UDPBind dropped a packet.
type UDPDropReason uint8

// Drop reasons of a UDPBind.
const (
	UDPDropLoss      UDPDropReason = iota // random loss
	UDPDropPartition                      // the destination was cut
	UDPDropQueueFull                      // too many packets already delayed
	UDPDropClosed                         // the bind closed with the packet still delayed
	numUDPDropReasons
)

func (r UDPDropReason) String() string {
	switch r {
	case UDPDropLoss:
		return "loss"
	case UDPDropPartition:
		return "partition"
	case UDPDropQueueFull:
		return "queue-full"
	case UDPDropClosed:
		return "closed"
	}
	return fmt.Sprintf("drop(%d)", uint8(r))
}

// UDPBindStats counts what a UDPBind did with the packets it was asked to
// send, per destination or in total.
type UDPBindStats struct {
	Sent    uint64 // packets handed to Send
	Delayed uint64 // packets held back by latency or jitter
	Passed  uint64 // packets handed to the socket (at once or after a delay)
	Dropped [numUDPDropReasons]uint64
}

// TotalDropped sums the drops of every reason.
func (s UDPBindStats) TotalDropped() uint64 {
	var n uint64
	for _, d := range s.Dropped {
		n += d
	}
	return n
}

// UDPBindOptions sets up NewUDPBind. The zero value is real UDP sockets with
// no impairment, on the real clock.
type UDPBindOptions struct {
	// Clock schedules delayed packets; nil means the real clock.
	Clock transport.Clock
	// Seed seeds the random choices (loss, jitter).
	Seed uint64
	// MaxDelayed bounds the packets held back at once; more are dropped and
	// counted (UDPDropQueueFull). 0 means 65536.
	MaxDelayed int
	// Inner is the bind that owns the sockets; nil means
	// conn.NewStdNetBind() (IPv4 and IPv6 UDP on all interfaces).
	Inner conn.Bind
}

// UDPBind is a conn.Bind on real UDP sockets that can impair its own sends
// in real time: per-destination or default latency, jitter and loss, and
// partitions (Cut/Heal), all changeable while traffic flows. Tests whose
// nodes live in separate processes or network namespaces give every node a
// UDPBind, so that every leg of every path can be impaired. Receiving is
// never impaired: impair the sender.
//
// Delayed packets are copied and sent in due order from a Clock timer (one
// pending at a time, not one per packet); a packet's fate is decided when it
// is sent. With no impairment at all, Send goes straight to the socket and
// allocates nothing.
//
// A UDPBind can be opened again after Close (wireguard-go does so when its
// port changes); Close drops the delayed packets (UDPDropClosed). Its methods
// are safe for concurrent use.
type UDPBind struct {
	inner    conn.Bind
	clock    transport.Clock
	maxDelay int // +checklocksignore: set by NewUDPBind, read-only after

	impaired atomic.Bool // any impairment or cut in force
	open     atomic.Bool

	// mu guards the impairments, the delayed packets and their timer, and
	// the statistics.
	mu syncx.Mutex
	// +checklocks:mu
	rng *rand.Rand
	// +checklocks:mu
	def Impairment
	// +checklocks:mu
	per map[netip.AddrPort]Impairment
	// +checklocks:mu
	cutAll bool
	// +checklocks:mu
	cut map[netip.AddrPort]bool
	// +checklocks:mu
	pending delayHeap
	// +checklocks:mu
	seq uint64
	// +checklocks:mu
	timer transport.Timer
	// armed is when timer fires; zero if not armed.
	// +checklocks:mu
	armed time.Time
	// +checklocks:mu
	total UDPBindStats
	// +checklocks:mu
	stats map[netip.AddrPort]*UDPBindStats
	fast  fastCounters // counts of the unimpaired fast path, atomics

	// flushMu lets one flush run at a time, so that delayed packets keep
	// their order, and guards batch, the flush's scratch.
	flushMu syncx.Mutex
	// +checklocks:flushMu
	batch   [][]byte
	pool    sync.Pool // *[]byte copies of delayed packets
	scratch sync.Pool // *[][]byte lists of packets that Send passes at once
}

// fastCounters count the fast path without the lock.
type fastCounters struct {
	sent atomic.Uint64
}

var _ conn.Bind = (*UDPBind)(nil)

// NewUDPBind returns a UDPBind with no impairment; set some with
// SetDefault, SetPeer and Cut, before or after Open.
func NewUDPBind(o UDPBindOptions) *UDPBind {
	inner := o.Inner
	if inner == nil {
		inner = conn.NewStdNetBind()
	}
	if o.MaxDelayed <= 0 {
		o.MaxDelayed = 1 << 16
	}
	b := &UDPBind{
		inner:    inner,
		clock:    transport.Or(o.Clock),
		maxDelay: o.MaxDelayed,
		rng:      rand.New(rand.NewPCG(o.Seed, o.Seed^0x5851f42d4c957f2d)),
		per:      make(map[netip.AddrPort]Impairment),
		cut:      make(map[netip.AddrPort]bool),
		stats:    make(map[netip.AddrPort]*UDPBindStats),
	}
	b.pool.New = func() any { s := make([]byte, 0, 2048); return &s }
	b.scratch.New = func() any { s := make([][]byte, 0, conn.IdealBatchSize); return &s }
	return b
}

// SetDefault sets the impairment of every destination without its own.
func (b *UDPBind) SetDefault(i Impairment) error {
	if err := i.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	b.def = i
	b.updateLocked()
	b.mu.Unlock()
	return nil
}

// SetPeer sets the impairment of packets to dst (an endpoint, ip:port).
func (b *UDPBind) SetPeer(dst netip.AddrPort, i Impairment) error {
	if err := i.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	b.per[dst] = i
	b.updateLocked()
	b.mu.Unlock()
	return nil
}

// ClearPeer makes dst use the default impairment again.
func (b *UDPBind) ClearPeer(dst netip.AddrPort) {
	b.mu.Lock()
	delete(b.per, dst)
	b.updateLocked()
	b.mu.Unlock()
}

// Cut partitions this bind from the given destinations, or from every
// destination when none is given: packets sent to them are dropped
// (UDPDropPartition) until Heal. Packets already delayed still go, as on a
// real wire.
func (b *UDPBind) Cut(dsts ...netip.AddrPort) {
	b.mu.Lock()
	if len(dsts) == 0 {
		b.cutAll = true
	}
	for _, d := range dsts {
		b.cut[d] = true
	}
	b.updateLocked()
	b.mu.Unlock()
}

// Heal restores the given destinations, or every destination (and the
// cut-all of Cut()) when none is given. Impairments are kept.
func (b *UDPBind) Heal(dsts ...netip.AddrPort) {
	b.mu.Lock()
	if len(dsts) == 0 {
		b.cutAll = false
		clear(b.cut)
	}
	for _, d := range dsts {
		delete(b.cut, d)
	}
	b.updateLocked()
	b.mu.Unlock()
}

// IsCut reports whether packets to dst are being dropped by a partition.
func (b *UDPBind) IsCut(dst netip.AddrPort) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cutAll || b.cut[dst]
}

// +checklocks:b.mu
func (b *UDPBind) updateLocked() {
	on := b.cutAll || len(b.cut) > 0 || !b.def.isZero()
	for _, i := range b.per {
		on = on || !i.isZero()
	}
	b.impaired.Store(on)
}

// Stats returns the totals over every destination.
func (b *UDPBind) Stats() UDPBindStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.total
	f := b.fast.sent.Load()
	s.Sent += f
	s.Passed += f
	return s
}

// PeerStats returns the counters of packets sent to dst while some
// impairment was in force (the unimpaired fast path counts only totals).
func (b *UDPBind) PeerStats(dst netip.AddrPort) UDPBindStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.stats[dst]; s != nil {
		return *s
	}
	return UDPBindStats{}
}

// Delayed returns how many packets are being held back now.
func (b *UDPBind) Delayed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// Open implements conn.Bind by opening the inner bind.
func (b *UDPBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, p, err := b.inner.Open(port)
	if err != nil {
		return nil, 0, err
	}
	b.open.Store(true)
	return fns, p, nil
}

// Close implements conn.Bind: it drops the delayed packets, waits for a
// flush in progress, and closes the inner bind. It is idempotent.
func (b *UDPBind) Close() error {
	b.open.Store(false)
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
		b.armed = time.Time{}
	}
	for _, d := range b.pending {
		b.countLocked(d.dst, func(s *UDPBindStats) { s.Dropped[UDPDropClosed]++ })
		b.putBuf(d.buf)
	}
	b.pending = b.pending[:0]
	b.mu.Unlock()
	// A flush that already popped its packets finishes before the sockets
	// close.
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	return b.inner.Close()
}

// SetMark implements conn.Bind.
func (b *UDPBind) SetMark(mark uint32) error { return b.inner.SetMark(mark) }

// ParseEndpoint implements conn.Bind (the inner bind's endpoints).
func (b *UDPBind) ParseEndpoint(s string) (conn.Endpoint, error) { return b.inner.ParseEndpoint(s) }

// BatchSize implements conn.Bind.
func (b *UDPBind) BatchSize() int { return b.inner.BatchSize() }

// Send implements conn.Bind: it applies the destination's impairment to
// each packet and hands what survives to the inner bind, at once or after
// its delay. Dropped packets are not errors. After Close it fails with
// net.ErrClosed.
func (b *UDPBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	if !b.open.Load() {
		return net.ErrClosed
	}
	if !b.impaired.Load() {
		b.fast.sent.Add(uint64(len(bufs)))
		return b.inner.Send(bufs, ep)
	}
	dst := endpointAddr(ep)
	now := b.clock.Now()
	b.mu.Lock()
	imp, ok := b.per[dst]
	if !ok {
		imp = b.def
	}
	cut := b.cutAll || b.cut[dst]
	st := b.statsLocked(dst)
	nowList := b.scratch.Get().(*[][]byte)
	immediate := (*nowList)[:0]
	for _, buf := range bufs {
		st.Sent++
		b.total.Sent++
		switch {
		case cut:
			st.Dropped[UDPDropPartition]++
			b.total.Dropped[UDPDropPartition]++
			continue
		case imp.Loss > 0 && b.rng.Float64() < imp.Loss:
			st.Dropped[UDPDropLoss]++
			b.total.Dropped[UDPDropLoss]++
			continue
		}
		d := imp.Latency
		if imp.Jitter > 0 {
			d += time.Duration((b.rng.Float64()*2 - 1) * float64(imp.Jitter))
		}
		if d <= 0 {
			immediate = append(immediate, buf)
			st.Passed++
			b.total.Passed++
			continue
		}
		if len(b.pending) >= b.maxDelay {
			st.Dropped[UDPDropQueueFull]++
			b.total.Dropped[UDPDropQueueFull]++
			continue
		}
		st.Delayed++
		b.total.Delayed++
		b.seq++
		cp := b.getBuf(buf)
		heap.Push(&b.pending, delayed{due: now.Add(d), seq: b.seq, buf: cp, ep: ep, dst: dst})
	}
	b.armLocked(now)
	b.mu.Unlock()
	var err error
	if len(immediate) > 0 {
		err = b.inner.Send(immediate, ep)
	}
	clear(immediate)
	*nowList = immediate[:0]
	b.scratch.Put(nowList)
	return err
}

// armLocked makes the timer fire for the earliest delayed packet.
//
// +checklocks:b.mu
func (b *UDPBind) armLocked(now time.Time) {
	if len(b.pending) == 0 {
		return
	}
	due := b.pending[0].due
	if !b.armed.IsZero() && !due.Before(b.armed) {
		return
	}
	d := max(due.Sub(now), 0)
	b.armed = due
	if b.timer == nil {
		b.timer = b.clock.AfterFunc(d, b.flush)
	} else {
		b.timer.Reset(d)
	}
}

// flush sends every delayed packet that is due, in due order, batching
// consecutive packets to one endpoint.
func (b *UDPBind) flush() {
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	b.mu.Lock()
	now := b.clock.Now()
	b.armed = time.Time{}
	var due []delayed
	for len(b.pending) > 0 && !b.pending[0].due.After(now) {
		due = append(due, heap.Pop(&b.pending).(delayed))
	}
	if len(b.pending) > 0 {
		b.armLocked(now)
	}
	for _, d := range due {
		st := b.statsLocked(d.dst)
		st.Passed++
		b.total.Passed++
	}
	b.mu.Unlock()

	limit := b.inner.BatchSize()
	for i := 0; i < len(due); {
		j := i
		b.batch = b.batch[:0]
		for j < len(due) && due[j].ep == due[i].ep && len(b.batch) < limit {
			b.batch = append(b.batch, *due[j].buf)
			j++
		}
		_ = b.inner.Send(b.batch, due[i].ep) // a failed send is a lost datagram
		for k := i; k < j; k++ {
			b.putBuf(due[k].buf)
		}
		i = j
	}
	clear(b.batch)
}

func (b *UDPBind) getBuf(p []byte) *[]byte {
	s := b.pool.Get().(*[]byte)
	*s = append((*s)[:0], p...)
	return s
}

func (b *UDPBind) putBuf(s *[]byte) {
	if cap(*s) > 1<<16 {
		return
	}
	*s = (*s)[:0]
	b.pool.Put(s)
}

// +checklocks:b.mu
func (b *UDPBind) statsLocked(dst netip.AddrPort) *UDPBindStats {
	s := b.stats[dst]
	if s == nil {
		s = new(UDPBindStats)
		b.stats[dst] = s
	}
	return s
}

// +checklocks:b.mu
func (b *UDPBind) countLocked(dst netip.AddrPort, f func(*UDPBindStats)) {
	f(b.statsLocked(dst))
	f(&b.total)
}

// endpointAddr returns ep's destination.
func endpointAddr(ep conn.Endpoint) netip.AddrPort {
	switch e := ep.(type) {
	case *conn.StdNetEndpoint:
		return e.AddrPort
	case interface{ DstAddrPort() netip.AddrPort }:
		return e.DstAddrPort()
	}
	a, _ := netip.ParseAddrPort(ep.DstToString())
	return a
}

// delayed is one packet held back.
type delayed struct {
	due time.Time
	seq uint64 // send order, to break ties
	buf *[]byte
	ep  conn.Endpoint
	dst netip.AddrPort
}

type delayHeap []delayed

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if c := h[i].due.Compare(h[j].due); c != 0 {
		return c < 0
	}
	return h[i].seq < h[j].seq
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = delayed{}
	*h = old[:len(old)-1]
	return x
}
