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
