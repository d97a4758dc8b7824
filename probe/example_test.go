package probe_test

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// A prober and the peer's responder exchanging probes, the engine's
// tunnel elided: Poll yields a probe, the peer's Responder answers the
// packet, HandleReply takes the reply. The first reply ends the peer's
// silence and is no RTT sample (here it waited 1.2 s for the tunnel's
// handshake); the prober probes again at once, and that reply is the first
// sample.
func ExampleProber() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	self, peerAddr := netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("100.64.0.2")
	peer := probe.NodeID{2}
	var r probe.Responder // on the peer
	answer := func(pr probe.Probe) []byte {
		pkt, _ := pr.AppendIPv4(nil, self, peerAddr, probe.DefaultPort)
		replyPkt, _ := r.RespondIPv4(pkt, nil)
		_, _, payload, _ := probe.ParseIPv4UDP(replyPkt) // back on our side
		return payload
	}

	p, _ := probe.NewProber(probe.ProberConfig{Seed: probe.SeedFrom(1)})
	_ = p.AddPeer(peer, now)
	probes, next := p.Poll(now, nil)
	pkt, _ := probes[0].AppendIPv4(nil, self, peerAddr, probe.DefaultPort)
	fmt.Println("probe packet:", len(pkt), "bytes; next poll in", next.Sub(now))

	now = now.Add(1200 * time.Millisecond)
	_ = p.HandleReply(peer, answer(probes[0]), now)
	h := p.Health(peer, now)
	fmt.Println("first reply:", h.Reason, h.RTTKnown)

	probes, _ = p.Poll(now, nil) // due at once
	payload := answer(probes[0])
	_ = p.HandleReply(peer, payload, now.Add(23*time.Millisecond))
	h = p.Health(peer, now.Add(23*time.Millisecond))
	fmt.Println("second reply:", h.Reason, h.RTT)
	fmt.Println(p.HandleReply(peer, payload, now.Add(30*time.Millisecond))) // replayed
	// Output:
	// probe packet: 52 bytes; next poll in 1s
	// first reply: rtt-unknown false
	// second reply: ok 23ms
	// probe: reply matches no outstanding probe: peer 0200000000000000 sequence 1
}

// Drive runs the prober on a clock; here a manual one, where a peer that
// never answers is excluded after two missing probes: the probe sent at 1 s
// expires at 4 s.
func ExampleProber_Drive() {
	clock := transporttest.NewManualClock()
	p, _ := probe.NewProber(probe.ProberConfig{Seed: probe.SeedFrom(1)})
	sent := 0
	d := p.Drive(clock, func(probe.Probe) { sent++ }) // the engine sends it through the tunnel
	defer d.Close()
	peer := probe.NodeID{2}
	_ = p.AddPeer(peer, clock.Now())

	clock.Advance(4*time.Second - 1)
	fmt.Println(p.Health(peer, clock.Now()).Reason, sent)
	clock.Advance(1)
	fmt.Println(p.Health(peer, clock.Now()).Reason, sent)
	// Output:
	// rtt-unknown 4
	// probe-timeout 5
}

// A TCP connect check against a real listener: the check passes once the
// port accepts a connection.
func ExampleNewChecker() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	c, _ := probe.NewChecker(probe.CheckerConfig{}) // net.Dialer, real clock, 250 ms tick
	defer c.Close()
	sub, err := c.Acquire(probe.CheckKey{
		Network: "home",
		Node:    probe.NodeID{2},
		Addr:    netip.MustParseAddrPort(ln.Addr().String()),
	}, probe.CheckConfig{}) // the defaults: 3 s, 2 s, 2 failures, 1 success
	if err != nil {
		fmt.Println(err)
		return
	}
	for deadline := time.Now().Add(5 * time.Second); !sub.Status().Checked && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	st := sub.Status()
	fmt.Println("checked:", st.Checked, "passing:", st.Passing)
	// Output: checked: true passing: true
}

// An ICMP port-unreachable excludes a UDP backend for 10 s.
func ExampleUnreachable() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	u, _ := probe.NewUnreachable(probe.UnreachableConfig{})
	key := probe.UnreachableKey{Node: probe.NodeID{2}, Proto: probe.ProtoUDP, Addr: netip.MustParseAddrPort("100.64.0.2:5353")}
	until, _ := u.Report(key, now)
	fmt.Println("excluded for", until.Sub(now))
	_, excluded := u.Until(key, now.Add(10*time.Second))
	fmt.Println("excluded after 10s:", excluded)
	// Output:
	// excluded for 10s
	// excluded after 10s: false
}

// The selector picks the local backend (RTT 0) over a measured remote one,
// and reports every backend's health.
func ExampleSelector() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, _ := probe.NewProber(probe.ProberConfig{Seed: probe.SeedFrom(1)})
	remote, untracked := probe.NodeID{2}, probe.NodeID{3}
	_ = p.AddPeer(remote, now)
	var r probe.Responder
	// The first exchange ends the peer's silence (no sample); the probe
	// the prober sends at once measures the path.
	for _, rtt := range []time.Duration{0, 8 * time.Millisecond} {
		probes, _ := p.Poll(now, nil)
		reply, _ := r.Respond(probes[0].Message[:], make([]byte, probe.MessageLen))
		_ = p.HandleReply(remote, reply, now.Add(rtt))
	}

	sel := &probe.Selector{Prober: p}
	backends := []probe.Backend{
		{Node: remote, Proto: probe.ProtoTCP, Addr: netip.MustParseAddrPort("100.64.0.2:6443")},
		{Node: untracked, Proto: probe.ProtoTCP, Addr: netip.MustParseAddrPort("100.64.0.3:6443")},
		{Node: probe.NodeID{1}, Local: true, Proto: probe.ProtoTCP, Addr: netip.MustParseAddrPort("100.64.0.1:6443")},
	}
	st, i := sel.Select(backends, now.Add(time.Second), nil)
	for j, s := range st {
		fmt.Println(backends[j].Addr, s.Reason, s.RTT)
	}
	fmt.Println("selected:", backends[i].Addr)
	backends[2].Disabled = true
	_, i = sel.Select(backends, now.Add(time.Second), st)
	fmt.Println("selected:", backends[i].Addr)
	// Output:
	// 100.64.0.2:6443 ok 8ms
	// 100.64.0.3:6443 no-path 0s
	// 100.64.0.1:6443 ok 0s
	// selected: 100.64.0.1:6443
	// selected: 100.64.0.2:6443
}
