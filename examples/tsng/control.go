package tsng

import (
	"bufio"
	"context"
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
	// Peer maps an overlay address to the member that owns it; WireGuard's
	// cryptokey routing makes the source address of an overlay connection
	// the peer's authentication. Connections from other addresses are
	// closed at once.
	Peer func(netip.Addr) (vip.NodeID, bool)
	// Addr maps a member to its overlay address.
	Addr func(vip.NodeID) (netip.Addr, bool)
	// Handle receives every frame from an authenticated peer.
	Handle func(ctx context.Context, from vip.NodeID, frame []byte) error
	// MaxFrame bounds a frame in bytes (the control frame limit); larger
	// frames are refused on send and close the connection on receive.
	MaxFrame int
	// Queue is the per-peer send queue in frames (64); a full queue drops
	// the frame: the periodic rotation repairs it.
	Queue int
	// ConnsPerPeer bounds the connections one member keeps open to this
	// node (DefaultControlConnsPerPeer); a new one beyond it replaces the
	// member's oldest, which is closed and counted as refused.
	ConnsPerPeer int
	// FrameTimeout bounds how long a frame's bytes may take to arrive once
	// its length is read (DefaultControlFrameTimeout); IdleTimeout bounds
	// the wait for the next frame (DefaultControlIdleTimeout). Senders
	// close their idle connections sooner, at half of it.
	FrameTimeout, IdleTimeout time.Duration
	Logger                    *slog.Logger
}

// The control channel's defaults.
const (
	DefaultControlConnsPerPeer = 4
	DefaultControlFrameTimeout = 30 * time.Second
	DefaultControlIdleTimeout  = 5 * time.Minute
)

// ControlStats counts the control channel's traffic.
type ControlStats struct {
	Sent, Received, Dropped, Refused uint64
}

// Control is the control channel between members over the overlay: one TCP
// connection per peer and direction, frames as a 4-byte big-endian length
// and the bytes. It implements vip.Carrier.
type Control struct {
	o   ControlOptions
	ctx context.Context
	ln  net.Listener

	// mu guards the peer connections, the inbound ones, the stats and closed.
	mu syncx.Mutex
	// +checklocks:mu
	peers map[vip.NodeID]*peerConn
	// inbound is oldest first
	// +checklocks:mu
	inbound map[vip.NodeID][]net.Conn
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
	if o.MaxFrame <= 0 {
		return nil, errors.New("tsng: ControlOptions.MaxFrame is required")
	}
	ln, err := o.Net.Listen(netip.AddrPortFrom(o.Self, o.Port))
	if err != nil {
		return nil, fmt.Errorf("tsng: control channel: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Control{o: o, ctx: ctx, ln: ln, peers: map[vip.NodeID]*peerConn{}, inbound: map[vip.NodeID][]net.Conn{}, cancel: cancel}
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
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return net.ErrClosed
	}
	p := c.peers[to]
	if p == nil {
		p = &peerConn{q: make(chan []byte, c.o.Queue)}
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
func (c *Control) sender(to vip.NodeID, p *peerConn) {
	defer c.wg.Done()
	var conn net.Conn
	var w *bufio.Writer
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
		case <-c.ctx.Done():
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
		if conn == nil {
			addr, ok := c.o.Addr(to)
			if !ok {
				c.count(func(s *ControlStats) { s.Dropped++ })
				continue
			}
			dctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			var err error
			conn, err = c.o.Net.DialContext(dctx, "tcp", netip.AddrPortFrom(addr, c.o.Port).String())
			cancel()
			if err != nil {
				conn = nil
				c.count(func(s *ControlStats) { s.Dropped++ })
				c.o.Logger.Debug("control dial failed", "peer", to.String()[:12], "err", err)
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

func (c *Control) accept() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return
		}
		ap, err := netip.ParseAddrPort(conn.RemoteAddr().String())
		from, ok := vip.NodeID{}, false
		if err == nil {
			from, ok = c.o.Peer(ap.Addr().Unmap())
		}
		if !ok {
			c.count(func(s *ControlStats) { s.Refused++ })
			conn.Close()
			continue
		}
		c.mu.Lock()
		in := append(c.inbound[from], conn)
		var evict net.Conn
		if len(in) > c.o.ConnsPerPeer {
			evict, in = in[0], in[1:]
			c.stats.Refused++
		}
		c.inbound[from] = in
		c.mu.Unlock()
		if evict != nil {
			c.o.Logger.Debug("control connections over the per-peer limit; closing the oldest", "peer", from.String()[:12], "limit", c.o.ConnsPerPeer)
			evict.Close()
		}
		c.wg.Add(1)
		go c.receive(conn, from)
	}
}

// forget drops conn from its member's inbound connections.
func (c *Control) forget(from vip.NodeID, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := c.inbound[from]
	for i, x := range in {
		if x == conn {
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

// receive reads frames from one inbound connection. The wait for a frame
// is bounded by the idle timeout and its bytes by the frame timeout; the
// frame's buffer grows as its bytes arrive, so an announced length costs
// nothing until it is sent.
func (c *Control) receive(conn net.Conn, from vip.NodeID) {
	defer c.wg.Done()
	defer c.forget(from, conn)
	defer conn.Close()
	stop := context.AfterFunc(c.ctx, func() { conn.Close() })
	defer stop()
	r := bufio.NewReaderSize(conn, 512)
	var hdr [4]byte
	for {
		_ = conn.SetReadDeadline(time.Now().Add(c.o.IdleTimeout))
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
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
