package wgtest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// SimBind is a conn.Bind over a transporttest.Network: the encrypted UDP of
// a wireguard-go device travels through the simulated network, so the
// network's latency, jitter, loss, reordering and partitions act on the real
// WireGuard protocol (handshakes, retransmits, keepalives, roaming).
//
// A SimBind is one host on the network. NewSimBind attaches its node at
// once, so its address (Addr, the Endpoint other peers configure) and its
// Node (for SetLink, Cut, Partition) are known before any device runs.
// Open(0), or Open with the node's port, listens there; Open with another
// port attaches one more node at the same IP and that port (kept for later
// Opens: a Node's address stays taken).
//
// Close unblocks the receive functions, which then return net.ErrClosed, and
// drops what arrives until the next Open. A SimBind starts no goroutine.
// Its methods are safe for concurrent use.
type SimBind struct {
	// The fields up to mu are set by the constructor and read-only after;
	// those read under mu only are marked +checklocksignore, so that the
	// analyzer does not take them for guarded.
	net   *transporttest.Network // +checklocksignore
	name  string                 // +checklocksignore
	batch int
	queue int // +checklocksignore

	base    *transporttest.Node // the node attached at construction
	baseErr error               // why base could not be attached
	inbox   bool                // base was given with an inbox (NewSimBindOnNode)

	// mu serializes Open and Close and guards ports.
	mu syncx.Mutex
	// +checklocks:mu
	ports map[uint16]*simPort
	open  atomic.Pointer[simPort] // the listening port, nil when closed

	// epMu guards eps, the endpoints handed out by ParseEndpoint.
	epMu syncx.Mutex
	// +checklocks:epMu
	eps map[netip.AddrPort]*SimEndpoint

	stats simCounters
}

// simPort is one node of a SimBind and the session listening on it.
type simPort struct {
	node *transporttest.Node
	in   <-chan transporttest.Packet // the node's inbox, or sess's queue
	own  bool                        // in is fed by handler, not the node's inbox
	sess atomic.Pointer[simSession]
}

// simSession is one Open…Close period of a port.
type simSession struct {
	q    chan transporttest.Packet
	done chan struct{}
}

type simCounters struct {
	sent, received                  atomic.Uint64
	droppedClosed, droppedQueueFull atomic.Uint64
	droppedTooBig                   atomic.Uint64
}

// SimBindStats counts what a SimBind did. The network's own counters
// (transporttest.Network.Stats) count what happened on the wire.
type SimBindStats struct {
	Sent     uint64 // packets handed to the network
	Received uint64 // packets returned to wireguard-go
	// DroppedClosed counts packets that arrived while the bind was closed,
	// as a closed UDP socket would drop them.
	DroppedClosed uint64
	// DroppedQueueFull counts packets that arrived to a full receive queue.
	DroppedQueueFull uint64
	// DroppedTooBig counts packets larger than wireguard-go's buffer.
	DroppedTooBig uint64
}

// SimBindOptions tunes NewSimBindWithOptions. The zero value gives the
// defaults of NewSimBind.
type SimBindOptions struct {
	// Addr is the node's address; the zero value lets the network choose
	// (198.18.0.N:51820).
	Addr netip.AddrPort
	// BatchSize is the most packets one receive call returns and one Send
	// takes; 0 means conn.IdealBatchSize (128).
	BatchSize int
	// Queue is the receive queue per port, in packets; 0 means 4096.
	Queue int
}

var (
	_ conn.Bind     = (*SimBind)(nil)
	_ conn.Endpoint = (*SimEndpoint)(nil)
)

// NewSimBind attaches a node named name to n and returns a Bind on it. If
// the node cannot be attached (the network is closed), Open reports why.
func NewSimBind(n *transporttest.Network, name string) *SimBind {
	return NewSimBindWithOptions(n, name, SimBindOptions{})
}

// NewSimBindWithOptions is NewSimBind with options.
func NewSimBindWithOptions(n *transporttest.Network, name string, o SimBindOptions) *SimBind {
	b := newSimBind(n, name, o)
	p := &simPort{own: true}
	nd, err := n.AddNode(name, transporttest.NodeOptions{Addr: o.Addr, Handler: b.handler(p)})
	if err != nil {
		b.baseErr = fmt.Errorf("wgtest: sim bind %q: %w", name, err)
		return b
	}
	p.node = nd
	b.base = nd
	b.ports[nd.Addr().Port()] = p // +checklocksignore: b is not shared yet
	return b
}

// NewSimBindOnNode returns a Bind on an existing node, which must have been
// added without a Handler: the Bind reads the node's inbox. Open with
// another port attaches nodes as NewSimBind does.
func NewSimBindOnNode(nd *transporttest.Node, o SimBindOptions) *SimBind {
	b := newSimBind(nd.Network(), nd.Name(), o)
	b.base = nd
	if nd.Inbox() == nil {
		b.baseErr = fmt.Errorf("wgtest: sim bind on node %q: the node has a Handler, not an inbox", nd.Name())
		return b
	}
	b.inbox = true
	b.ports[nd.Addr().Port()] = &simPort{node: nd, in: nd.Inbox()} // +checklocksignore: b is not shared yet
	return b
}

func newSimBind(n *transporttest.Network, name string, o SimBindOptions) *SimBind {
	if o.BatchSize <= 0 {
		o.BatchSize = conn.IdealBatchSize
	}
	if o.Queue <= 0 {
		o.Queue = 4096
	}
	return &SimBind{
		net:   n,
		name:  name,
		batch: o.BatchSize,
		queue: o.Queue,
		ports: make(map[uint16]*simPort),
		eps:   make(map[netip.AddrPort]*SimEndpoint),
	}
}

// handler feeds packets arriving at p's node to p's open session. It runs
// on the network's delivery path and never blocks.
func (b *SimBind) handler(p *simPort) func(transporttest.Packet) {
	return func(pkt transporttest.Packet) {
		s := p.sess.Load()
		if s == nil {
			b.stats.droppedClosed.Add(1)
			return
		}
		select {
		case s.q <- pkt:
		default:
			b.stats.droppedQueueFull.Add(1)
		}
	}
}

// Node returns the node attached at construction (nil if that failed).
func (b *SimBind) Node() *transporttest.Node { return b.base }

// Addr returns the address of the node attached at construction: the
// Endpoint other peers use to reach this one.
func (b *SimBind) Addr() netip.AddrPort {
	if b.base == nil {
		return netip.AddrPort{}
	}
	return b.base.Addr()
}

// Stats returns the bind's counters.
func (b *SimBind) Stats() SimBindStats {
	return SimBindStats{
		Sent:             b.stats.sent.Load(),
		Received:         b.stats.received.Load(),
		DroppedClosed:    b.stats.droppedClosed.Load(),
		DroppedQueueFull: b.stats.droppedQueueFull.Load(),
		DroppedTooBig:    b.stats.droppedTooBig.Load(),
	}
}

// Open implements conn.Bind: it listens on port (0 means the node's own
// port) and returns one receive function.
func (b *SimBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	if b.baseErr != nil {
		return nil, 0, b.baseErr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open.Load() != nil {
		return nil, 0, conn.ErrBindAlreadyOpen
	}
	if port == 0 {
		port = b.base.Addr().Port()
	}
	p := b.ports[port]
	if p == nil {
		p = &simPort{own: true}
		addr := netip.AddrPortFrom(b.base.Addr().Addr(), port)
		nd, err := b.net.AddNode(b.name, transporttest.NodeOptions{Addr: addr, Handler: b.handler(p)})
		if err != nil {
			return nil, 0, fmt.Errorf("wgtest: sim bind %q: listen on %v: %w", b.name, addr, err)
		}
		p.node = nd
		b.ports[port] = p
	}
	s := &simSession{done: make(chan struct{})}
	in := p.in
	if p.own {
		s.q = make(chan transporttest.Packet, b.queue)
		in = s.q
	} else {
		// A reused inbox holds what arrived while closed: a closed socket
		// would have dropped it.
		for drained := false; !drained; {
			select {
			case <-p.in:
				b.stats.droppedClosed.Add(1)
			default:
				drained = true
			}
		}
	}
	p.sess.Store(s)
	b.open.Store(p)
	return []conn.ReceiveFunc{b.receiveFunc(in, s.done)}, port, nil
}

func (b *SimBind) receiveFunc(in <-chan transporttest.Packet, done <-chan struct{}) conn.ReceiveFunc {
	return func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		for {
			var pkt transporttest.Packet
			select {
			case pkt = <-in:
			case <-done:
				return 0, net.ErrClosed
			}
			n := 0
			b.epMu.Lock()
			for more := true; more; {
				if len(pkt.Data) > len(bufs[n]) {
					b.stats.droppedTooBig.Add(1)
				} else {
					sizes[n] = copy(bufs[n], pkt.Data)
					eps[n] = b.endpointLocked(pkt.From)
					n++
				}
				if n == len(bufs) {
					break
				}
				select {
				case pkt = <-in:
				default:
					more = false
				}
			}
			b.epMu.Unlock()
			if n > 0 {
				b.stats.received.Add(uint64(n))
				return n, nil
			}
			// Everything was too big: wait for more.
		}
	}
}

// endpointLocked returns the one SimEndpoint of a, so that receiving does
// not allocate.
//
// +checklocks:b.epMu
func (b *SimBind) endpointLocked(a netip.AddrPort) *SimEndpoint {
	e := b.eps[a]
	if e == nil {
		e = &SimEndpoint{AddrPort: a}
		b.eps[a] = e
	}
	return e
}

// Close implements conn.Bind. It is idempotent; the node stays attached, so
// the bind can be opened again.
func (b *SimBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.open.Swap(nil)
	if p == nil {
		return nil
	}
	s := p.sess.Swap(nil)
	close(s.done)
	return nil
}

// SetMark implements conn.Bind; marks mean nothing on the simulated network.
func (b *SimBind) SetMark(uint32) error { return nil }

// Send implements conn.Bind: each packet is sent, copied, to the endpoint
// through the network, which applies the link's impairments. It fails with
// net.ErrClosed when the bind is closed and conn.ErrWrongEndpointType for
// an endpoint that is not a *SimEndpoint.
func (b *SimBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	e, ok := ep.(*SimEndpoint)
	if !ok {
		return conn.ErrWrongEndpointType
	}
	p := b.open.Load()
	if p == nil {
		return net.ErrClosed
	}
	for _, buf := range bufs {
		if err := p.node.Send(e.AddrPort, buf); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return net.ErrClosed
			}
			return err
		}
	}
	b.stats.sent.Add(uint64(len(bufs)))
	return nil
}

// ParseEndpoint implements conn.Bind: s is "ip:port".
func (b *SimBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	a, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadEndpoint, s, err)
	}
	b.epMu.Lock()
	defer b.epMu.Unlock()
	return b.endpointLocked(a), nil
}

// BatchSize implements conn.Bind.
func (b *SimBind) BatchSize() int { return b.batch }

// SimEndpoint is a node's address on a simulated network, the
// conn.Endpoint of a SimBind.
type SimEndpoint struct {
	netip.AddrPort
}

// ClearSrc implements conn.Endpoint; there is no source to clear.
func (*SimEndpoint) ClearSrc() {}

// SrcToString implements conn.Endpoint; it is empty.
func (*SimEndpoint) SrcToString() string { return "" }

// DstToString implements conn.Endpoint: "ip:port".
func (e *SimEndpoint) DstToString() string { return e.AddrPort.String() }

// DstToBytes implements conn.Endpoint (used for cookie MACs).
func (e *SimEndpoint) DstToBytes() []byte {
	b, _ := e.AddrPort.MarshalBinary()
	return b
}

// DstIP implements conn.Endpoint.
func (e *SimEndpoint) DstIP() netip.Addr { return e.AddrPort.Addr() }

// SrcIP implements conn.Endpoint; it is the zero Addr.
func (*SimEndpoint) SrcIP() netip.Addr { return netip.Addr{} }

// DstAddrPort returns the destination, as conn.StdNetEndpoint's AddrPort
// does; binds that wrap another (wg.UDPBind's impairments) read it.
func (e *SimEndpoint) DstAddrPort() netip.AddrPort { return e.AddrPort }
