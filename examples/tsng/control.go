package tsng

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/vip"
)

// DefaultControlPort is the TCP port of the control channel on each node's
// overlay address.
const DefaultControlPort = 51830

// ControlNet is what the control channel needs from the node's stack on the
// overlay: a kernel stack bound to the overlay address, or a netstack host.
type ControlNet interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
	Listen(addr netip.AddrPort) (net.Listener, error)
}

// ControlOptions configures a Control channel.
type ControlOptions struct {
	Net  ControlNet
	Self netip.Addr // this node's overlay address
	Port uint16     // 0 means DefaultControlPort
	// Key is this member's identity key (its vip.NodeID is the public
	// key). The channel proves it to peers in the key handshake, and
	// requires it.
	Key ed25519.PrivateKey
	// Auth is what the channel requires of a connection
	// (ControlAuthPreferred: the key handshake wherever the peer speaks
	// it).
	Auth ControlAuth
	// Peer maps an overlay address to the member that owns it. The
	// handshake then proves that member's key; a legacy connection (where
	// Auth allows one) is taken on the source address alone. Connections
	// from other addresses are closed at once.
	Peer func(netip.Addr) (vip.NodeID, bool)
	// Addr maps a member to its overlay address.
	Addr func(vip.NodeID) (netip.Addr, bool)
	// Handle receives every frame of an admitted connection, with the
	// member it is from.
	Handle func(ctx context.Context, from vip.NodeID, frame []byte) error
	// MaxFrame bounds a frame in bytes (the control frame limit), at most
	// 16 MiB − 1; larger frames are refused on send and close the
	// connection on receive.
	MaxFrame int
	// Queue is the per-peer send queue in frames (64); a full queue drops
	// the frame: the periodic rotation repairs it.
	Queue int
	// ConnsPerPeer bounds the connections one member keeps open to this
	// node (DefaultControlConnsPerPeer); a new one beyond it replaces the
	// member's oldest, which is closed and counted as refused. Only
	// connections past the handshake count against it.
	ConnsPerPeer int
	// HandshakesPerPeer bounds a member's inbound connections still in the
	// handshake (DefaultControlHandshakesPerPeer); a new one beyond it
	// replaces the member's oldest, which is closed and counted as refused.
	HandshakesPerPeer int
	// HandshakeTimeout bounds the handshake of a new connection, in both
	// directions, and the arrival of a legacy connection's first length
	// (DefaultControlHandshakeTimeout).
	HandshakeTimeout time.Duration
	// FrameTimeout bounds how long a frame's bytes may take to arrive once
	// its length is read (DefaultControlFrameTimeout); IdleTimeout bounds
	// the wait for the next frame (DefaultControlIdleTimeout). Senders
	// close their idle connections sooner, at half of it.
	FrameTimeout, IdleTimeout time.Duration
	Logger                    *slog.Logger
}

// The control channel's defaults.
const (
	DefaultControlConnsPerPeer      = 4
	DefaultControlHandshakesPerPeer = 4
	DefaultControlHandshakeTimeout  = 10 * time.Second
	DefaultControlFrameTimeout      = 30 * time.Second
	DefaultControlIdleTimeout       = 5 * time.Minute
)

// ControlStats counts the control channel's traffic.
type ControlStats struct {
	Sent, Received, Dropped, Refused uint64
	// Authenticated counts the connections, in and out, that passed the
	// key handshake; Legacy those taken or opened without it.
	Authenticated, Legacy uint64
	// AuthRefused counts the connections, in and out, refused for want of
	// key authentication: a failed, malformed or late handshake, a
	// handshake over the per-member limit, and a connection without it
	// where it is required or from or to a pinned member. Refused counts
	// them too.
	AuthRefused uint64
}

// Control is the control channel between members over the overlay: one TCP
// connection per peer and direction, opened by a key handshake in which
// both ends prove their identity key (controlauth.go), then frames as a
// 4-byte big-endian length and the bytes. It implements vip.Carrier.
type Control struct {
	o    ControlOptions
	self vip.NodeID // Key's public key
	ctx  context.Context
	ln   net.Listener

	// mu guards the peer connections, the inbound and pending ones, the
	// pins, the stats and closed.
	mu syncx.Mutex
	// +checklocks:mu
	peers map[vip.NodeID]*peerConn
	// inbound are the connections past the handshake, oldest first.
	// +checklocks:mu
	inbound map[vip.NodeID][]inConn
	// pending are the inbound connections in the handshake, oldest first.
	// +checklocks:mu
	pending map[vip.NodeID][]net.Conn
	// pinned are the members that authenticated by key since the start
	// (or since they last joined); only members are added, and ForgetPeer
	// drops a member that left, so the member list bounds it, as it bounds
	// peers, inbound and pending.
	// +checklocks:mu
	pinned map[vip.NodeID]bool
	// +checklocks:mu
	stats ControlStats
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

var _ vip.Carrier = (*Control)(nil)

type peerConn struct {
	q chan []byte
	// ctx ends the sender: at Close, or when ForgetPeer drops the peer.
	ctx    context.Context
	cancel context.CancelFunc
}

// errNotMember refuses a frame for a node that is no member.
var errNotMember = errors.New("tsng: control frame for a node that is no member")

// inConn is an inbound connection past the handshake.
type inConn struct {
	conn   net.Conn
	authed bool // by key; else legacy
}

// ErrFrameTooLarge reports a frame over the control frame limit.
var ErrFrameTooLarge = errors.New("tsng: control frame over the limit")

// NewControl starts listening on Self:Port.
func NewControl(ctx context.Context, o ControlOptions) (*Control, error) {
	if o.Port == 0 {
		o.Port = DefaultControlPort
	}
	if o.Queue <= 0 {
		o.Queue = 64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ConnsPerPeer <= 0 {
		o.ConnsPerPeer = DefaultControlConnsPerPeer
	}
	if o.FrameTimeout <= 0 {
		o.FrameTimeout = DefaultControlFrameTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultControlIdleTimeout
	}
	if o.HandshakesPerPeer <= 0 {
		o.HandshakesPerPeer = DefaultControlHandshakesPerPeer
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultControlHandshakeTimeout
	}
	if o.MaxFrame <= 0 {
		return nil, errors.New("tsng: ControlOptions.MaxFrame is required")
	}
	if o.MaxFrame > maxControlFrame {
		return nil, fmt.Errorf("tsng: ControlOptions.MaxFrame %d is over the limit of %d bytes (a length's first byte must be 0)", o.MaxFrame, maxControlFrame)
	}
	if o.Auth > controlAuthOff {
		return nil, fmt.Errorf("tsng: ControlOptions.Auth %v is not a setting", o.Auth)
	}
	var self vip.NodeID
	if o.Auth != controlAuthOff {
		if len(o.Key) != ed25519.PrivateKeySize {
			return nil, errors.New("tsng: ControlOptions.Key (the member's Ed25519 identity key) is required")
		}
		copy(self[:], o.Key.Public().(ed25519.PublicKey))
	}
	ln, err := o.Net.Listen(netip.AddrPortFrom(o.Self, o.Port))
	if err != nil {
		return nil, fmt.Errorf("tsng: control channel: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Control{o: o, self: self, ctx: ctx, ln: ln, peers: map[vip.NodeID]*peerConn{}, inbound: map[vip.NodeID][]inConn{},
		pending: map[vip.NodeID][]net.Conn{}, pinned: map[vip.NodeID]bool{}, cancel: cancel}
	c.wg.Add(1)
	go c.accept()
	return c, nil
}

// Stats returns the counters.
func (c *Control) Stats() ControlStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Send queues frame for peer to; it never blocks.
func (c *Control) Send(_ context.Context, to vip.NodeID, frame []byte) error {
	if len(frame) > c.o.MaxFrame {
		c.count(func(s *ControlStats) { s.Refused++ })
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(frame), c.o.MaxFrame)
	}
	if _, ok := c.o.Addr(to); !ok {
		// A member that left: no sender is made for it, so the senders
		// stay bounded by the member list.
		c.count(func(s *ControlStats) { s.Dropped++ })
		return fmt.Errorf("%w: %s", errNotMember, to.String()[:12])
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return net.ErrClosed
	}
	p := c.peers[to]
	if p == nil {
		pctx, cancel := context.WithCancel(c.ctx)
		p = &peerConn{q: make(chan []byte, c.o.Queue), ctx: pctx, cancel: cancel}
		c.peers[to] = p
		c.wg.Add(1)
		go c.sender(to, p)
	}
	c.mu.Unlock()
	select {
	case p.q <- frame:
		return nil
	default:
		c.count(func(s *ControlStats) { s.Dropped++ })
		return nil
	}
}

func (c *Control) count(f func(*ControlStats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}

// sender keeps a connection to one peer and writes its queue; on an error
// it drops the connection and redials on the next frame. It closes the
// connection after half the idle timeout without frames, before the
// receiver's own idle deadline would.
//
// It opens each connection with the key handshake. Under
// ControlAuthPreferred, a peer that closes the connection on the hello
// without a byte runs an agent without the handshake: the sender falls
// back to legacy frames for it (and remembers so) unless the peer is
// pinned. A legacy connection to a peer that becomes pinned is closed
// before its next frame.
func (c *Control) sender(to vip.NodeID, p *peerConn) {
	defer c.wg.Done()
	var conn net.Conn
	var w *bufio.Writer
	legacy := false   // conn carries legacy frames
	fellBack := false // the peer closed a hello: it has no handshake
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	idle := time.NewTimer(c.o.IdleTimeout / 2)
	defer idle.Stop()
	for {
		var frame []byte
		select {
		case <-p.ctx.Done():
			return
		case <-idle.C:
			if conn != nil {
				conn.Close()
				conn = nil
			}
			continue
		case frame = <-p.q:
		}
		idle.Reset(c.o.IdleTimeout / 2)
		if conn != nil && legacy && c.o.Auth != controlAuthOff && c.isPinned(to) {
			c.o.Logger.Info("control peer authenticated by key; closing the legacy connection to it", "peer", to.String()[:12])
			conn.Close()
			conn = nil
		}
		if conn == nil {
			conn, legacy, fellBack = c.connect(p.ctx, to, fellBack)
			if conn == nil {
				c.count(func(s *ControlStats) { s.Dropped++ })
				continue
			}
			w = bufio.NewWriter(conn)
		}
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(frame)))
		w.Write(hdr[:])
		w.Write(frame)
		// Flush when the queue is drained, so bursts share segments.
		if len(p.q) == 0 {
			if err := w.Flush(); err != nil {
				conn.Close()
				conn = nil
				c.count(func(s *ControlStats) { s.Dropped++ })
				continue
			}
		}
		c.count(func(s *ControlStats) { s.Sent++ })
	}
}

// connect dials member to and opens the connection: with the key
// handshake, or legacy when the channel is off, or when fellBack says the
// peer has no handshake and Auth allows legacy frames to it. It returns
// nil when there is no connection (the caller counts the frame dropped),
// and whether the connection is legacy and the peer has no handshake.
func (c *Control) connect(ctx context.Context, to vip.NodeID, fellBack bool) (conn net.Conn, legacy, noAuth bool) {
	addr, ok := c.o.Addr(to)
	if !ok {
		return nil, false, fellBack
	}
	dial := func() net.Conn {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := c.o.Net.DialContext(dctx, "tcp", netip.AddrPortFrom(addr, c.o.Port).String())
		if err != nil {
			c.o.Logger.Debug("control dial failed", "peer", to.String()[:12], "err", err)
			return nil
		}
		return conn
	}
	legacyOK := func() bool { return c.o.Auth == ControlAuthPreferred && !c.isPinned(to) }
	if c.o.Auth == controlAuthOff {
		return dial(), true, fellBack
	}
	if fellBack && legacyOK() {
		if conn = dial(); conn != nil {
			c.count(func(s *ControlStats) { s.Legacy++ })
		}
		return conn, true, fellBack
	}
	if conn = dial(); conn == nil {
		return nil, false, fellBack
	}
	hs := conn
	stop := context.AfterFunc(ctx, func() { hs.Close() })
	err := c.authDial(hs, to)
	if !stop() {
		return nil, false, fellBack // closing
	}
	if err == nil {
		c.pin(to)
		return conn, false, false
	}
	conn.Close()
	if errors.Is(err, errAuthNoReply) && legacyOK() {
		c.o.Logger.Info("control peer has no key authentication; sending it legacy frames until it authenticates", "peer", to.String()[:12])
		if conn = dial(); conn != nil {
			c.count(func(s *ControlStats) { s.Legacy++ })
		}
		return conn, true, true
	}
	c.count(func(s *ControlStats) { s.Refused++; s.AuthRefused++ })
	c.o.Logger.Warn("control connection to a peer refused: key handshake failed", "peer", to.String()[:12], "auth", c.o.Auth.String(), "pinned", c.isPinned(to), "err", err)
	return nil, false, fellBack
}

// isPinned reports whether member id authenticated by key since the start.
func (c *Control) isPinned(id vip.NodeID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pinned[id]
}

// pin counts an authenticated outbound connection to member id and pins
// it, unless id left the member list meanwhile.
func (c *Control) pin(id vip.NodeID) {
	if _, ok := c.o.Addr(id); !ok {
		return
	}
	c.mu.Lock()
	c.stats.Authenticated++
	drop := c.pinLocked(id)
	c.mu.Unlock()
	c.dropLegacy(id, drop)
}

// pinLocked pins member id and takes its legacy inbound connections out
// of inbound, counted as refused; the caller closes them (dropLegacy)
// after unlocking.
//
// +checklocks:c.mu
func (c *Control) pinLocked(id vip.NodeID) []net.Conn {
	if c.pinned[id] {
		return nil
	}
	c.pinned[id] = true
	var drop []net.Conn
	keep := c.inbound[id][:0]
	for _, x := range c.inbound[id] {
		if x.authed {
			keep = append(keep, x)
		} else {
			drop = append(drop, x.conn)
			c.stats.Refused++
			c.stats.AuthRefused++
		}
	}
	if len(keep) == 0 {
		delete(c.inbound, id)
	} else {
		c.inbound[id] = keep
	}
	return drop
}

func (c *Control) dropLegacy(id vip.NodeID, drop []net.Conn) {
	if len(drop) > 0 {
		c.o.Logger.Info("control peer authenticated by key; closing its legacy connections", "peer", id.String()[:12], "closed", len(drop))
	}
	for _, x := range drop {
		x.Close()
	}
}

// member returns the member that conn comes from. A connection whose
// endpoint has closed has no remote address and is no member's.
func (c *Control) member(conn net.Conn) (vip.NodeID, bool) {
	ap, err := tcpAddrPort(conn.RemoteAddr())
	if err != nil {
		return vip.NodeID{}, false
	}
	return c.o.Peer(ap.Addr().Unmap())
}

// accept takes connections from members. With the handshake on, each
// waits in pending (bounded per member) until its handshake ends; only
// then does it count against the member's connection limit.
func (c *Control) accept() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return
		}
		from, ok := c.member(conn)
		if !ok {
			c.count(func(s *ControlStats) { s.Refused++ })
			conn.Close()
			continue
		}
		if c.o.Auth == controlAuthOff {
			if c.admit(conn, from, false, false) {
				c.wg.Add(1)
				go c.receive(conn, from)
			} else {
				conn.Close()
			}
			continue
		}
		c.mu.Lock()
		p := append(c.pending[from], conn)
		var evict net.Conn
		if len(p) > c.o.HandshakesPerPeer {
			evict, p = p[0], p[1:]
			c.stats.Refused++
			c.stats.AuthRefused++
		}
		c.pending[from] = p
		c.mu.Unlock()
		if evict != nil {
			c.o.Logger.Debug("control connections in the handshake over the per-peer limit; closing the oldest", "peer", from.String()[:12], "limit", c.o.HandshakesPerPeer)
			evict.Close()
		}
		c.wg.Add(1)
		go c.serve(conn, from)
	}
}

// unpendLocked drops conn from its member's pending connections and
// reports whether it was there (not evicted).
//
// +checklocks:c.mu
func (c *Control) unpendLocked(from vip.NodeID, conn net.Conn) bool {
	p := c.pending[from]
	for i, x := range p {
		if x == conn {
			p = append(p[:i:i], p[i+1:]...)
			if len(p) == 0 {
				delete(c.pending, from)
			} else {
				c.pending[from] = p
			}
			return true
		}
	}
	return false
}

// admit moves an inbound connection past its handshake into inbound,
// closing the member's oldest beyond the limit. It refuses (counted and
// logged) a legacy connection where the handshake is required or the
// member is pinned, and returns false for a connection it did not admit,
// which the caller closes.
func (c *Control) admit(conn net.Conn, from vip.NodeID, authed, pended bool) bool {
	// A member that left during the handshake is admitted no more (ForgetPeer
	// may have run before this connection was pending): its address must
	// still name it.
	id, member := c.member(conn)
	member = member && id == from
	c.mu.Lock()
	if !member {
		if pended {
			c.unpendLocked(from, conn)
		}
		c.stats.Refused++
		c.mu.Unlock()
		return false
	}
	if (pended && !c.unpendLocked(from, conn)) || c.closed {
		c.mu.Unlock()
		return false
	}
	if !authed && c.o.Auth != controlAuthOff && (c.o.Auth == ControlAuthRequired || c.pinned[from]) {
		c.stats.Refused++
		c.stats.AuthRefused++
		pinned := c.pinned[from]
		c.mu.Unlock()
		c.o.Logger.Warn("control connection without key authentication refused", "peer", from.String()[:12], "auth", c.o.Auth.String(), "pinned", pinned)
		return false
	}
	var legacy []net.Conn
	if authed {
		c.stats.Authenticated++
		legacy = c.pinLocked(from)
	} else if c.o.Auth != controlAuthOff {
		c.stats.Legacy++
	}
	in := append(c.inbound[from], inConn{conn: conn, authed: authed})
	var evict net.Conn
	if len(in) > c.o.ConnsPerPeer {
		evict, in = in[0].conn, in[1:]
		c.stats.Refused++
	}
	c.inbound[from] = in
	c.mu.Unlock()
	c.dropLegacy(from, legacy)
	if evict != nil {
		c.o.Logger.Debug("control connections over the per-peer limit; closing the oldest", "peer", from.String()[:12], "limit", c.o.ConnsPerPeer)
		evict.Close()
	}
	return true
}

// refuseAuth counts and logs an inbound connection whose handshake
// failed, unless it was evicted from pending (counted then) or the
// channel is closing.
func (c *Control) refuseAuth(from vip.NodeID, conn net.Conn, err error) {
	c.mu.Lock()
	counted := c.unpendLocked(from, conn) && !c.closed
	if counted {
		c.stats.Refused++
		c.stats.AuthRefused++
	}
	c.mu.Unlock()
	if counted {
		c.o.Logger.Warn("control connection refused: key handshake failed", "peer", from.String()[:12], "auth", c.o.Auth.String(), "err", err)
	}
}

// forget drops conn from its member's inbound connections.
func (c *Control) forget(from vip.NodeID, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := c.inbound[from]
	for i, x := range in {
		if x.conn == conn {
			in = append(in[:i:i], in[i+1:]...)
			break
		}
	}
	if len(in) == 0 {
		delete(c.inbound, from)
	} else {
		c.inbound[from] = in
	}
}

// serve runs one inbound connection: its first 4 bytes, within the
// handshake timeout, are the hello's magic (the key handshake follows) or
// a legacy frame's length; then its frames.
func (c *Control) serve(conn net.Conn, from vip.NodeID) {
	defer c.wg.Done()
	defer conn.Close()
	stop := context.AfterFunc(c.ctx, func() { conn.Close() })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(c.o.HandshakeTimeout))
	var hdr [4]byte
	err := readAuth(conn, hdr[:])
	authed := err == nil && string(hdr[:]) == authMagic
	if authed {
		err = c.authAccept(conn, hdr, from)
	}
	if err != nil {
		c.refuseAuth(from, conn, err)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	if !c.admit(conn, from, authed, true) {
		return
	}
	defer c.forget(from, conn)
	var first *[4]byte
	if !authed {
		first = &hdr
	}
	c.frames(conn, from, first)
}

// receive reads frames from one legacy inbound connection (the channel
// off).
func (c *Control) receive(conn net.Conn, from vip.NodeID) {
	defer c.wg.Done()
	defer c.forget(from, conn)
	defer conn.Close()
	stop := context.AfterFunc(c.ctx, func() { conn.Close() })
	defer stop()
	c.frames(conn, from, nil)
}

// frames reads frames from one inbound connection, the first length
// already read when first is not nil. The wait for a frame is bounded by
// the idle timeout and its bytes by the frame timeout; the frame's buffer
// grows as its bytes arrive, so an announced length costs nothing until
// it is sent.
func (c *Control) frames(conn net.Conn, from vip.NodeID, first *[4]byte) {
	r := bufio.NewReaderSize(conn, 512)
	var hdr [4]byte
	for {
		if first != nil {
			hdr, first = *first, nil
		} else {
			_ = conn.SetReadDeadline(time.Now().Add(c.o.IdleTimeout))
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if int64(n) > int64(c.o.MaxFrame) {
			c.count(func(s *ControlStats) { s.Refused++ })
			c.o.Logger.Warn("control frame over the limit; closing", "peer", from.String()[:12], "bytes", n, "limit", c.o.MaxFrame)
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(c.o.FrameTimeout))
		frame, err := io.ReadAll(io.LimitReader(r, int64(n)))
		if len(frame) < int(n) {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.count(func(s *ControlStats) { s.Refused++ })
				c.o.Logger.Warn("control frame not complete within the frame timeout; closing", "peer", from.String()[:12], "bytes", len(frame), "of", n, "timeout", c.o.FrameTimeout)
			}
			return
		}
		c.count(func(s *ControlStats) { s.Received++ })
		if err := c.o.Handle(c.ctx, from, frame); err != nil {
			c.o.Logger.Debug("control frame refused", "peer", from.String()[:12], "err", err)
		}
	}
}

// ForgetPeer drops everything the channel keeps for member id, once id
// has left the member list (Peer and Addr no longer know it) or its
// address or WireGuard key changed: its sender and queued frames, its
// connections in both directions and those in the handshake, and its pin.
// A frame for id after it rejoined starts afresh (a new handshake, which
// pins it again). The connections are closed after the lock is released;
// the goroutines that served them end on their own.
func (c *Control) ForgetPeer(id vip.NodeID) {
	c.mu.Lock()
	p := c.peers[id]
	delete(c.peers, id)
	delete(c.pinned, id)
	var conns []net.Conn
	for _, x := range c.inbound[id] {
		conns = append(conns, x.conn)
	}
	conns = append(conns, c.pending[id]...)
	delete(c.inbound, id)
	delete(c.pending, id)
	c.mu.Unlock()
	if p != nil {
		p.cancel() // the sender closes its connection as it returns
	}
	for _, conn := range conns {
		conn.Close()
	}
}

// peerState reports how many members the channel keeps state for: senders,
// pins, members with inbound connections and with connections in the
// handshake.
func (c *Control) peerState() (senders, pinned, inbound, pending int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.peers), len(c.pinned), len(c.inbound), len(c.pending)
}

// Close stops the channel and waits for its goroutines.
func (c *Control) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	err := c.ln.Close()
	c.wg.Wait()
	return err
}
