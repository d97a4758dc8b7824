// Package probe decides which backends of a VIP listener may take new flows
// and which one a new flow goes to. It measures each used peer's round-trip
// time through the encrypted data plane, runs shared TCP connect checks off
// the packet path, remembers ports an ICMP port-unreachable error closed,
// and ranks backends by smoothed RTT.
//
// The parts, each a state machine that takes now so that it can be tested on
// a manual clock without goroutines:
//
//   - Prober: one probe exchange per second to each tracked peer; an EWMA
//     RTT (7/8 old + 1/8 new, the first sample sets it); a probe expires
//     after 3 s; two consecutive missing replies, or the engine's "no data
//     path" input (SetPath), exclude the peer; a sample counts for 10 s;
//     probing continues during failure, so recovery is automatic. A sample
//     is a round trip on an established path: the first reply after a
//     silence (none yet, or none for longer than the 3 s expiry) ends the
//     run of misses but is no sample, nor is a reply to a probe sent before
//     it (both may have waited for a tunnel handshake); the peer is then
//     probed again at once, and that reply is the first sample
//     (ProberStats.Unsampled counts the others; docs/probe.md). Poll
//     returns the probes to send and HandleReply takes the replies; Drive
//     runs it on a transport.Clock. The probe packet format (a versioned
//     24-byte UDP payload to a reserved port on the peer's overlay address)
//     is documented on MessageLen; a Responder answers probes on the peer.
//   - Scheduler and Checker: TCP connect checks shared per (network, node,
//     address, port), 3 s interval, 2 s timeout, 2 failures to exclude and 1
//     success to recover per listener, at most 32 checks and 32 connects in
//     flight, served in due order by a 250 ms worker tick. The Scheduler is
//     the pure state machine; the Checker runs it with a Dialer (net.Dialer
//     in production, a gVisor netstack host in tests).
//   - Unreachable: ports reported unreachable by ICMP are excluded for 10 s.
//     UDP backends get no other check than the path probe: no datagram is
//     ever injected into an unknown UDP application.
//   - Selector and Pick: each backend's Status (eligibility, Reason, RTT,
//     sample age) and the choice of the eligible backend with the lowest
//     smoothed RTT (local backends 0; unknown or stale RTT after every known
//     one, never as zero; deterministic ties).
//
// Every timing and limit is configurable; docs/defaults.md lists the
// defaults and their reasons.
// Probe bytes are counted by the Prober and the Responder, apart from user
// traffic.
//
// How the vip engine composes it, per overlay network:
//
//	prober, _ := probe.NewProber(probe.ProberConfig{})
//	drv := prober.Drive(clock, func(p probe.Probe) {
//		pkt, _ := p.AppendIPv4(buf[:0], selfAddr, peerAddr[p.Peer], probe.DefaultPort)
//		tunnel.write(pkt) // through wireguard-go, like user traffic
//	})
//	// on an IPv4/UDP packet from the tunnel with probe.IsProbePacket:
//	//   a request to us  → responder.RespondIPv4(pkt, out), send the reply back
//	//   a reply          → prober.HandleReply(peer, payload, clock.Now())
//	// on a WireGuard handshake or route change: prober.SetPath(peer, up)
//	checker, _ := probe.NewChecker(probe.CheckerConfig{Clock: clock})
//	sub, _ := checker.Acquire(probe.CheckKey{...}, probe.CheckConfig{}) // per TCP listener backend
//	sel := &probe.Selector{Prober: prober, Unreachable: unreach}
//	statuses, i := sel.Select(backends, clock.Now(), statuses)
//
// probe imports only package transport.
package probe
