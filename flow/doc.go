// Package flow is vipkit's NAT flow table and packet path for service VIPs:
// the translation a client node applies at its local ingress so that
// connections to a VIP (a virtual IPv4 address with TCP/UDP listeners) reach
// one of the listener's backends through the overlay, and the replies come
// back as if the VIP had sent them.
//
// A NAT (New) serves one overlay network. The vip engine, a PacketIO
// wrapper between the host's TUN and wireguard-go, calls
//
//   - FromHost for every packet the host sends. A packet to a VIP gets a
//     binding to a backend chosen by the engine's Selector and is rewritten
//     in place: destination → backend overlay address and application port,
//     source port → a shadow port reserved through a PortReserver (and the
//     source address → Options.LocalAddr). A local backend is reached by
//     hairpin: the packet is reflected into the host with the VIP as source.
//   - FromPeer for every packet an authenticated peer delivers: VIP sources
//     and destinations are refused, Options.Admit applies, and a reply from
//     the binding's backend peer is rewritten back to come from the VIP.
//
// FromHostBatch and FromPeerBatch do the same for a PacketIO batch, with
// the table's cache misses overlapped. All take the current time as an
// argument (no clock reads per packet), update checksums incrementally
// (RFC 1624) and allocate nothing for established flows. An established
// packet reads one 32-byte entry of the flow table's hash index (its
// rewrite target, checksum deltas and a lower bound of its idle deadline
// are stored there), so a table of a million flows costs one cache miss per
// packet; counters and idle deadlines are applied in batches. The result says what to do with the packet: Pass
// (not ours), Forward, Reflect (into the host), Drop (with a counted
// DropReason) or Consumed. Packets the NAT creates (fragments of datagrams
// it reassembled or that exceed the MTU, ICMP fragmentation-needed, and
// the refusals below) go to Options.Emit.
//
// A VIP port without a listener, a listener without backends and a VIP
// claimed with ClaimVIP but without listeners cannot accept traffic: a new
// flow to one is refused from the VIP like a closed port, a TCP RST or an
// ICMP port unreachable back into the host, rate-limited by a token bucket
// (Options.ReplyRate, 100/s, burst 20) and counted as ReasonRefused or
// ReasonPortUnreachable. RSTs, ICMP, non-unicast addresses and later
// fragments are never answered (docs/empty-vips.md).
//
// Bindings follow these delivery rules: a TCP flow is pinned to its
// backend, a retransmitted empty SYN before any SYN-ACK may be retargeted,
// a new SYN sequence on a reused tuple makes a new binding, RST (and FIN in
// both directions) shortens retention; UDP bindings fail over when the
// Selector reports their backend unavailable (after HealthChanged or an
// ICMP port unreachable, which is also reported to OnPortUnreachable). Idle
// bindings expire (7200 s TCP, 120 s UDP by default, per listener
// configurable); retired shadow ports stay quarantined for 120 s. Active and
// quarantined bindings share one bounded capacity (4096 by default); when it
// is full, new flows are refused and counted, and nothing live is evicted.
// Removing a backend, listener or VIP stops new bindings; existing ones
// drain until idle expiry. While an address has only draining bindings
// left (no listener, no claim), the NAT intercepts only those bindings'
// flows on it: everything else to and from the address passes untouched,
// so a node that now holds it (a VIP moves when a node's address wins
// it) is reachable at once, while the draining flows stay protected from
// a peer posing as their VIP side.
//
// Counters are cumulative until Close: per listener (ListenerStats), per
// backend of a listener for as long as it is configured or still drains
// (BackendStats, which also counts the UDP failovers away from each
// backend), and a removed listener's final counts go to
// Options.OnListenerGone when the NAT forgets it.
//
// Fragments are reassembled before NAT in a cache scoped to the sender and
// bounded in datagrams, bytes and fragments, expiring on the clock;
// overlapping fragments discard the datagram. ICMP errors about a binding
// get their quoted headers translated, so the client's stack sees the error
// for its own VIP flow.
//
// Headers are read, validated and rewritten through the packet package
// (its views, checksums and RFC 1624 deltas). The package holds two
// PortReservers: MemReserver (in memory, optionally keyed per backend for
// tables beyond 64k flows) and OSReserver (real sockets bound on the overlay
// address, Linux).
package flow
