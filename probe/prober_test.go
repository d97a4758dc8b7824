package probe

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

var t0 = transporttest.Epoch

func nodeID(b byte) NodeID {
	var id NodeID
	id[0], id[31] = b, 1
	return id
}

func at(d time.Duration) time.Time { return t0.Add(d) }

func newProber(t testing.TB, cfg ProberConfig) *Prober {
	t.Helper()
	if cfg.Seed == ([32]byte{}) {
		cfg.Seed = SeedFrom(1)
	}
	p, err := NewProber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// reply builds the reply a Responder would send to pr.
func reply(t testing.TB, pr Probe) []byte {
	t.Helper()
	var r Responder
	b, err := r.Respond(pr.Message[:], make([]byte, MessageLen))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func poll(p *Prober, now time.Time) []Probe {
	out, _ := p.Poll(now, nil)
	return out
}

// warmUp ends the initial silence of peers ids at now, as a tunnel's first
// exchange does: the probes due at now are answered at once, those replies
// (the first after a silence) are no samples, and the prober, which then
// probes the peers again at once, reports no RTT yet. Every probe due at now
// must belong to ids. The sample tests start after it.
func warmUp(t testing.TB, p *Prober, now time.Time, ids ...NodeID) {
	t.Helper()
	probes := poll(p, now)
	if len(probes) != len(ids) {
		t.Fatalf("warm-up at %v: %d probes for %d peers", now.Sub(t0), len(probes), len(ids))
	}
	before := p.Stats().Unsampled
	for _, pr := range probes {
		if err := p.HandleReply(pr.Peer, reply(t, pr), now); err != nil {
			t.Fatal(err)
		}
		if h := p.Health(pr.Peer, now); h.RTTKnown || h.SampleAge != -1 {
			t.Fatalf("warm-up reply of %v became a sample: %+v", pr.Peer, h)
		}
	}
	if got := p.Stats().Unsampled - before; got != uint64(len(ids)) {
		t.Fatalf("warm-up: %d unsampled replies, want %d", got, len(ids))
	}
}

func TestProberConfig(t *testing.T) {
	p := newProber(t, ProberConfig{})
	c := p.Config()
	if c.Interval != time.Second || c.Timeout != 3*time.Second || c.MissLimit != 2 || c.StaleAfter != 10*time.Second || c.MaxPeers != 1024 {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range []ProberConfig{
		{Interval: -1}, {Timeout: -time.Second}, {StaleAfter: -1}, {MissLimit: -1}, {MaxPeers: -2},
		{Interval: time.Millisecond, Timeout: time.Second}, // 1000 outstanding probes
	} {
		if _, err := NewProber(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestProberFirstSampleAndEWMA(t *testing.T) {
	p := newProber(t, ProberConfig{})
	id := nodeID(1)
	if err := p.AddPeer(id, t0); err != nil {
		t.Fatal(err)
	}
	if h := p.Health(id, t0); h.Reason != ReasonRTTUnknown || !h.Eligible() || h.RTTKnown || h.SampleAge != -1 {
		t.Fatalf("before any sample: %+v", h)
	}
	warmUp(t, p, t0, id) // probe 0: the path's first exchange
	samples := []time.Duration{80 * time.Millisecond, 40 * time.Millisecond, 40 * time.Millisecond, 200 * time.Millisecond}
	var want time.Duration
	for i, s := range samples {
		sent := at(time.Duration(i) * time.Second)
		probes := poll(p, sent)
		if len(probes) != 1 || probes[0].Sequence != uint64(i+1) {
			t.Fatalf("probe %d: %+v", i, probes)
		}
		if err := p.HandleReply(id, reply(t, probes[0]), sent.Add(s)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			want = s
		} else {
			want = (7*want + s) / 8
		}
		h := p.Health(id, sent.Add(s))
		if h.RTT != want || !h.RTTKnown || h.LastRTT != s || h.Reason != ReasonOK || h.SampleAge != 0 {
			t.Fatalf("after sample %d (%v): %+v, want RTT %v", i, s, h, want)
		}
	}
}

func TestProberRejectsBadReplies(t *testing.T) {
	p := newProber(t, ProberConfig{})
	id := nodeID(1)
	_ = p.AddPeer(id, t0)
	warmUp(t, p, t0, id)
	probes := poll(p, t0)
	good := reply(t, probes[0])
	tamper := func(f func(m *Message)) []byte {
		m, _ := ParseMessage(good)
		f(&m)
		b := m.Bytes()
		return b[:]
	}
	other := newProber(t, ProberConfig{Seed: SeedFrom(2)})
	_ = other.AddPeer(id, t0)
	foreign := reply(t, poll(other, t0)[0])

	for _, tc := range []struct {
		name string
		peer NodeID
		b    []byte
		want error
	}{
		{"garbage", id, []byte("not a probe at all, no"), ErrMalformed},
		{"request echoed back", id, probes[0].Message[:], ErrMessageType},
		{"other session", id, foreign, ErrSession},
		{"unknown peer", nodeID(9), good, ErrUnknownPeer},
		{"wrong nonce", id, tamper(func(m *Message) { m.Nonce++ }), ErrUnmatchedReply},
		{"never sent", id, tamper(func(m *Message) { m.Sequence = 5 }), ErrUnmatchedReply},
	} {
		if err := p.HandleReply(tc.peer, tc.b, at(10*time.Millisecond)); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if h := p.Health(id, at(10*time.Millisecond)); h.Replies != 1 || h.RTTKnown { // 1: the warm-up
			t.Fatalf("%s produced a sample: %+v", tc.name, h)
		}
	}
	if err := p.HandleReply(id, good, at(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := p.HandleReply(id, good, at(30*time.Millisecond)); !errors.Is(err, ErrUnmatchedReply) {
		t.Fatalf("replayed reply: %v", err)
	}
	h := p.Health(id, at(30*time.Millisecond))
	if h.Replies != 2 || h.RTT != 20*time.Millisecond {
		t.Fatalf("replay changed the sample: %+v", h)
	}
	if st := p.Stats(); st.Rejected != 7 || st.Replies != 2 || st.Unsampled != 1 || st.ReplyBytes != 2*PacketLen || st.Sent != 2 || st.SentBytes != 2*PacketLen {
		t.Fatalf("stats %+v", st)
	}
}

func TestProberLateReplyIsNoSample(t *testing.T) {
	p := newProber(t, ProberConfig{})
	id := nodeID(1)
	_ = p.AddPeer(id, t0)
	pr := poll(p, t0)[0]
	// A reply at exactly the probe's 3 s expiry is too late.
	if err := p.HandleReply(id, reply(t, pr), at(3*time.Second)); !errors.Is(err, ErrUnmatchedReply) {
		t.Fatalf("late reply: %v", err)
	}
	if h := p.Health(id, at(3*time.Second)); h.Replies != 0 || h.Expired != 1 || h.Misses != 1 {
		t.Fatalf("%+v", h)
	}
}

// TestProberConsecutiveMisses: a miss followed by an answer does not count
// towards exclusion, even though the earlier probe expires after the later
// one was answered.
func TestProberConsecutiveMisses(t *testing.T) {
	p := newProber(t, ProberConfig{})
	id := nodeID(1)
	_ = p.AddPeer(id, t0)
	var probes []Probe
	for i := 0; i < 5; i++ {
		probes = append(probes, poll(p, at(time.Duration(i)*time.Second))...)
		if i == 1 { // probe 0 lost, probe 1 answered
			if err := p.HandleReply(id, reply(t, probes[1]), at(1100*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Probe 0 expires at 3 s after probe 1 was answered: not a consecutive miss.
	if h := p.Health(id, at(3*time.Second)); h.Misses != 0 || h.Expired != 1 || !h.Eligible() {
		t.Fatalf("at 3s: %+v", h)
	}
	// Probes 2, 3, 4 are lost: 2 expires at 5 s, 3 at 6 s → excluded at 6 s.
	if h := p.Health(id, at(6*time.Second-1)); h.Misses != 1 || !h.Eligible() {
		t.Fatalf("at 6s-1ns: %+v", h)
	}
	if h := p.Health(id, at(6*time.Second)); h.Misses != 2 || h.Reason != ReasonProbeTimeout {
		t.Fatalf("at 6s: %+v", h)
	}
	// One answer ends the exclusion. It ends a silence (the replies to
	// probes 0 and 1 were the first, and none came for 4.9 s), so it is no
	// sample; the peer is probed again at once, and that reply is.
	pr := poll(p, at(6*time.Second))
	if err := p.HandleReply(id, reply(t, pr[0]), at(6*time.Second+time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if h := p.Health(id, at(6*time.Second+time.Millisecond)); h.Reason != ReasonRTTUnknown || h.Misses != 0 || !h.Eligible() {
		t.Fatalf("after recovery: %+v", h)
	}
	pr = poll(p, at(6*time.Second+time.Millisecond))
	if len(pr) != 1 {
		t.Fatalf("no probe at once after the silence: %+v", pr)
	}
	if err := p.HandleReply(id, reply(t, pr[0]), at(6*time.Second+3*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if h := p.Health(id, at(6*time.Second+3*time.Millisecond)); h.Reason != ReasonOK || h.Misses != 0 || h.RTT != 2*time.Millisecond {
		t.Fatalf("after the first sample: %+v", h)
	}
}

func TestProberPathAndPeers(t *testing.T) {
	p := newProber(t, ProberConfig{MaxPeers: 2})
	a, b := nodeID(1), nodeID(2)
	if err := p.AddPeer(a, t0); err != nil {
		t.Fatal(err)
	}
	if err := p.AddPeer(a, t0); err != nil { // idempotent
		t.Fatal(err)
	}
	_ = p.AddPeer(b, t0)
	if err := p.AddPeer(nodeID(3), t0); !errors.Is(err, ErrPeerLimit) {
		t.Fatalf("third peer: %v", err)
	}
	if err := p.SetPath(nodeID(3), false); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("SetPath unknown: %v", err)
	}
	if err := p.SetPath(a, false); err != nil {
		t.Fatal(err)
	}
	if h := p.Health(a, t0); h.Reason != ReasonNoPath || h.PathUp {
		t.Fatalf("path down: %+v", h)
	}
	// Probes continue without a path: they may bring the handshake up.
	if got := poll(p, t0); len(got) != 2 || got[0].Peer != a || got[1].Peer != b {
		t.Fatalf("probes %+v", got)
	}
	_ = p.SetPath(a, true)
	if h := p.Health(a, t0); !h.Eligible() {
		t.Fatalf("path up again: %+v", h)
	}
	p.RemovePeer(a)
	p.RemovePeer(a)
	if h := p.Health(a, t0); h.Tracked || h.Reason != ReasonNoPath {
		t.Fatalf("removed: %+v", h)
	}
	if st := p.Stats(); st.Peers != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestProberPollDeadlines(t *testing.T) {
	p := newProber(t, ProberConfig{})
	if _, next := p.Poll(t0, nil); !next.IsZero() {
		t.Fatalf("no peers: next %v", next)
	}
	_ = p.AddPeer(nodeID(1), t0)
	out, next := p.Poll(t0, nil)
	if len(out) != 1 || !next.Equal(at(time.Second)) {
		t.Fatalf("next %v", next)
	}
	// An early poll sends nothing.
	if out, _ := p.Poll(at(500*time.Millisecond), nil); len(out) != 0 {
		t.Fatalf("early poll sent %d", len(out))
	}
	// A late poll sends one probe, not a burst, and the schedule restarts.
	out, next = p.Poll(at(7500*time.Millisecond), nil)
	if len(out) != 1 || !next.Equal(at(8500*time.Millisecond)) {
		t.Fatalf("late poll: %d probes, next %v", len(out), next)
	}
}

func TestProberZeroAlloc(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	p := newProber(t, ProberConfig{})
	id := nodeID(1)
	_ = p.AddPeer(id, t0)
	buf := make([]Probe, 0, 4)
	now := t0
	var rep [MessageLen]byte
	var r Responder
	if n := testing.AllocsPerRun(200, func() {
		var out []Probe
		out, _ = p.Poll(now, buf[:0])
		if len(out) == 1 {
			b, _ := r.Respond(out[0].Message[:], rep[:])
			if err := p.HandleReply(id, b, now.Add(time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
		_ = p.Health(id, now)
		now = now.Add(time.Second)
	}); n != 0 {
		t.Fatalf("Poll+HandleReply+Health allocate %v times", n)
	}
}

// TestProberModel drives the prober with random probe losses and reply
// delays and compares it, at random times, with a naive model that
// recomputes everything from the whole history.
func TestProberModel(t *testing.T) {
	seed := testenv.Seed(t, 5)
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := 0; round < 20; round++ {
		cfg := ProberConfig{
			Interval:   time.Duration(1+rng.IntN(4)) * 250 * time.Millisecond,
			Timeout:    time.Duration(1+rng.IntN(12)) * 250 * time.Millisecond,
			MissLimit:  1 + rng.IntN(3),
			StaleAfter: time.Duration(1+rng.IntN(20)) * 500 * time.Millisecond,
			Seed:       SeedFrom(seed + uint64(round)),
		}
		p := newProber(t, cfg)
		id := nodeID(1)
		_ = p.AddPeer(id, t0)
		type sent struct {
			pr        Probe
			at        time.Time
			arrive    time.Time // zero: lost
			delivered bool
			accepted  bool // delivered before the probe expired
		}
		var hist []sent
		var lastAccepted time.Time // arrival of the newest accepted reply
		silenceEnded := false      // a delivered reply ended a silence since the last poll
		lossy := rng.Float64()
		now := t0
		for step := 0; step < 400; step++ {
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			// Deliver replies due by now, in arrival order.
			for {
				j := -1
				for i, h := range hist {
					if !h.arrive.IsZero() && !h.delivered && !h.arrive.After(now) && (j < 0 || h.arrive.Before(hist[j].arrive)) {
						j = i
					}
				}
				if j < 0 {
					break
				}
				h := &hist[j]
				h.delivered = true
				h.accepted = h.arrive.Before(h.at.Add(cfg.Timeout))
				err := p.HandleReply(id, reply(t, h.pr), h.arrive)
				if h.accepted != (err == nil) {
					t.Fatalf("round %d: reply to %d sent %v arriving %v: %v", round, j, h.at, h.arrive, err)
				}
				if h.accepted {
					// The model's rule for the immediate probe: the end of a
					// silence (no accepted reply yet, or none for longer
					// than Timeout) makes the peer due at once.
					silenceEnded = silenceEnded || lastAccepted.IsZero() || h.arrive.Sub(lastAccepted) > cfg.Timeout
					lastAccepted = h.arrive
				}
			}
			probes := poll(p, now)
			if silenceEnded && len(probes) == 0 {
				t.Fatalf("round %d step %d at %v: no probe at once after the end of a silence", round, step, now.Sub(t0))
			}
			silenceEnded = false
			for _, pr := range probes {
				h := sent{pr: pr, at: now}
				if rng.Float64() >= lossy {
					h.arrive = now.Add(time.Duration(1+rng.IntN(int(cfg.Timeout/time.Millisecond)*3/2)) * time.Millisecond)
				}
				hist = append(hist, h)
			}
			// Naive model at now: accepted replies in arrival order are
			// samples, but for the end of a silence (no accepted reply
			// before it, or none for longer than Timeout) and replies to
			// probes sent before that end; the run of misses counts
			// expired probes newer than the newest answered one.
			var rtt, last time.Duration
			var lastAt, prevReply, sampleFrom time.Time
			have := false
			answered := -1
			var order []int
			for i, h := range hist {
				if h.accepted {
					order = append(order, i)
					answered = max(answered, i)
				}
			}
			for len(order) > 0 {
				j := 0
				for k := range order {
					if hist[order[k]].arrive.Before(hist[order[j]].arrive) {
						j = k
					}
				}
				h := hist[order[j]]
				order = append(order[:j], order[j+1:]...)
				silence := prevReply.IsZero() || h.arrive.Sub(prevReply) > cfg.Timeout
				prevReply = h.arrive
				if silence {
					sampleFrom = h.arrive
					continue
				}
				if h.at.Before(sampleFrom) {
					continue
				}
				if !have || h.arrive.Sub(lastAt) >= cfg.StaleAfter {
					rtt, have = h.arrive.Sub(h.at), true
				} else {
					rtt = (7*rtt + h.arrive.Sub(h.at)) / 8
				}
				last, lastAt = h.arrive.Sub(h.at), h.arrive
			}
			misses := 0
			for i := answered + 1; i < len(hist); i++ {
				if !now.Before(hist[i].at.Add(cfg.Timeout)) && !hist[i].accepted {
					misses++
				}
			}
			got := p.Health(id, now)
			if got.Misses != misses || got.RTT != rtt || got.LastRTT != last || (got.SampleAge >= 0) != have {
				t.Fatalf("round %d step %d at %v: prober %+v, model misses %d rtt %v last %v", round, step, now.Sub(t0), got, misses, rtt, last)
			}
			wantReason := ReasonOK
			switch {
			case misses >= cfg.MissLimit:
				wantReason = ReasonProbeTimeout
			case !have:
				wantReason = ReasonRTTUnknown
			case now.Sub(lastAt) >= cfg.StaleAfter:
				wantReason = ReasonRTTStale
			}
			if got.Reason != wantReason {
				t.Fatalf("round %d step %d: reason %v, model %v (%+v)", round, step, got.Reason, wantReason, got)
			}
		}
	}
}
