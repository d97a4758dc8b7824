// Package wg runs wireguard-go on any transport.PacketIO and configures it
// from Go values.
//
// A Device is a wireguard-go device whose TUN side is a PacketIO — a
// gVisor netstack host (transport/netstack), a kernel TUN
// (PacketIOFromTUN), a channel pair, or the vip engine wrapping one of
// them — and whose encrypted side is a conn.Bind:
//
//	host stack ⇄ (vip engine) ⇄ Device ⇄ Bind ⇄ network
//
// Configuration is a Config value (private key, listen port, peers with
// public key, endpoint, allowed IPs, keepalive, preshared key). NewDevice,
// Configure, UpsertPeer, RemovePeer and MoveAllowedIP turn changes into
// wireguard-go's UAPI internally, writing only what changes: peers that stay
// keep their sessions, and a /32 or /128 moved between peers is re-routed in
// one step, never unrouted. Config and PeerStats read the live device back.
// Bad input is refused before anything changes, with errors that match the
// package's sentinels (ErrZeroKey, ErrDuplicatePeer, ErrDuplicateAllowedIP,
// ErrBadPrefix, ErrBadEndpoint, ...).
//
// Two Binds come with the package:
//
//   - wgtest.SimBind (test support) carries the encrypted UDP through a transporttest.Network, so
//     the network's latency, jitter, loss and partitions act on the real
//     WireGuard protocol, in process and without root;
//   - UDPBind uses real UDP sockets and impairs its own sends in real time
//     (latency, jitter, loss, partitions per destination), for nodes in
//     separate processes or network namespaces.
//
// Crossing handshakes are broken deterministically. When two peers send
// each other a handshake initiation at the same moment, wireguard-go on each
// side answers the other's and discards its own, so both handshakes fail
// and both retry 5 s later; peers with persistent keepalives retry in
// lockstep, and on a link with a long one-way delay their initiations can
// cross every time, leaving the leg dead. The Device therefore wraps any
// Bind other than wireguard-go's StdNetBind: a node that has an unanswered
// initiation of its own to an endpoint drops an initiation from that
// endpoint whose ephemeral key is greater than its own. Both sides apply the
// same rule to the same two keys, so exactly one handshake goes on
// (Device.CrossedInitiations counts the drops). The node that drops sends
// its own initiation once more, since the first copy may never have arrived
// (a peer that starts after this node could not hear it): a node started
// next to running peers has a session with each of them within a round
// trip or two, not after the 5 s retry.
//
// wireguard-go keeps its own real timers (handshakes, keepalives, rekeys),
// so anything that runs a Device runs in real time: tests over it assert
// outcomes, not exact traces.
//
// Typical use, two nodes over a simulated network:
//
//	n := transporttest.NewNetwork(nil, seed)
//	ba, bb := wgtest.NewSimBind(n, "a"), wgtest.NewSimBind(n, "b")
//	ka, kb := wg.GeneratePrivateKey(), wg.GeneratePrivateKey()
//	da, err := wg.NewDevice(hostA, wg.Config{PrivateKey: ka, Peers: []wg.PeerConfig{{
//		PublicKey:  kb.PublicKey(),
//		Endpoint:   bb.Addr(),
//		AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32")},
//	}}}, wg.Options{Bind: ba})
//	...
//	defer da.Close()
package wg
