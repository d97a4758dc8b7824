package netstack

import (
	"fmt"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// link is the host's stack.LinkEndpoint: a bounded ring of outbound packets
// drained by Read, with a wake-up channel instead of polling, and a
// dispatcher into which Write injects inbound packets. It carries bare IP
// packets: no link header, no link addresses, no ARP or NDP resolution.
type link struct {
	mtu uint32

	dispatcher atomic.Pointer[dispatcherBox]

	// mu guards the ring of outbound packets and the flags below.
	mu syncx.Mutex
	// +checklocks:mu
	ring []*stack.PacketBuffer
	// head is the index of the oldest packet.
	// +checklocks:mu
	head int
	// n is the number of packets queued.
	// +checklocks:mu
	n int
	// waiting says a Read waits on ready.
	// +checklocks:mu
	waiting bool
	// +checklocks:mu
	closed bool

	ready     chan struct{} // capacity 1: wakes a waiting Read
	interrupt chan struct{} // capacity 1: InterruptRead's sticky flag
	done      chan struct{} // closed by Close

	// readMu serialises Reads and guards scratch, which they share.
	readMu syncx.Mutex
	// +checklocks:readMu
	scratch []*stack.PacketBuffer

	outPackets, outBytes, outQueueFull, outTooBig atomic.Uint64
}

type dispatcherBox struct{ d stack.NetworkDispatcher }

// The link deliberately does not implement stack.GSOEndpoint. gVisor's
// software GSO (GVisorGSOSupported) lets TCP build 64 KiB segments that it
// splits just before the link; a TCP stall seen with it turned out to be
// cubic's (see Options.CongestionControl), but its gain could not be shown
// on the shared benchmark machine, so it stays off until it can.
var _ stack.LinkEndpoint = (*link)(nil)

func newLink(mtu, queue, batch int) *link {
	return &link{
		mtu:       uint32(mtu),
		ring:      make([]*stack.PacketBuffer, queue),
		ready:     make(chan struct{}, 1),
		interrupt: make(chan struct{}, 1),
		done:      make(chan struct{}),
		scratch:   make([]*stack.PacketBuffer, batch),
	}
}

// WritePackets implements stack.LinkWriter: it queues the stack's outbound
// packets for Read. It never blocks; packets that find the queue full are
// dropped and counted in Stats.OutQueueFull, like a full qdisc.
func (l *link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	all := pkts.AsSlice()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, &tcpip.ErrClosedForSend{}
	}
	n := 0
	for _, pkt := range all {
		if l.n == len(l.ring) {
			break
		}
		i := l.head + l.n
		if i >= len(l.ring) {
			i -= len(l.ring)
		}
		l.ring[i] = pkt.IncRef()
		l.n++
		n++
	}
	wake := l.waiting && n > 0
	if wake {
		l.waiting = false
	}
	l.mu.Unlock()
	if wake {
		select {
		case l.ready <- struct{}{}:
		default:
		}
	}
	if dropped := len(all) - n; dropped > 0 {
		l.outQueueFull.Add(uint64(dropped))
	}
	// Packets dropped for a full queue are reported as sent: to the stack
	// they are lost on the wire, which TCP recovers from through its
	// well-trodden loss paths (SACK, RACK, RTO). Reporting
	// ErrNoBufferSpace instead sends gVisor's TCP down a rarely used error
	// path that can leave a connection stalled with no timer armed.
	return len(all), nil
}

// queued returns how many packets wait for Read.
func (l *link) queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// take moves up to len(dst) queued packets into dst. When the queue is empty
// it returns 0 and, if wait is set and the link is open, marks a Read as
// waiting for the ready channel.
func (l *link) take(dst []*stack.PacketBuffer, wait bool) (n int, closed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, true
	}
	for n < len(dst) && l.n > 0 {
		dst[n] = l.ring[l.head]
		l.ring[l.head] = nil
		l.head++
		if l.head == len(l.ring) {
			l.head = 0
		}
		l.n--
		n++
	}
	if n == 0 && wait {
		l.waiting = true
	}
	return n, false
}

// read implements Host.Read.
func (l *link) read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if offset < 0 {
		return 0, fmt.Errorf("%w: %d", ErrBadOffset, offset)
	}
	l.readMu.Lock()
	defer l.readMu.Unlock()
	limit := min(len(bufs), len(sizes), len(l.scratch))
	n, bytes := 0, 0
	for n < limit {
		k, closed := l.take(l.scratch[:limit-n], n == 0)
		if closed {
			return 0, transport.ErrClosed
		}
		if k == 0 {
			if n > 0 {
				break
			}
			select {
			case <-l.ready:
			case <-l.done:
			case <-l.interrupt:
				l.mu.Lock()
				l.waiting = false
				closed := l.closed
				l.mu.Unlock()
				if closed { // after Close, ErrClosed wins
					return 0, transport.ErrClosed
				}
				return 0, transport.ErrInterrupted
			}
			continue
		}
		tooBig := 0
		for i := range k {
			pkt := l.scratch[i]
			l.scratch[i] = nil
			size := pkt.Size()
			if size > len(bufs[n])-offset {
				tooBig++
			} else {
				copyPacket(bufs[n][offset:offset+size], pkt)
				sizes[n] = size
				bytes += size
				n++
			}
			pkt.DecRef()
		}
		if tooBig == 0 {
			break
		}
		// Some packets did not fit: fill their places from the queue, if
		// it has more, without blocking once we have something.
		l.outTooBig.Add(uint64(tooBig))
	}
	if n > 0 {
		l.outPackets.Add(uint64(n))
		l.outBytes.Add(uint64(bytes))
	}
	return n, nil
}

// interruptRead implements Host.InterruptRead.
func (l *link) interruptRead() {
	select {
	case l.interrupt <- struct{}{}:
	default: // already pending: interrupts coalesce
	}
}

// copyPacket copies the whole of pkt (headers and payload) into dst, which
// has exactly pkt.Size() bytes, without allocating.
func copyPacket(dst []byte, pkt *stack.PacketBuffer) {
	views, off := pkt.AsViewList()
	n := 0
	for v := views.Front(); v != nil && n < len(dst); v = v.Next() {
		s := v.AsSlice()
		if off >= len(s) {
			off -= len(s)
			continue
		}
		n += copy(dst[n:], s[off:])
		off = 0
	}
}

// inject hands one inbound IP packet to the stack. The caller has checked
// the version and size.
func (l *link) inject(proto tcpip.NetworkProtocolNumber, p []byte) bool {
	box := l.dispatcher.Load()
	if box == nil {
		return false
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(p)})
	box.d.DeliverNetworkPacket(proto, pkt)
	pkt.DecRef()
	return true
}

// Close implements stack.LinkEndpoint. It discards queued packets and wakes
// a waiting Read, which then returns transport.ErrClosed. It is idempotent.
func (l *link) Close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	for l.n > 0 {
		l.ring[l.head].DecRef()
		l.ring[l.head] = nil
		l.head++
		if l.head == len(l.ring) {
			l.head = 0
		}
		l.n--
	}
	l.mu.Unlock()
}

// Attach implements stack.NetworkLinkEndpoint.
func (l *link) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		l.dispatcher.Store(nil)
		return
	}
	l.dispatcher.Store(&dispatcherBox{d})
}

// IsAttached implements stack.NetworkLinkEndpoint.
func (l *link) IsAttached() bool { return l.dispatcher.Load() != nil }

// MTU implements stack.NetworkLinkEndpoint.
func (l *link) MTU() uint32 { return l.mtu }

// SetMTU implements stack.NetworkLinkEndpoint. The host's MTU is fixed at
// creation (it is what PacketIO.MTU reports), so this is a no-op.
func (l *link) SetMTU(uint32) {}

// MaxHeaderLength implements stack.NetworkLinkEndpoint: no link header.
func (*link) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.NetworkLinkEndpoint: no link address.
func (*link) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.NetworkLinkEndpoint; a no-op.
func (*link) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.NetworkLinkEndpoint. None: checksums are
// computed and verified in the stack, since packets come from the network.
func (*link) Capabilities() stack.LinkEndpointCapabilities { return 0 }

// Wait implements stack.NetworkLinkEndpoint: the link has no goroutines.
func (*link) Wait() {}

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (*link) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint: no link header.
func (*link) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.NetworkLinkEndpoint: no link header.
func (*link) ParseHeader(*stack.PacketBuffer) bool { return true }

// SetOnCloseAction implements stack.NetworkLinkEndpoint; a no-op.
func (*link) SetOnCloseAction(func()) {}

// Read implements transport.PacketIO. It blocks until the stack has sent at
// least one packet, then copies up to min(len(bufs), BatchSize) packets into
// bufs[i][offset:] and their lengths into sizes[i]. A packet that does not
// fit its buffer after the offset is dropped and counted in
// Stats.OutTooBig, never truncated. Concurrent Reads are serialised. After
// Close it returns an error matching transport.ErrClosed; a Read blocked at
// the time returns it too. A negative offset fails with ErrBadOffset.
func (h *Host) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return h.link.read(bufs, sizes, offset)
}

// InterruptRead implements transport.ReadInterrupter: the Read in progress,
// or else the next Read that finds no packet queued, returns 0 and
// transport.ErrInterrupted. Queued packets go first: a Read that has packets
// to return returns them and leaves the interrupt for a later Read.
func (h *Host) InterruptRead() { h.link.interruptRead() }

// Write implements transport.PacketIO. It injects each bufs[i][offset:] as
// an IPv4 or IPv6 packet, chosen by the version nibble, and returns
// len(bufs). Packets that are empty, of another version, shorter than their
// header claims (Stats.InMalformed) or larger than the MTU (Stats.InTooBig)
// are dropped and counted; the stack drops and counts what else is wrong
// with a packet. Write copies the packets: the caller keeps its buffers.
// Write may be called from several goroutines at once. After Close it
// returns an error matching transport.ErrClosed. A negative offset fails
// with ErrBadOffset.
func (h *Host) Write(bufs [][]byte, offset int) (int, error) {
	if offset < 0 {
		return 0, fmt.Errorf("%w: %d", ErrBadOffset, offset)
	}
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return 0, transport.ErrClosed
	}
	var in, inBytes, malformed, tooBig uint64
	for _, b := range bufs {
		if offset >= len(b) {
			malformed++
			continue
		}
		p := b[offset:]
		if len(p) > h.opts.MTU {
			tooBig++
			continue
		}
		var proto tcpip.NetworkProtocolNumber
		switch p[0] >> 4 {
		case header.IPv4Version:
			if !header.IPv4(p).IsValid(len(p)) {
				malformed++
				continue
			}
			proto = header.IPv4ProtocolNumber
		case header.IPv6Version:
			if !header.IPv6(p).IsValid(len(p)) {
				malformed++
				continue
			}
			proto = header.IPv6ProtocolNumber
		default:
			malformed++
			continue
		}
		if h.link.inject(proto, p) {
			in++
			inBytes += uint64(len(p))
		}
	}
	if in > 0 {
		h.inPackets.Add(in)
		h.inBytes.Add(inBytes)
	}
	if malformed > 0 {
		h.inMalformed.Add(malformed)
	}
	if tooBig > 0 {
		h.inTooBig.Add(tooBig)
	}
	return len(bufs), nil
}
