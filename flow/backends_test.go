package flow

import (
	"reflect"
	"testing"
	"time"
)

// TestDrainingBackends: a removed backend with active bindings is
// reported (the engine keeps probing its peer), with its binding counts,
// until its bindings retire; a configured backend never is.
func TestDrainingBackends(t *testing.T) {
	f := newFixture(t)
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}): %v", err)
	}
	if got := f.host(udpTo(40000, "q")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(40000, \"q\")).Verdict = %v, want %v", got, Forward)
	}
	if got := f.nat.DrainingBackends(); len(got) != 0 {
		t.Fatalf("configured backends are not draining: f.nat.DrainingBackends() = %v, want empty", got)
	}

	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}): %v", err)
	}
	d := f.nat.DrainingBackends()
	if len(d) != 1 {
		t.Fatalf("len(d) = %d, want %d: %v", len(d), 1, d)
	}
	if want := (BackendStats{Listener: lUDP, Backend: be1, Active: 1, Created: 1}); d[0] != want {
		t.Fatalf("d[0] = %v, want %v", d[0], want)
	}

	// The binding still uses be1 and stays: the selector finds it available.
	r := f.host(udpTo(40000, "q2"))
	if r.Peer != be1.Peer {
		t.Fatalf("r.Peer = %v, want %v", r.Peer, be1.Peer)
	}

	// Idle expiry retires it: nothing drains any more.
	f.clock.Advance(DefaultUDPIdleTimeout)
	f.nat.Expire(f.clock.Now())
	if got := f.nat.DrainingBackends(); len(got) != 0 {
		t.Fatalf("f.nat.DrainingBackends() = %v, want empty", got)
	}

	// A removed listener's bindings drain the same way.
	if got := f.host(udpTo(40001, "q")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(40001, \"q\")).Verdict = %v, want %v", got, Forward)
	}
	if !f.nat.RemoveListener(lUDP) {
		t.Fatal("f.nat.RemoveListener(lUDP) is false")
	}
	d = f.nat.DrainingBackends()
	if len(d) != 1 {
		t.Fatalf("len(d) = %d, want %d: %v", len(d), 1, d)
	}
	if d[0].Backend != be2 {
		t.Fatalf("d[0].Backend = %v, want %v", d[0].Backend, be2)
	}
	if d[0].Configured {
		t.Fatal("d[0].Configured is true")
	}
	f.clock.Advance(DefaultUDPIdleTimeout + time.Nanosecond)
	f.nat.Expire(f.clock.Now())
	if got := f.nat.DrainingBackends(); len(got) != 0 {
		t.Fatalf("f.nat.DrainingBackends() = %v, want empty", got)
	}
}

// TestBackendStatsCumulative: per-backend counters cover every binding the
// backend had, live and gone; failovers count on the backend the flow
// left; a removed backend's entry goes with its last binding while its
// traffic stays in the listener's counters; OnListenerGone gets a removed
// listener's final counters when the NAT forgets it.
func TestBackendStatsCumulative(t *testing.T) {
	var gone []ListenerStats
	f := newFixture(t, func(o *Options) { o.OnListenerGone = func(ls ListenerStats) { gone = append(gone, ls) } })
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}): %v", err)
	}
	stats := func() map[Backend]BackendStats {
		m := map[Backend]BackendStats{}
		for _, b := range f.nat.BackendStats() {
			if b.Listener != lUDP {
				t.Fatalf("b.Listener = %v, want %v", b.Listener, lUDP)
			}
			m[b.Backend] = b
		}
		return m
	}
	if want, got := (map[Backend]BackendStats{
		be1: {Listener: lUDP, Backend: be1, Configured: true},
		be2: {Listener: lUDP, Backend: be2, Configured: true},
	}), stats(); !reflect.DeepEqual(got, want) {
		t.Fatalf("stats() = %v, want %v", got, want)
	}

	q := udpTo(40000, "q")
	out := append([]byte(nil), q...)
	if got := f.host(out).Verdict; got != Forward {
		t.Fatalf("f.host(out).Verdict = %v, want %v", got, Forward)
	}
	if got := f.host(udpTo(40000, "q")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(40000, \"q\")).Verdict = %v, want %v", got, Forward)
	}
	rep := replyTo(out, 0, "answer")
	if got := f.peer(be1.Peer, rep).Verdict; got != Forward {
		t.Fatalf("f.peer(be1.Peer, rep).Verdict = %v, want %v", got, Forward)
	}
	want := Counters{PacketsOut: 2, BytesOut: 2 * uint64(len(q)), PacketsIn: 1, BytesIn: uint64(len(rep))}
	s := stats()[be1]
	if s.Counters != want {
		t.Fatalf("s.Counters = %v, want %v", s.Counters, want)
	}
	if s.Active != 1 {
		t.Fatalf("s.Active = %v, want %v", s.Active, 1)
	}
	if s.Created != uint64(1) {
		t.Fatalf("s.Created = %v, want %v", s.Created, uint64(1))
	}

	// Idle expiry and the end of the quarantine: the counts stay.
	f.clock.Advance(DefaultUDPIdleTimeout + DefaultQuarantine)
	f.nat.Expire(f.clock.Now())
	if got := f.nat.Bindings(); len(got) != 0 {
		t.Fatalf("f.nat.Bindings() = %v, want empty", got)
	}
	s = stats()[be1]
	if s.Counters != want {
		t.Fatalf("s.Counters = %v, want %v", s.Counters, want)
	}
	if s.Active+s.Quarantined != 0 {
		t.Fatalf("s.Active+s.Quarantined = %v, want 0", s.Active+s.Quarantined)
	}

	// be1 goes down: the next datagram of a new binding on it fails over.
	if got := f.host(udpTo(40001, "q")).Verdict; got != Forward {
		t.Fatalf("f.host(udpTo(40001, \"q\")).Verdict = %v, want %v", got, Forward)
	}
	f.sel.setDown(be1, true)
	f.nat.HealthChanged()
	if got := f.host(udpTo(40001, "q")).Peer; got != be2.Peer {
		t.Fatalf("f.host(udpTo(40001, \"q\")).Peer = %v, want %v", got, be2.Peer)
	}
	m := stats()
	if m[be1].Failovers != uint64(1) {
		t.Fatalf("m[be1].Failovers = %v, want %v", m[be1].Failovers, uint64(1))
	}
	if m[be2].Failovers != 0 {
		t.Fatalf("m[be2].Failovers = %v, want 0", m[be2].Failovers)
	}
	if m[be1].Quarantined != 1 {
		t.Fatalf("m[be1].Quarantined = %v, want %v", m[be1].Quarantined, 1)
	}
	if m[be1].Created != uint64(2) {
		t.Fatalf("m[be1].Created = %v, want %v", m[be1].Created, uint64(2))
	}
	if m[be2].Created != uint64(1) {
		t.Fatalf("m[be2].Created = %v, want %v", m[be2].Created, uint64(1))
	}

	// be1 is removed: it stays listed, not configured, while its
	// quarantined binding lasts, then it goes; the listener keeps counting it.
	if err := f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}); err != nil {
		t.Fatalf("f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}): %v", err)
	}
	m = stats()
	if m[be1].Configured {
		t.Fatal("m[be1].Configured is true")
	}
	if m[be1].Failovers != uint64(1) {
		t.Fatalf("m[be1].Failovers = %v, want %v", m[be1].Failovers, uint64(1))
	}
	before, ok := f.nat.ListenerStats(lUDP)
	if !ok {
		t.Fatal("ok is false")
	}
	f.clock.Advance(DefaultQuarantine)
	f.nat.Expire(f.clock.Now())
	m = stats()
	if _, ok := m[be1]; ok {
		t.Fatalf("m = %v, want it not to have key %v", m, be1)
	}
	if len(m) != 1 {
		t.Fatalf("len(m) = %d, want %d: %v", len(m), 1, m)
	}
	after, _ := f.nat.ListenerStats(lUDP)
	if after.Counters != before.Counters {
		t.Fatalf("after.Counters = %v, want %v", after.Counters, before.Counters)
	}

	// The listener is removed: it is forgotten, and reported, once its
	// binding to be2 has expired and left quarantine.
	if !f.nat.RemoveListener(lUDP) {
		t.Fatal("f.nat.RemoveListener(lUDP) is false")
	}
	if len(gone) != 0 {
		t.Fatalf("gone = %v, want empty", gone)
	}
	final, _ := f.nat.ListenerStats(lUDP)
	f.clock.Advance(DefaultUDPIdleTimeout + DefaultQuarantine)
	f.nat.Expire(f.clock.Now())
	if len(gone) != 1 {
		t.Fatalf("len(gone) = %d, want %d: %v", len(gone), 1, gone)
	}
	if gone[0].Listener != lUDP {
		t.Fatalf("gone[0].Listener = %v, want %v", gone[0].Listener, lUDP)
	}
	if gone[0].Counters != final.Counters {
		t.Fatalf("gone[0].Counters = %v, want %v", gone[0].Counters, final.Counters)
	}
	if gone[0].Failovers != uint64(1) {
		t.Fatalf("gone[0].Failovers = %v, want %v", gone[0].Failovers, uint64(1))
	}
	if gone[0].Created != uint64(3) {
		t.Fatalf("gone[0].Created = %v, want %v", gone[0].Created, uint64(3))
	}
	if got := f.nat.BackendStats(); len(got) != 0 {
		t.Fatalf("f.nat.BackendStats() = %v, want empty", got)
	}

	// A listener removed without bindings is reported at once.
	if err := f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	if !f.nat.RemoveListener(lTCP) {
		t.Fatal("f.nat.RemoveListener(lTCP) is false")
	}
	if len(gone) != 2 {
		t.Fatalf("len(gone) = %d, want %d: %v", len(gone), 2, gone)
	}
	if gone[1].Listener != lTCP {
		t.Fatalf("gone[1].Listener = %v, want %v", gone[1].Listener, lTCP)
	}
}
