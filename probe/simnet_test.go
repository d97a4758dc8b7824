package probe

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// simPair is a prober on node a probing node b over the simulated network
// on a manual clock. The network stands for the encrypted tunnel: a sends
// whole IPv4/UDP probe packets, b's agent answers with a Responder, and a
// hands replies to the prober, exactly as the vip engine does.
type simPair struct {
	t      *testing.T
	clock  *transporttest.ManualClock
	net    *transporttest.Network
	a, b   *transporttest.Node
	prober *Prober
	drv    *Driver
	resp   Responder
	peer   NodeID
	errs   []error
}

func newSimPair(t *testing.T, cfg ProberConfig, link transporttest.LinkConfig) *simPair {
	t.Helper()
	seed := testenv.Seed(t, 42)
	s := &simPair{t: t, clock: transporttest.NewManualClock(), peer: nodeID(2)}
	s.net = transporttest.NewNetwork(s.clock, seed)
	t.Cleanup(func() { s.net.Close() })
	if cfg.Seed == ([32]byte{}) {
		cfg.Seed = SeedFrom(seed)
	}
	s.prober = newProber(t, cfg)
	s.a = s.net.MustAddNode("a", transporttest.NodeOptions{Handler: func(p transporttest.Packet) {
		_, _, payload, err := ParseIPv4UDP(p.Data)
		if err == nil {
			err = s.prober.HandleReply(s.peer, payload, s.clock.Now())
		}
		if err != nil {
			s.errs = append(s.errs, err)
		}
	}})
	s.b = s.net.MustAddNode("b", transporttest.NodeOptions{Handler: func(p transporttest.Packet) {
		out, err := s.resp.RespondIPv4(p.Data, make([]byte, 0, PacketLen))
		if err != nil {
			s.errs = append(s.errs, err)
			return
		}
		_ = s.b.Send(s.a.Addr(), out)
	}})
	if err := s.net.SetLinkBoth(s.a, s.b, link); err != nil {
		t.Fatal(err)
	}
	if err := s.prober.AddPeer(s.peer, s.clock.Now()); err != nil {
		t.Fatal(err)
	}
	s.drv = s.prober.Drive(s.clock, func(pr Probe) {
		pkt, err := pr.AppendIPv4(nil, addrA, addrB, DefaultPort)
		if err != nil {
			t.Error(err)
			return
		}
		_ = s.a.Send(s.b.Addr(), pkt)
	})
	t.Cleanup(func() { s.drv.Close() })
	return s
}

func (s *simPair) health(at time.Time) PeerHealth {
	s.clock.AdvanceTo(at)
	return s.prober.Health(s.peer, s.clock.Now())
}

// TestSimCutExcludedAtSpecTiming cuts the path between two probes and
// checks the exclusion at exactly the first lost probe's send time +
// (MissLimit-1) intervals + the probe timeout (15.02 s for a cut at 10.5 s
// with the defaults: the first reply, at 20 ms, ends the initial silence and
// the schedule restarts from it), that probing continues during the cut, and
// that the peer returns with the first reply after the heal and is measured
// again by the next one.
func TestSimCutExcludedAtSpecTiming(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ProberConfig
	}{
		{"defaults", ProberConfig{}},
		{"configured", ProberConfig{Interval: 500 * time.Millisecond, Timeout: 2 * time.Second, MissLimit: 3, StaleAfter: 4 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const lat = 10 * time.Millisecond
			s := newSimPair(t, tc.cfg, transporttest.LinkConfig{Latency: lat})
			c := s.prober.Config()
			warm := 2 * lat // the first reply: the probe schedule restarts from it
			cut := at(10*c.Interval + c.Interval/2)
			firstLost := at(warm + 11*c.Interval)
			exclude := firstLost.Add(time.Duration(c.MissLimit-1)*c.Interval + c.Timeout)

			// Probes at 0, then at 20 ms + k intervals for k = 0..10: 12
			// replies, the first no sample.
			if h := s.health(cut); h.Reason != ReasonOK || h.RTT != 2*lat || h.Replies != 12 || s.prober.Stats().Unsampled != 1 {
				t.Fatalf("before the cut: %+v", h)
			}
			s.net.CutBoth(s.a, s.b)
			if h := s.health(exclude.Add(-1)); !h.Eligible() || h.Misses != c.MissLimit-1 {
				t.Fatalf("1 ns before %v: %+v", exclude.Sub(t0), h)
			}
			if h := s.health(exclude); h.Reason != ReasonProbeTimeout || h.Eligible() {
				t.Fatalf("at %v: %+v, want probe-timeout", exclude.Sub(t0), h)
			}
			heal := exclude.Add(5*c.Interval + c.Interval/2)
			sentBefore := s.prober.Health(s.peer, s.clock.Now()).Sent
			h := s.health(heal)
			if h.Reason != ReasonProbeTimeout || h.Sent-sentBefore < 5 {
				t.Fatalf("probing must continue during the cut: %+v (sent %d before)", h, sentBefore)
			}
			if drops := s.net.LinkStats(s.a, s.b).Dropped[transporttest.DropPartition]; drops < 5 {
				t.Fatalf("only %d probes hit the cut", drops)
			}
			// The path heals with a longer latency. The first reply ends the
			// silence: the peer is eligible again (its old sample expired:
			// rtt-stale) but the reply is no sample. The probe sent at once
			// measures the path: the first sample after the old one expired
			// sets the RTT; it is not blended with it.
			const lat2 = 30 * time.Millisecond
			_ = s.net.SetLinkBoth(s.a, s.b, transporttest.LinkConfig{Latency: lat2})
			s.net.Heal()
			back := heal.Add(c.Interval/2 + 2*lat2) // next probe's reply
			if h := s.health(back.Add(-1)); h.Eligible() {
				t.Fatalf("eligible before any reply after the heal: %+v", h)
			}
			if h := s.health(back); h.Reason != ReasonRTTStale || h.Misses != 0 || h.LastRTT != 2*lat {
				t.Fatalf("after the first reply after the heal: %+v", h)
			}
			if h := s.health(back.Add(2*lat2 - 1)); h.RTTKnown {
				t.Fatalf("sampled before the reply to the probe sent at once: %+v", h)
			}
			if h := s.health(back.Add(2 * lat2)); h.Reason != ReasonOK || h.Misses != 0 || h.RTT != 2*lat2 || h.SampleAge != 0 {
				t.Fatalf("after the heal: %+v", h)
			}
			for _, err := range s.errs {
				t.Errorf("unexpected error on the wire: %v", err)
			}
		})
	}
}

// TestSimSingleLossTolerated: one lost probe (fewer than MissLimit) never
// excludes the peer.
func TestSimSingleLossTolerated(t *testing.T) {
	s := newSimPair(t, ProberConfig{}, transporttest.LinkConfig{Latency: 5 * time.Millisecond})
	s.health(at(4500 * time.Millisecond))
	s.net.CutBoth(s.a, s.b)
	s.health(at(5500 * time.Millisecond)) // the probe at 5 s is lost
	s.net.Heal()
	for ms := 5500; ms <= 12000; ms += 100 {
		if h := s.health(at(time.Duration(ms) * time.Millisecond)); !h.Eligible() {
			t.Fatalf("at %dms: %+v", ms, h)
		}
	}
	if h := s.prober.Health(s.peer, s.clock.Now()); h.Expired != 1 {
		t.Fatalf("want exactly one expired probe: %+v", h)
	}
}

// TestSimRTTConvergesUnderJitter: with latency L ± J each way, every sample
// is within 2L ± 2J, so the EWMA settles in that band and its mean
// approaches 2L; after the latency changes it moves to the new band within
// the number of samples the 7/8 weight predicts.
func TestSimRTTConvergesUnderJitter(t *testing.T) {
	const (
		lat    = 20 * time.Millisecond
		jitter = 5 * time.Millisecond
	)
	s := newSimPair(t, ProberConfig{}, transporttest.LinkConfig{Latency: lat, Jitter: jitter})
	var sum time.Duration
	n := 0
	prev := PeerHealth{}
	for sec := 1; sec <= 60; sec++ {
		h := s.health(at(time.Duration(sec) * time.Second))
		// The probe at 0 s is answered first (no sample), the one sent
		// at once after it and one a second from then on are samples.
		if h.Replies != uint64(sec)+1 {
			t.Fatalf("at %ds: %d replies", sec, h.Replies)
		}
		if h.LastRTT < 2*(lat-jitter) || h.LastRTT > 2*(lat+jitter) {
			t.Fatalf("sample %v outside the link's %v ± %v", h.LastRTT, 2*lat, 2*jitter)
		}
		want := h.LastRTT
		if sec > 1 {
			want = (7*prev.RTT + h.LastRTT) / 8
		}
		if h.RTT != want {
			t.Fatalf("at %ds: RTT %v, want 7/8·%v + 1/8·%v = %v", sec, h.RTT, prev.RTT, h.LastRTT, want)
		}
		if h.RTT < 2*(lat-jitter) || h.RTT > 2*(lat+jitter) {
			t.Fatalf("at %ds: smoothed RTT %v outside %v ± %v", sec, h.RTT, 2*lat, 2*jitter)
		}
		if sec > 20 {
			sum += h.RTT
			n++
		}
		prev = h
	}
	if mean := sum / time.Duration(n); mean < 2*lat-jitter/2 || mean > 2*lat+jitter/2 {
		t.Fatalf("mean smoothed RTT %v, want %v ± %v", mean, 2*lat, jitter/2)
	}

	// Latency jumps to 50 ms: the error shrinks by 7/8 per sample, from
	// 60 ms to under 2·jitter + 1 ms in ceil(ln(11/60)/ln(7/8)) = 13 samples
	// plus jitter: allow 20.
	const lat2 = 50 * time.Millisecond
	_ = s.net.SetLinkBoth(s.a, s.b, transporttest.LinkConfig{Latency: lat2, Jitter: jitter})
	for sec := 61; sec <= 100; sec++ {
		h := s.health(at(time.Duration(sec) * time.Second))
		if sec >= 61+20 && (h.RTT < 2*(lat2-jitter) || h.RTT > 2*(lat2+jitter)) {
			t.Fatalf("at %ds: RTT %v not within %v ± %v after the change", sec, h.RTT, 2*lat2, 2*jitter)
		}
	}
}

// TestSimStaleAt10s: once replies stop, the last sample counts for exactly
// StaleAfter (10 s), whatever else the peer's state is.
func TestSimStaleAt10s(t *testing.T) {
	const lat = 7 * time.Millisecond
	for _, tc := range []struct {
		missLimit int
		staleWhy  Reason
		stale     time.Duration
	}{
		{missLimit: 100, staleWhy: ReasonRTTStale, stale: 0},               // not excluded: rtt-stale
		{missLimit: 0, staleWhy: ReasonProbeTimeout, stale: 0},             // excluded earlier; the RTT still expires at 10 s
		{missLimit: 100, staleWhy: ReasonRTTStale, stale: 4 * time.Second}, // configured
	} {
		t.Run(fmt.Sprintf("miss%d-stale%v", tc.missLimit, tc.stale), func(t *testing.T) {
			s := newSimPair(t, ProberConfig{MissLimit: tc.missLimit, StaleAfter: tc.stale}, transporttest.LinkConfig{Latency: lat})
			staleAfter := s.prober.Config().StaleAfter
			s.health(at(5500 * time.Millisecond))
			s.net.CutBoth(s.a, s.b)
			// The first reply (at 2·lat) restarted the schedule: the last
			// probe before the cut went out at 5 s + 2·lat.
			lastSample := at(5*time.Second + 4*lat)
			h := s.health(lastSample.Add(staleAfter - 1))
			if !h.RTTKnown || h.RTT != 2*lat || h.SampleAge != staleAfter-1 {
				t.Fatalf("1 ns before expiry: %+v", h)
			}
			h = s.health(lastSample.Add(staleAfter))
			if h.RTTKnown || h.SampleAge != staleAfter || h.Reason != tc.staleWhy {
				t.Fatalf("at expiry: %+v, want reason %v", h, tc.staleWhy)
			}
		})
	}
}

// TestSimSelectionFollowsPaths: three backends on peers 10, 20 and 30 ms
// away (one way). The selector picks the nearest; when its path is cut the
// choice moves to the next one at exactly the exclusion time, and moves
// back when the first reply after the heal arrives.
func TestSimSelectionFollowsPaths(t *testing.T) {
	seed := testenv.Seed(t, 9)
	clock := transporttest.NewManualClock()
	net := transporttest.NewNetwork(clock, seed)
	defer net.Close()
	p := newProber(t, ProberConfig{Seed: SeedFrom(seed)})
	client := netip.MustParseAddr("100.64.0.1")

	type peerNode struct {
		id   NodeID
		addr netip.Addr
		node *transporttest.Node
	}
	var peers []*peerNode
	byAddr := map[netip.Addr]*peerNode{}
	c := net.MustAddNode("client", transporttest.NodeOptions{Handler: func(pk transporttest.Packet) {
		src, _, payload, err := ParseIPv4UDP(pk.Data)
		if err != nil {
			t.Errorf("client: %v", err)
			return
		}
		if err := p.HandleReply(byAddr[src.Addr()].id, payload, clock.Now()); err != nil {
			t.Errorf("client: %v", err)
		}
	}})
	var bs []Backend
	for i, lat := range []time.Duration{10, 20, 30} {
		pn := &peerNode{id: nodeID(byte(10 + i)), addr: netip.AddrFrom4([4]byte{100, 64, 0, byte(2 + i)})}
		var r Responder
		pn.node = net.MustAddNode(fmt.Sprint("peer", i), transporttest.NodeOptions{Handler: func(pk transporttest.Packet) {
			out, err := r.RespondIPv4(pk.Data, nil)
			if err != nil {
				t.Errorf("peer: %v", err)
				return
			}
			_ = pn.node.Send(c.Addr(), out)
		}})
		_ = net.SetLinkBoth(c, pn.node, transporttest.LinkConfig{Latency: lat * time.Millisecond})
		peers = append(peers, pn)
		byAddr[pn.addr] = pn
		_ = p.AddPeer(pn.id, clock.Now())
		bs = append(bs, Backend{Node: pn.id, Proto: ProtoTCP, Addr: netip.AddrPortFrom(pn.addr, 443)})
	}
	drv := p.Drive(clock, func(pr Probe) {
		for _, pn := range peers {
			if pn.id == pr.Peer {
				pkt, _ := pr.AppendIPv4(nil, client, pn.addr, DefaultPort)
				_ = c.Send(pn.node.Addr(), pkt)
			}
		}
	})
	defer drv.Close()
	sel := &Selector{Prober: p}
	var st []Status
	pick := func(d time.Duration) int {
		clock.AdvanceTo(at(d))
		var i int
		st, i = sel.Select(bs, clock.Now(), st)
		return i
	}
	if i := pick(5 * time.Millisecond); i != 0 || st[0].Reason != ReasonRTTUnknown {
		t.Fatalf("before any sample: picked %d (%+v); ties among unknown RTTs go by node id", i, st)
	}
	// Peer 0's first reply (20 ms) is no sample; the probe it sends at
	// once is answered at 40 ms.
	if i := pick(30 * time.Millisecond); i != 0 || st[0].Reason != ReasonRTTUnknown || st[0].RTTKnown {
		t.Fatalf("first reply in: picked %d %+v", i, st)
	}
	if i := pick(40 * time.Millisecond); i != 0 || st[0].RTT != 20*time.Millisecond || st[2].Reason != ReasonRTTUnknown {
		t.Fatalf("first sample in: picked %d %+v", i, st)
	}
	if i := pick(5 * time.Second); i != 0 {
		t.Fatalf("picked %d", i)
	}
	clock.AdvanceTo(at(5500 * time.Millisecond))
	net.CutBoth(c, peers[0].node)
	// Peer 0 is probed at 20 ms + k s: those at 6.02 s and 7.02 s are
	// lost, so it is excluded at 7.02 s + 3 s.
	if i := pick(10*time.Second + 20*time.Millisecond - 1); i != 0 {
		t.Fatalf("moved early: %d", i)
	}
	if i := pick(10*time.Second + 20*time.Millisecond); i != 1 || st[0].Reason != ReasonProbeTimeout || st[1].RTT != 40*time.Millisecond {
		t.Fatalf("at exclusion: picked %d %+v", i, st)
	}
	clock.AdvanceTo(at(12500 * time.Millisecond))
	net.Heal()
	// The probe at 13.02 s is answered at 13.04 s: it ends the silence (no
	// sample), and the 20 ms sample of 5.04 s still counts.
	if i := pick(13*time.Second + 40*time.Millisecond - 1); i != 1 {
		t.Fatalf("returned before a reply: %d", i)
	}
	if i := pick(13*time.Second + 40*time.Millisecond); i != 0 || st[0].RTT != 20*time.Millisecond {
		t.Fatalf("after the heal: picked %d %+v", i, st)
	}
}
