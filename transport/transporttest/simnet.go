package transporttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Network is a simulated datagram network of nodes joined by one-way links.
// Each link has latency, jitter, loss, duplication, reordering and can be cut
// (partitioned); all of it can change at run time. Delays are scheduled on a
// transport.Clock and random choices come from one seeded generator:
//
//   - on a ManualClock the network is deterministic: the same seed and the
//     same sends in the same order give the same trace, so our own state
//     machines (probes, claims, replication) can be replayed from a seed;
//   - on transport.RealClock it impairs real traffic in real time, for
//     wireguard-go and gVisor, which keep their own timers. Runs over them
//     assert outcomes, not traces.
//
// A packet's fate (loss, delay, duplicate) is decided when it is sent; a link
// cut while a packet is in flight does not stop that packet, as on a real
// wire. Packets are copied on Send.
//
// Network is safe for concurrent use.
type Network struct {
	clock transport.Clock

	// mu guards every field below: the nodes, the links' configuration,
	// state and statistics, the packets in flight and the RNG that decides
	// their fates.
	mu syncx.Mutex
	// +checklocks:mu
	rng *rand.Rand
	// +checklocks:mu
	nodes map[netip.AddrPort]*Node
	// order holds the nodes in the order they were added.
	// +checklocks:mu
	order []*Node
	// def is the configuration of a link that has none of its own.
	// +checklocks:mu
	def LinkConfig
	// +checklocks:mu
	links map[linkKey]LinkConfig
	// +checklocks:mu
	down map[linkKey]bool
	// +checklocks:mu
	stats map[linkKey]*LinkStats
	// +checklocks:mu
	total LinkStats
	// +checklocks:mu
	trace func(TraceEvent)
	// +checklocks:mu
	inflight map[*flight]struct{}
	// +checklocks:mu
	closed bool
}

// LinkConfig is the impairment of one direction of a link. The zero value is
// a perfect link: no delay, no loss.
type LinkConfig struct {
	Latency time.Duration // one-way delay
	Jitter  time.Duration // delay varies uniformly in [Latency-Jitter, Latency+Jitter]
	Loss    float64       // probability in [0,1] that a packet is dropped
	// Duplicate is the probability in [0,1] that a delivered packet is
	// delivered twice, the copy with its own delay.
	Duplicate float64
	// Reorder is the probability in [0,1] that a packet is held back by an
	// extra ReorderDelay, so later packets overtake it.
	Reorder      float64
	ReorderDelay time.Duration // 0 means Latency, or 1 ms when Latency is 0
}

// Validate reports a configuration outside its ranges.
func (c LinkConfig) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"loss", c.Loss}, {"duplicate", c.Duplicate}, {"reorder", c.Reorder}} {
		if p.v < 0 || p.v > 1 || p.v != p.v {
			return fmt.Errorf("transporttest: link %s %v outside [0,1]", p.name, p.v)
		}
	}
	if c.Latency < 0 || c.Jitter < 0 || c.ReorderDelay < 0 {
		return errors.New("transporttest: negative link delay")
	}
	return nil
}

// DropReason says why the network dropped a packet.
type DropReason uint8

// Drop reasons.
const (
	DropNone      DropReason = iota
	DropLoss                 // random loss on the link
	DropPartition            // the link was cut when the packet was sent
	DropNoRoute              // no node has the destination address
	DropQueueFull            // the receiver's inbox was full
	DropClosed               // the receiver or the network was closed
	numDropReasons
)

func (r DropReason) String() string {
	switch r {
	case DropNone:
		return "none"
	case DropLoss:
		return "loss"
	case DropPartition:
		return "partition"
	case DropNoRoute:
		return "no-route"
	case DropQueueFull:
		return "queue-full"
	case DropClosed:
		return "closed"
	}
	return fmt.Sprintf("drop(%d)", uint8(r))
}

// LinkStats counts what one link, or the whole network, did.
type LinkStats struct {
	Sent           uint64 // packets handed to Send
	Delivered      uint64 // packets handed to a receiver (duplicates included)
	DeliveredBytes uint64
	Duplicated     uint64 // extra copies made
	Reordered      uint64 // packets held back by ReorderDelay
	Dropped        [numDropReasons]uint64
}

// TotalDropped sums the drops of every reason.
func (s LinkStats) TotalDropped() uint64 {
	var n uint64
	for _, d := range s.Dropped {
		n += d
	}
	return n
}

// TraceKind tells what a TraceEvent records.
type TraceKind uint8

// Trace event kinds.
const (
	TraceSend TraceKind = iota
	TraceDeliver
	TraceDrop
)

// TraceEvent is one step of a packet through the network.
type TraceEvent struct {
	At       time.Time
	Kind     TraceKind
	From, To netip.AddrPort
	Len      int
	Reason   DropReason // for TraceDrop
}

// Packet is a datagram delivered to a node. Data belongs to the receiver.
type Packet struct {
	From, To netip.AddrPort
	Data     []byte
}

// Node is an endpoint attached to a Network at one address.
type Node struct {
	n       *Network
	name    string
	addr    netip.AddrPort
	handler func(Packet)
	inbox   chan Packet
	done    chan struct{}
	once    sync.Once
}

type linkKey struct{ from, to netip.AddrPort }

type flight struct {
	t transport.Timer
}

// NewNetwork returns an empty network that schedules on clock (nil means the
// real clock) and draws its random choices from seed.
func NewNetwork(clock transport.Clock, seed uint64) *Network {
	return &Network{
		clock:    transport.Or(clock),
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		nodes:    make(map[netip.AddrPort]*Node),
		links:    make(map[linkKey]LinkConfig),
		down:     make(map[linkKey]bool),
		stats:    make(map[linkKey]*LinkStats),
		inflight: make(map[*flight]struct{}),
	}
}

// NodeOptions tunes AddNode.
type NodeOptions struct {
	// Addr is the node's address; the zero value picks 198.18.0.N:51820, N
	// counting from 1 (RFC 2544 benchmarking space, never routed: the network
	// is simulated and these addresses never reach a socket).
	Addr netip.AddrPort
	// Handler, when set, receives every packet, called from the clock's
	// goroutine (a timer callback) or, for a zero-delay link on the real
	// clock, from the sender's goroutine. It must not block. Without a
	// Handler packets queue in the node's inbox for Recv.
	Handler func(Packet)
	// Inbox is the inbox's capacity in packets; 0 means 4096.
	Inbox int
}

// AddNode attaches a new node. It fails if the address is taken or the
// network is closed.
func (n *Network) AddNode(name string, o NodeOptions) (*Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, transport.ErrClosed
	}
	if !o.Addr.IsValid() {
		i := len(n.order) + 1
		o.Addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 51820)
	}
	if _, ok := n.nodes[o.Addr]; ok {
		return nil, fmt.Errorf("transporttest: address %v already attached", o.Addr)
	}
	if o.Inbox <= 0 {
		o.Inbox = 4096
	}
	nd := &Node{n: n, name: name, addr: o.Addr, handler: o.Handler, done: make(chan struct{})}
	if o.Handler == nil {
		nd.inbox = make(chan Packet, o.Inbox)
	}
	n.nodes[o.Addr] = nd
	n.order = append(n.order, nd)
	return nd, nil
}

// MustAddNode is AddNode for tests: it panics on error.
func (n *Network) MustAddNode(name string, o NodeOptions) *Node {
	nd, err := n.AddNode(name, o)
	if err != nil {
		panic(err)
	}
	return nd
}

// Nodes returns the attached nodes in the order they were added.
func (n *Network) Nodes() []*Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*Node(nil), n.order...)
}

// SetDefault sets the configuration of every link not set by SetLink.
func (n *Network) SetDefault(c LinkConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	n.mu.Lock()
	n.def = c
	n.mu.Unlock()
	return nil
}

// SetLink sets the one-way link from → to.
func (n *Network) SetLink(from, to *Node, c LinkConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	n.mu.Lock()
	n.links[linkKey{from.addr, to.addr}] = c
	n.mu.Unlock()
	return nil
}

// SetLinkBoth sets both directions between a and b.
func (n *Network) SetLinkBoth(a, b *Node, c LinkConfig) error {
	if err := n.SetLink(a, b, c); err != nil {
		return err
	}
	return n.SetLink(b, a, c)
}

// Link returns the configuration in force from → to.
func (n *Network) Link(from, to *Node) LinkConfig {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.linkLocked(linkKey{from.addr, to.addr})
}

// +checklocks:n.mu
func (n *Network) linkLocked(k linkKey) LinkConfig {
	if c, ok := n.links[k]; ok {
		return c
	}
	return n.def
}

// Cut partitions the one-way link from → to: packets sent on it are dropped
// until Heal or HealLink.
func (n *Network) Cut(from, to *Node) {
	n.mu.Lock()
	n.down[linkKey{from.addr, to.addr}] = true
	n.mu.Unlock()
}

// CutBoth cuts both directions between a and b.
func (n *Network) CutBoth(a, b *Node) { n.Cut(a, b); n.Cut(b, a) }

// Partition cuts every link between nodes of different groups, both ways.
// Links inside a group, and of nodes in no group, are left as they are.
func (n *Network) Partition(groups ...[]*Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					n.down[linkKey{a.addr, b.addr}] = true
				}
			}
		}
	}
}

// Isolate cuts every link to and from nd.
func (n *Network) Isolate(nd *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, o := range n.order {
		if o != nd {
			n.down[linkKey{nd.addr, o.addr}] = true
			n.down[linkKey{o.addr, nd.addr}] = true
		}
	}
}

// HealLink restores the one-way link from → to.
func (n *Network) HealLink(from, to *Node) {
	n.mu.Lock()
	delete(n.down, linkKey{from.addr, to.addr})
	n.mu.Unlock()
}

// Heal restores every cut link. Link configurations are kept.
func (n *Network) Heal() {
	n.mu.Lock()
	clear(n.down)
	n.mu.Unlock()
}

// IsCut reports whether from → to is cut.
func (n *Network) IsCut(from, to *Node) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down[linkKey{from.addr, to.addr}]
}

// SetTrace installs fn to observe every send, delivery and drop (nil
// removes it). fn runs with the network's lock held: it must not call the
// network.
func (n *Network) SetTrace(fn func(TraceEvent)) {
	n.mu.Lock()
	n.trace = fn
	n.mu.Unlock()
}

// Stats returns the totals over every link.
func (n *Network) Stats() LinkStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.total
}

// LinkStats returns the counters of the one-way link from → to.
func (n *Network) LinkStats(from, to *Node) LinkStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.stats[linkKey{from.addr, to.addr}]; s != nil {
		return *s
	}
	return LinkStats{}
}

// Close drops every packet in flight and detaches every node. Recv then
// returns ErrClosed.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	for f := range n.inflight {
		f.t.Stop()
	}
	clear(n.inflight)
	nodes := n.order
	n.mu.Unlock()
	for _, nd := range nodes {
		nd.Close()
	}
	return nil
}

// +checklocks:n.mu
func (n *Network) statsLocked(k linkKey) *LinkStats {
	s := n.stats[k]
	if s == nil {
		s = new(LinkStats)
		n.stats[k] = s
	}
	return s
}

// +checklocks:n.mu
func (n *Network) dropLocked(k linkKey, s *LinkStats, r DropReason, size int) {
	s.Dropped[r]++
	n.total.Dropped[r]++
	if n.trace != nil {
		n.trace(TraceEvent{At: n.clock.Now(), Kind: TraceDrop, From: k.from, To: k.to, Len: size, Reason: r})
	}
}

// delayLocked draws one packet's delay.
//
// +checklocks:n.mu
func (n *Network) delayLocked(c LinkConfig, s *LinkStats) time.Duration {
	d := c.Latency
	if c.Jitter > 0 {
		d += time.Duration((n.rng.Float64()*2 - 1) * float64(c.Jitter))
	}
	if c.Reorder > 0 && n.rng.Float64() < c.Reorder {
		extra := c.ReorderDelay
		if extra == 0 {
			extra = c.Latency
		}
		if extra == 0 {
			extra = time.Millisecond
		}
		d += extra
		s.Reordered++
		n.total.Reordered++
	}
	if d < 0 {
		d = 0
	}
	return d
}

// send is Node.Send's body.
func (n *Network) send(from *Node, to netip.AddrPort, data []byte) error {
	k := linkKey{from.addr, to}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return transport.ErrClosed
	}
	s := n.statsLocked(k)
	s.Sent++
	n.total.Sent++
	if n.trace != nil {
		n.trace(TraceEvent{At: n.clock.Now(), Kind: TraceSend, From: k.from, To: k.to, Len: len(data)})
	}
	dst := n.nodes[to]
	switch {
	case dst == nil:
		n.dropLocked(k, s, DropNoRoute, len(data))
		n.mu.Unlock()
		return nil
	case n.down[k]:
		n.dropLocked(k, s, DropPartition, len(data))
		n.mu.Unlock()
		return nil
	}
	c := n.linkLocked(k)
	if c.Loss > 0 && n.rng.Float64() < c.Loss {
		n.dropLocked(k, s, DropLoss, len(data))
		n.mu.Unlock()
		return nil
	}
	copies := 1
	if c.Duplicate > 0 && n.rng.Float64() < c.Duplicate {
		copies = 2
		s.Duplicated++
		n.total.Duplicated++
	}
	var now []Packet
	for i := 0; i < copies; i++ {
		p := Packet{From: from.addr, To: to, Data: append([]byte(nil), data...)}
		d := n.delayLocked(c, s)
		if d == 0 && !n.isManual() {
			now = append(now, p)
			continue
		}
		f := &flight{}
		n.inflight[f] = struct{}{}
		f.t = n.clock.AfterFunc(d, func() { n.arrive(f, dst, k, p) })
	}
	n.mu.Unlock()
	for _, p := range now {
		n.arrive(nil, dst, k, p)
	}
	return nil
}

func (n *Network) isManual() bool {
	_, ok := n.clock.(*ManualClock)
	return ok
}

func (n *Network) arrive(f *flight, dst *Node, k linkKey, p Packet) {
	n.mu.Lock()
	if f != nil {
		if _, ok := n.inflight[f]; !ok { // stopped by Close
			n.mu.Unlock()
			return
		}
		delete(n.inflight, f)
	}
	s := n.statsLocked(k)
	if n.closed || dst.isClosed() {
		n.dropLocked(k, s, DropClosed, len(p.Data))
		n.mu.Unlock()
		return
	}
	if dst.handler == nil {
		select {
		case dst.inbox <- p:
		default:
			n.dropLocked(k, s, DropQueueFull, len(p.Data))
			n.mu.Unlock()
			return
		}
	}
	s.Delivered++
	s.DeliveredBytes += uint64(len(p.Data))
	n.total.Delivered++
	n.total.DeliveredBytes += uint64(len(p.Data))
	if n.trace != nil {
		n.trace(TraceEvent{At: n.clock.Now(), Kind: TraceDeliver, From: k.from, To: k.to, Len: len(p.Data)})
	}
	h := dst.handler
	n.mu.Unlock()
	if h != nil {
		h(p)
	}
}

// Name returns the node's name.
func (nd *Node) Name() string { return nd.name }

// Addr returns the node's address on the network.
func (nd *Node) Addr() netip.AddrPort { return nd.addr }

// Network returns the network the node is attached to.
func (nd *Node) Network() *Network { return nd.n }

// Send sends a copy of data to the node at to. Loss, partitions and unknown
// destinations are not errors (they are counted); Send fails only when the
// node or the network is closed.
func (nd *Node) Send(to netip.AddrPort, data []byte) error {
	if nd.isClosed() {
		return transport.ErrClosed
	}
	return nd.n.send(nd, to, data)
}

// Recv returns the next packet from the node's inbox. It fails with
// ErrClosed once the node is closed, or with ctx's error. Recv is for nodes
// without a Handler.
func (nd *Node) Recv(ctx context.Context) (Packet, error) {
	if nd.inbox == nil {
		return Packet{}, errors.New("transporttest: node has a handler, not an inbox")
	}
	select {
	case p := <-nd.inbox:
		return p, nil
	case <-nd.done:
		return Packet{}, transport.ErrClosed
	case <-ctx.Done():
		return Packet{}, ctx.Err()
	}
}

// Inbox returns the channel Recv reads, for select loops; nil for a node with
// a Handler.
func (nd *Node) Inbox() <-chan Packet { return nd.inbox }

// Done is closed when the node is closed.
func (nd *Node) Done() <-chan struct{} { return nd.done }

// Close detaches the node: packets to it are dropped, and Recv and Send fail.
// The address stays taken.
func (nd *Node) Close() error {
	nd.once.Do(func() { close(nd.done) })
	return nil
}

func (nd *Node) isClosed() bool {
	select {
	case <-nd.done:
		return true
	default:
		return false
	}
}
