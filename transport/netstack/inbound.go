package netstack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vipkit/vipkit/transport"
)

// DefaultMaxPendingTCP is Inbound.MaxPendingTCP's default.
const DefaultMaxPendingTCP = 64

// Inbound takes the TCP connection attempts and UDP datagrams that reach
// the host at a port where none of its sockets is, which the stack would
// otherwise answer with a TCP reset or an ICMP port unreachable. A TCP
// attempt is decided before the handshake, so a caller that relays it
// elsewhere can refuse it when its own destination refuses. Set it with
// SetInbound.
type Inbound struct {
	// Want decides, on the packet path (it must return promptly), whether
	// the host takes the attempt (a SYN) or datagram from remote to local;
	// false leaves it to the stack. proto is "tcp" or "udp". local is the
	// packet's destination: one of the host's addresses, or any address
	// with SetPromiscuous on. nil wants nothing.
	Want func(proto string, local, remote netip.AddrPort) bool
	// TCP gets each TCP attempt Want took, in a goroutine of its own,
	// before the handshake; it must call Accept or Refuse on it. nil
	// leaves every TCP attempt to the stack.
	TCP func(*InboundTCP)
	// MaxPendingTCP bounds the attempts handed to TCP and not yet
	// accepted or refused; SYNs beyond it are dropped (the sender
	// retransmits them) and counted in Stats.InboundPendingDropped. 0
	// means DefaultMaxPendingTCP.
	MaxPendingTCP int
	// UDP gets, on the packet path (it must not block), each new UDP flow
	// Want took: a UDPConn bound to the flow's local address and
	// connected to its remote one, whose first read returns the flow's
	// first datagram. Later datagrams of the flow reach the conn until it
	// is closed. nil leaves every UDP datagram to the stack.
	UDP func(*UDPConn)
}

// InboundTCP is a TCP connection attempt handed to Inbound.TCP. Exactly
// one of Accept and Refuse must be called.
type InboundTCP struct {
	req    *tcp.ForwarderRequest
	local  netip.AddrPort
	remote netip.AddrPort
	once   sync.Once
}

// Local returns the attempt's destination.
func (r *InboundTCP) Local() netip.AddrPort { return r.local }

// Remote returns the attempt's source.
func (r *InboundTCP) Remote() netip.AddrPort { return r.remote }

// errDecided is Accept's and Refuse's answer after the first of them.
var errDecided = errors.New("netstack: inbound TCP attempt already accepted or refused")

// Accept completes the handshake and returns the connection (a
// *gonet.TCPConn). It fails when the attempt was already decided, or the
// handshake could not be made (the host closed, the sender gone).
func (r *InboundTCP) Accept() (net.Conn, error) {
	var c net.Conn
	err := errDecided
	r.once.Do(func() {
		var wq waiter.Queue
		ep, e := r.req.CreateEndpoint(&wq)
		r.req.Complete(e != nil)
		if e != nil {
			err = &net.OpError{Op: "accept", Net: "tcp", Source: net.TCPAddrFromAddrPort(r.local), Addr: net.TCPAddrFromAddrPort(r.remote), Err: errnoOf(e)}
			return
		}
		ep.SocketOptions().SetKeepAlive(true)
		c, err = gonet.NewTCPConn(&wq, ep), nil
	})
	return c, err
}

// Refuse answers the attempt with a reset, as the stack does for a port
// where nothing listens. It does nothing once the attempt was decided.
func (r *InboundTCP) Refuse() {
	r.once.Do(func() { r.req.Complete(true) })
}

// inboundState is an installed Inbound with its gVisor forwarders.
type inboundState struct {
	in  Inbound
	tcp *tcp.Forwarder
	udp *udp.Forwarder
}

// SetInbound installs in, replacing the Inbound set before (attempts
// already handed to the old one stay with it). It fails with an error
// matching transport.ErrClosed after Close.
func (h *Host) SetInbound(in Inbound) error {
	if h.isClosed() {
		return fmt.Errorf("netstack: set inbound: %w", transport.ErrClosed)
	}
	if in.MaxPendingTCP <= 0 {
		in.MaxPendingTCP = DefaultMaxPendingTCP
	}
	st := &inboundState{in: in}
	if in.TCP != nil {
		st.tcp = tcp.NewForwarder(h.stack, 0, in.MaxPendingTCP, func(req *tcp.ForwarderRequest) {
			id := req.ID()
			in.TCP(&InboundTCP{req: req, local: addrPortOf(id.LocalAddress, id.LocalPort), remote: addrPortOf(id.RemoteAddress, id.RemotePort)})
		})
	}
	if in.UDP != nil {
		clock := transport.Or(h.opts.Clock)
		st.udp = udp.NewForwarder(h.stack, func(req *udp.ForwarderRequest) {
			var wq waiter.Queue
			ep, e := req.CreateEndpoint(&wq)
			if e != nil {
				h.inboundUDPFailed.Add(1)
				return
			}
			in.UDP(newUDPConn(&wq, ep, clock))
		})
	}
	h.inbound.Store(st)
	return nil
}

// installInbound makes the stack hand unclaimed TCP and UDP packets to the
// Inbound in force. gVisor's default handlers may be set only before the
// stack runs, so New installs these once and SetInbound swaps what they
// call.
func (h *Host) installInbound() {
	want := func(st *inboundState, proto string, id stack.TransportEndpointID) bool {
		return st.in.Want != nil && st.in.Want(proto, addrPortOf(id.LocalAddress, id.LocalPort), addrPortOf(id.RemoteAddress, id.RemotePort))
	}
	h.stack.SetTransportProtocolHandler(tcp.ProtocolNumber, func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		st := h.inbound.Load()
		return st != nil && st.tcp != nil && isSYN(pkt) && want(st, "tcp", id) && st.tcp.HandlePacket(id, pkt)
	})
	h.stack.SetTransportProtocolHandler(udp.ProtocolNumber, func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		st := h.inbound.Load()
		return st != nil && st.udp != nil && want(st, "udp", id) && st.udp.HandlePacket(id, pkt)
	})
}

// isSYN reports whether pkt is a connection attempt: SYN without ACK.
// Only those reach Want; other unclaimed segments stay the stack's.
func isSYN(pkt *stack.PacketBuffer) bool {
	h := header.TCP(pkt.TransportHeader().Slice())
	if len(h) < header.TCPMinimumSize {
		return false
	}
	f := h.Flags()
	return f.Contains(header.TCPFlagSyn) && !f.Contains(header.TCPFlagAck)
}

func addrPortOf(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip.Unmap(), port)
}
