// Package netstack runs a userspace TCP/IP host — gVisor's netstack — on the
// TUN side of a transport.PacketIO, so that tests, examples and the demo can
// run real TCP and UDP applications over the overlay without root.
//
// A Host is both ends of a virtual interface at once:
//
//   - as a transport.PacketIO it is what a wireguard-go device (or a vip
//     engine wrapper, or a test pump) sees: Read returns the IP packets the
//     stack sends out, Write injects IP packets into the stack;
//   - towards applications it offers DialContext, DialTCP, DialUDP, ListenTCP
//     and ListenUDP, returning ordinary net.Conn, net.Listener and
//     net.PacketConn values.
//
// Unlike wireguard-go's tun/netstack, a Host moves packets in batches
// (Options.BatchSize, 64 by default), blocks in Read without polling, and
// exposes the *stack.Stack, so that callers can add a VIP address at run
// time (AddAddress), turn on forwarding, spoofing and promiscuous mode for
// hairpin and NAT paths, install iptables rules, and reserve ports in the
// stack's own port manager (ReservePort).
//
// A minimal use, two hosts joined by something that carries packets between
// their PacketIO sides (a wireguard-go tunnel, a simulated network, or a
// plain copy loop):
//
//	a, _ := netstack.New(netstack.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
//	b, _ := netstack.New(netstack.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}})
//	// ... copy packets a.Read → b.Write and b.Read → a.Write ...
//	ln, _ := b.ListenTCP(netip.MustParseAddrPort("10.0.0.2:80"))
//	c, _ := a.DialContext(ctx, "tcp", "10.0.0.2:80")
//
// Defaults chosen for correctness under loss with the pinned gVisor version
// (see Options): SACK on, reno congestion control (cubic was seen to stall
// connections for good), no software GSO, and UDP sockets (UDPConn) whose
// writes cannot miss the wake-up of a draining send buffer. Packets the
// outbound queue cannot take are dropped and counted, like a full qdisc,
// and Stats reports every drop on the PacketIO side.
//
// Time: gVisor keeps its own real-time timers (retransmission, TIME-WAIT,
// keep-alive), so traffic through a Host runs in real time; tests over it
// assert outcomes, not exact traces.
package netstack
