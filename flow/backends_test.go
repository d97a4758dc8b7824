package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDrainingBackends: a removed backend with active bindings is
// reported (the engine keeps probing its peer), with its binding counts,
// until its bindings retire; a configured backend never is.
func TestDrainingBackends(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}))
	require.Equal(t, Forward, f.host(udpTo(40000, "q")).Verdict)
	require.Empty(t, f.nat.DrainingBackends(), "configured backends are not draining")

	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}))
	d := f.nat.DrainingBackends()
	require.Len(t, d, 1)
	require.Equal(t, BackendStats{Listener: lUDP, Backend: be1, Active: 1, Created: 1}, d[0])

	// The binding still uses be1 and stays: the selector finds it available.
	r := f.host(udpTo(40000, "q2"))
	require.Equal(t, be1.Peer, r.Peer)

	// Idle expiry retires it: nothing drains any more.
	f.clock.Advance(DefaultUDPIdleTimeout)
	f.nat.Expire(f.clock.Now())
	require.Empty(t, f.nat.DrainingBackends())

	// A removed listener's bindings drain the same way.
	require.Equal(t, Forward, f.host(udpTo(40001, "q")).Verdict)
	require.True(t, f.nat.RemoveListener(lUDP))
	d = f.nat.DrainingBackends()
	require.Len(t, d, 1)
	require.Equal(t, be2, d[0].Backend)
	require.False(t, d[0].Configured)
	f.clock.Advance(DefaultUDPIdleTimeout + time.Nanosecond)
	f.nat.Expire(f.clock.Now())
	require.Empty(t, f.nat.DrainingBackends())
}

// TestBackendStatsCumulative: per-backend counters cover every binding the
// backend had, live and gone; failovers count on the backend the flow
// left; a removed backend's entry goes with its last binding while its
// traffic stays in the listener's counters; OnListenerGone gets a removed
// listener's final counters when the NAT forgets it.
func TestBackendStatsCumulative(t *testing.T) {
	var gone []ListenerStats
	f := newFixture(t, func(o *Options) { o.OnListenerGone = func(ls ListenerStats) { gone = append(gone, ls) } })
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be1, be2}}))
	stats := func() map[Backend]BackendStats {
		m := map[Backend]BackendStats{}
		for _, b := range f.nat.BackendStats() {
			require.Equal(t, lUDP, b.Listener)
			m[b.Backend] = b
		}
		return m
	}
	require.Equal(t, map[Backend]BackendStats{
		be1: {Listener: lUDP, Backend: be1, Configured: true},
		be2: {Listener: lUDP, Backend: be2, Configured: true},
	}, stats())

	q := udpTo(40000, "q")
	out := append([]byte(nil), q...)
	require.Equal(t, Forward, f.host(out).Verdict)
	require.Equal(t, Forward, f.host(udpTo(40000, "q")).Verdict)
	rep := replyTo(out, 0, "answer")
	require.Equal(t, Forward, f.peer(be1.Peer, rep).Verdict)
	want := Counters{PacketsOut: 2, BytesOut: 2 * uint64(len(q)), PacketsIn: 1, BytesIn: uint64(len(rep))}
	s := stats()[be1]
	require.Equal(t, want, s.Counters)
	require.Equal(t, 1, s.Active)
	require.Equal(t, uint64(1), s.Created)

	// Idle expiry and the end of the quarantine: the counts stay.
	f.clock.Advance(DefaultUDPIdleTimeout + DefaultQuarantine)
	f.nat.Expire(f.clock.Now())
	require.Empty(t, f.nat.Bindings())
	s = stats()[be1]
	require.Equal(t, want, s.Counters)
	require.Zero(t, s.Active+s.Quarantined)

	// be1 goes down: the next datagram of a new binding on it fails over.
	require.Equal(t, Forward, f.host(udpTo(40001, "q")).Verdict)
	f.sel.setDown(be1, true)
	f.nat.HealthChanged()
	require.Equal(t, be2.Peer, f.host(udpTo(40001, "q")).Peer)
	m := stats()
	require.Equal(t, uint64(1), m[be1].Failovers)
	require.Zero(t, m[be2].Failovers)
	require.Equal(t, 1, m[be1].Quarantined)
	require.Equal(t, uint64(2), m[be1].Created)
	require.Equal(t, uint64(1), m[be2].Created)

	// be1 is removed: it stays listed, not configured, while its
	// quarantined binding lasts, then it goes; the listener keeps counting it.
	require.NoError(t, f.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{be2}}))
	m = stats()
	require.False(t, m[be1].Configured)
	require.Equal(t, uint64(1), m[be1].Failovers)
	before, ok := f.nat.ListenerStats(lUDP)
	require.True(t, ok)
	f.clock.Advance(DefaultQuarantine)
	f.nat.Expire(f.clock.Now())
	m = stats()
	require.NotContains(t, m, be1)
	require.Len(t, m, 1)
	after, _ := f.nat.ListenerStats(lUDP)
	require.Equal(t, before.Counters, after.Counters)

	// The listener is removed: it is forgotten, and reported, once its
	// binding to be2 has expired and left quarantine.
	require.True(t, f.nat.RemoveListener(lUDP))
	require.Empty(t, gone)
	final, _ := f.nat.ListenerStats(lUDP)
	f.clock.Advance(DefaultUDPIdleTimeout + DefaultQuarantine)
	f.nat.Expire(f.clock.Now())
	require.Len(t, gone, 1)
	require.Equal(t, lUDP, gone[0].Listener)
	require.Equal(t, final.Counters, gone[0].Counters)
	require.Equal(t, uint64(1), gone[0].Failovers)
	require.Equal(t, uint64(3), gone[0].Created)
	require.Empty(t, f.nat.BackendStats())

	// A listener removed without bindings is reported at once.
	require.NoError(t, f.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}))
	require.True(t, f.nat.RemoveListener(lTCP))
	require.Len(t, gone, 2)
	require.Equal(t, lTCP, gone[1].Listener)
}
