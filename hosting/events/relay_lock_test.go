package events_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/events"
)

// Two relays on one outbox with the relay lock: one publishes, the other
// waits. When the holder's session dies (its backend terminated, as when
// its process is killed), the standby takes the lock and publishes the
// rest; the first sightings of each event id see them in commit order, and
// none is lost.
func TestRelayFailoverKeepsCommitOrder(t *testing.T) {
	e := newEnv(t)
	e.agents("a1", "a2", "p1")
	s := e.share("db", []string{"a1", "a2"}, nil)
	type relay struct {
		r      *events.Relay
		cancel context.CancelFunc
	}
	var wg sync.WaitGroup
	start := func() relay {
		r, err := events.NewRelay(events.RelayOptions{URL: rmq.URL(), Outbox: e.store, Lock: e.store, Exchange: e.topo.Exchange, Poll: 10 * time.Millisecond,
			Backoff: 20 * time.Millisecond, Standby: 20 * time.Millisecond, Batch: 5})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
		return relay{r, cancel}
	}
	a := start()
	until(t, "relay a holds the lock", 30*time.Second, func() bool { return a.r.Stats().Leads == 1 })
	b := start()
	t.Cleanup(func() { a.cancel(); b.cancel(); wg.Wait() })
	// 40 changes of one share, in commit order: port 1001, 1002, ...
	const n = 40
	change := func(i int) {
		port := uint16(1000 + i)
		if _, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Patch, TargetPort: &port}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= n/2; i++ {
		change(i)
	}
	until(t, "a published some", 30*time.Second, func() bool { return a.r.Stats().Published > 0 })
	if b.r.Stats().Leads != 0 || b.r.Stats().Published != 0 {
		t.Fatalf("the standby published: %+v", b.r.Stats())
	}
	// a's lock session dies.
	if _, err := e.pool.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND ((classid::bigint << 32) | objid::bigint) = $1`, int64(0x7669706b69740002)); err != nil {
		t.Fatal(err)
	}
	// a finds its lock lost and stops publishing; then its process is
	// gone (it may have taken the lock again meanwhile: its end frees it).
	until(t, "a found the lock lost", 30*time.Second, func() bool { return a.r.Stats().Lost == 1 })
	a.cancel()
	for i := n/2 + 1; i <= n; i++ {
		change(i)
	}
	until(t, "b took over", 30*time.Second, func() bool { return b.r.Stats().Leads >= 1 })
	until(t, "the outbox drained", 30*time.Second, func() bool { p, _ := e.store.Pending(e.ctx, 1); return len(p) == 0 })
	var ports []int
	seen := map[string]bool{}
	until(t, "every event on the sink", 30*time.Second, func() bool {
		for _, g := range e.drain(e.sink) {
			if !seen[g.id] {
				seen[g.id] = true
				ports = append(ports, int(g.data.TargetPort))
			}
		}
		return len(ports) >= n
	})
	for i, p := range ports {
		if p != 1001+i {
			t.Fatalf("event %d has port %d: out of commit order: %v", i, p, ports)
		}
	}
	// A relay counts a batch after marking it published, a moment after
	// the outbox reads empty: wait for the counts to cover every event.
	until(t, "every event counted", 30*time.Second, func() bool { return a.r.Stats().Published+b.r.Stats().Published >= n })
	sa, sb := a.r.Stats(), b.r.Stats()
	if sa.Lost != 1 || sb.Leads != 1 || sb.Published == 0 || sa.Published+sb.Published < n {
		t.Fatalf("a %+v, b %+v", sa, sb)
	}
	t.Logf("relay a %+v, relay b %+v", sa, sb)
}
