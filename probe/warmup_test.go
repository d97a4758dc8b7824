package probe

import (
	"testing"
	"time"
)

// TestProberFirstReplyAfterSilence: the first reply from a peer that has
// been silent (no reply yet, or none for longer than Timeout) ends its run
// of misses but is not an RTT sample, and the peer is probed again at once.
// Replies to probes sent during the silence are not samples either: they
// waited in the tunnel's handshake queue, and their round trip measures the
// handshake, not the path.
func TestProberFirstReplyAfterSilence(t *testing.T) {
	p := newProber(t, ProberConfig{})
	id := nodeID(1)
	if err := p.AddPeer(id, t0); err != nil {
		t.Fatal(err)
	}
	// Probes at 0 s and 1 s wait for a 2 s handshake; both replies arrive
	// at 2.0xx s.
	first := poll(p, at(0))
	second := poll(p, at(time.Second))
	if len(first) != 1 || len(second) != 1 {
		t.Fatalf("probes at 0 s and 1 s: %d and %d", len(first), len(second))
	}
	if err := p.HandleReply(id, reply(t, first[0]), at(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	h := p.Health(id, at(2*time.Second))
	if h.RTTKnown || h.Reason != ReasonRTTUnknown || h.Misses != 0 || h.Replies != 1 {
		t.Fatalf("after the first reply, 2 s after its probe: want no RTT yet, no misses, 1 reply; got %+v", h)
	}
	// The peer is probed again at once, not at the next interval.
	again, next := p.Poll(at(2*time.Second), nil)
	if len(again) != 1 {
		t.Fatalf("no probe right after the first reply (next poll %v)", next.Sub(t0))
	}
	// The reply to the probe sent during the handshake arrives right after:
	// not a sample.
	if err := p.HandleReply(id, reply(t, second[0]), at(2*time.Second+time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if h := p.Health(id, at(2*time.Second+time.Millisecond)); h.RTTKnown {
		t.Fatalf("a probe sent during the silence became a sample: %+v", h)
	}
	// The probe sent after the first reply measures the path.
	if err := p.HandleReply(id, reply(t, again[0]), at(2*time.Second+2*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	h = p.Health(id, at(2*time.Second+2*time.Millisecond))
	if !h.RTTKnown || h.RTT != 2*time.Millisecond || h.Reason != ReasonOK {
		t.Fatalf("the first sample after the silence: want RTT 2ms, got %+v", h)
	}
	if s := p.Stats(); s.Unsampled != 2 || s.Replies != 3 {
		t.Fatalf("stats: %d replies, %d unsampled; want 3 and 2", s.Replies, s.Unsampled)
	}

	// Steady state: one probe a second, answered in 2 ms.
	now := at(3 * time.Second)
	for range 3 {
		pr := poll(p, now)
		if len(pr) != 1 {
			t.Fatalf("steady probe at %v: %d", now.Sub(t0), len(pr))
		}
		if err := p.HandleReply(id, reply(t, pr[0]), now.Add(2*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	if s := p.Stats(); s.Unsampled != 2 {
		t.Fatalf("steady replies were taken as the end of a silence: %d unsampled", s.Unsampled)
	}
	// Silence longer than Timeout (replies lost for 5 s), then a reply: the
	// end of a silence again, whatever the probe's own round trip.
	last := p.Health(id, now)
	silentFrom := now
	var pending []Probe
	for range 5 {
		pending = append(pending, poll(p, now)...)
		now = now.Add(time.Second)
	}
	pr := pending[len(pending)-1]
	if err := p.HandleReply(id, reply(t, pr), now.Add(-time.Second+5*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	h = p.Health(id, now)
	if h.LastRTT != last.LastRTT {
		t.Fatalf("the first reply after %v of silence became a sample (last RTT %v, was %v)", now.Sub(silentFrom), h.LastRTT, last.LastRTT)
	}
	if h.Misses != 0 {
		t.Fatalf("the reply did not end the run of misses: %+v", h)
	}
}
