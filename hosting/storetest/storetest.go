// Package storetest is the contract suite of hosting.Store: the memory
// store and the PostgreSQL store run the same test bodies.
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) hosting.Store { return hosting.NewMemStore() })
//	}
package storetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// Options tune the suite.
type Options struct {
	// Iterations of the concurrent-cascade test; 0 means 40.
	Iterations int
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Run runs the suite; newStore returns a fresh, empty store per test.
func Run(t *testing.T, newStore func(t *testing.T) hosting.Store, o Options) {
	if o.Iterations == 0 {
		o.Iterations = 40
	}
	t.Run("RoundTripBothRoles", func(t *testing.T) { roundTrip(t, newStore(t)) })
	t.Run("Finders", func(t *testing.T) { finders(t, newStore(t)) })
	t.Run("SaveByDifference", func(t *testing.T) { saveByDifference(t, newStore(t)) })
	t.Run("DeletedShareKeepsHosts", func(t *testing.T) { deletedKeepsHosts(t, newStore(t)) })
	t.Run("RollbackLosesNothing", func(t *testing.T) { rollback(t, newStore(t)) })
	t.Run("AuditPrincipals", func(t *testing.T) { auditPrincipals(t, newStore(t)) })
	t.Run("OutboxCommitsWithTheChange", func(t *testing.T) { outbox(t, newStore(t)) })
	t.Run("CreateTwice", func(t *testing.T) { createTwice(t, newStore(t)) })
	t.Run("LockSeesCommitted", func(t *testing.T) { lockSeesCommitted(t, newStore(t)) })
	t.Run("ConcurrentCascades", func(t *testing.T) {
		if n := concurrentCascades(t, newStore, o.Iterations, false); n != 0 {
			t.Fatalf("%d of %d iterations left a live share whose hosts are all deleted", n, o.Iterations)
		}
	})
	// The same test body catches the bug the lock prevents: with reads
	// taken before the lock (what a snapshot isolation level gives), both
	// cascades decide from {a, b} and the share stays live.
	t.Run("ConcurrentCascadesCatchStaleReads", func(t *testing.T) {
		if n := concurrentCascades(t, newStore, 5, true); n == 0 {
			t.Fatal("stale reads went unnoticed: the concurrency test cannot fail")
		}
	})
}

// staleStore reads each share before taking its lock, and both cascades
// of an iteration read before either locks: the bug the lock prevents.
type staleStore struct {
	hosting.Store
	// mu guards waiting and both.
	mu syncx.Mutex
	// +checklocks:mu
	waiting int
	// +checklocks:mu
	both chan struct{}
}

func (s *staleStore) arm() {
	s.mu.Lock()
	s.waiting, s.both = 0, make(chan struct{})
	s.mu.Unlock()
}

func (s *staleStore) InTx(ctx context.Context, fn func(ctx context.Context, tx hosting.Tx) error) error {
	return s.Store.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error { return fn(ctx, &staleTx{Tx: tx, s: s}) })
}

type staleTx struct {
	hosting.Tx
	s *staleStore
}

func (t *staleTx) Lock(ctx context.Context, ids ...string) ([]hosting.Share, error) {
	var stale []hosting.Share
	for _, id := range slices.Sorted(slices.Values(ids)) {
		sh, err := t.s.Store.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		stale = append(stale, sh)
	}
	t.s.mu.Lock()
	both := t.s.both
	if both != nil {
		t.s.waiting++
		if t.s.waiting == 2 {
			close(both)
			t.s.both = nil
		}
	}
	t.s.mu.Unlock()
	if both != nil {
		select {
		case <-both:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if _, err := t.Tx.Lock(ctx, ids...); err != nil {
		return nil, err
	}
	return stale, nil
}

func seed(t *testing.T, st hosting.Store, account string, agents ...string) {
	t.Helper()
	for _, a := range agents {
		if err := st.PutAgent(context.Background(), hosting.Agent{ID: a, AccountID: account}); err != nil {
			t.Fatal(err)
		}
	}
}

func share(active, passive []string) hosting.Share {
	return hosting.Share{ID: hosting.NewID(), AccountID: "acct", Name: "s", Kind: hosting.KindTCP, TargetAddress: "10.0.0.1", TargetPort: 80,
		Hosts: hosting.NewHosts(active, passive), CreatedAt: t0, UpdatedAt: t0}
}

func create(t *testing.T, st hosting.Store, s hosting.Share) {
	t.Helper()
	if err := st.InTx(context.Background(), func(ctx context.Context, tx hosting.Tx) error { return tx.Create(ctx, s) }); err != nil {
		t.Fatal(err)
	}
}

func roundTrip(t *testing.T, st hosting.Store) {
	seed(t, st, "acct", "a1", "a2", "p1")
	s := share([]string{"a2", "a1"}, []string{"p1"})
	create(t, st, s)
	got, err := st.Get(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Hosts.Equal(s.Hosts) || got.Name != s.Name || got.TargetPort != 80 || !got.Live() || got.Kind != hosting.KindTCP {
		t.Fatalf("got %+v, want %+v", got, s)
	}
	if _, err := st.Get(context.Background(), hosting.NewID()); !errors.Is(err, hosting.ErrNotFound) {
		t.Fatalf("missing share: %v", err)
	}
	if _, err := st.Get(context.Background(), "not-a-uuid"); !errors.Is(err, hosting.ErrNotFound) {
		t.Fatalf("malformed id: %v", err)
	}
}

func ids(ss []hosting.Share) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(v ...string) []string { return slices.Sorted(slices.Values(v)) }

func finders(t *testing.T, st hosting.Store) {
	ctx := context.Background()
	seed(t, st, "acct", "a1", "a2", "p1")
	s1 := share([]string{"a1"}, []string{"p1"})
	s2 := share([]string{"p1"}, nil)
	s3 := share([]string{"a2"}, nil)
	s3.AccountID = "other"
	s2.Kind = hosting.KindIPsec
	for _, s := range []hosting.Share{s1, s2, s3} {
		create(t, st, s)
	}
	check := func(name string, f hosting.Filter, want ...string) {
		t.Helper()
		got, err := st.Find(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), sorted(want...)) {
			t.Fatalf("%s: got %v, want %v", name, ids(got), sorted(want...))
		}
	}
	check("agent in either role", hosting.Filter{AgentID: "p1"}, s1.ID, s2.ID)
	check("active", hosting.Filter{ActiveAgentID: "p1"}, s2.ID)
	check("passive", hosting.Filter{PassiveAgentID: "p1"}, s1.ID)
	check("account", hosting.Filter{AccountID: "other"}, s3.ID)
	check("kind", hosting.Filter{Kind: hosting.KindIPsec}, s2.ID)
	check("kind and agent", hosting.Filter{Kind: hosting.KindTCP, AgentID: "p1"}, s1.ID)
	check("all", hosting.Filter{}, s1.ID, s2.ID, s3.ID)
	hb, err := st.SharesHostedBy(ctx, "p1")
	if err != nil || !slices.Equal(hb, sorted(s1.ID, s2.ID)) {
		t.Fatalf("SharesHostedBy = %v, %v", hb, err)
	}
	only, err := st.FindLiveHostedOnlyBy(ctx, "p1")
	if err != nil || !slices.Equal(ids(only), []string{s2.ID}) {
		t.Fatalf("FindLiveHostedOnlyBy = %v, %v", ids(only), err)
	}
	// Deleted shares and removed host rows are not found.
	err = st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		if _, err := tx.Lock(ctx, s2.ID, s1.ID); err != nil {
			return err
		}
		if err := tx.Delete(ctx, s2.ID, t0, "tester"); err != nil {
			return err
		}
		s1b := s1.Clone()
		s1b.Hosts = hosting.NewHosts([]string{"a1"}, nil)
		return tx.Save(ctx, s1b, t0)
	})
	if err != nil {
		t.Fatal(err)
	}
	check("after", hosting.Filter{AgentID: "p1"})
	if hb, _ := st.SharesHostedBy(ctx, "p1"); len(hb) != 0 {
		t.Fatalf("SharesHostedBy after = %v", hb)
	}
}

func saveByDifference(t *testing.T, st hosting.Store) {
	ctx := context.Background()
	seed(t, st, "acct", "a1", "a2", "p1", "p2")
	s := share([]string{"a1", "a2"}, []string{"p1"})
	create(t, st, s)
	next := s.Clone()
	next.Hosts = hosting.NewHosts([]string{"p1"}, []string{"a1", "p2"})
	next.Name, next.TargetAddress, next.TargetPort = "renamed", "fd00::1", 443
	err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		if _, err := tx.Lock(ctx, s.ID); err != nil {
			return err
		}
		return tx.Save(ctx, next, t0.Add(time.Hour))
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := st.Get(ctx, s.ID)
	if !got.Hosts.Equal(next.Hosts) || got.Name != "renamed" || got.TargetAddress != "fd00::1" || got.TargetPort != 443 {
		t.Fatalf("got %+v", got)
	}
	// Saving without the lock is refused.
	err = st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error { return tx.Save(ctx, s, t0) })
	if !errors.Is(err, hosting.ErrStore) {
		t.Fatalf("unlocked save: %v", err)
	}
}

func deletedKeepsHosts(t *testing.T, st hosting.Store) {
	ctx := context.Background()
	seed(t, st, "acct", "a1", "p1")
	s := share([]string{"a1"}, []string{"p1"})
	create(t, st, s)
	err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		if _, err := tx.Lock(ctx, s.ID); err != nil {
			return err
		}
		return tx.Delete(ctx, s.ID, t0.Add(time.Minute), "tester")
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Get(ctx, s.ID)
	if err != nil || got.Live() || !got.Hosts.Equal(s.Hosts) {
		t.Fatalf("deleted share = %+v, %v", got, err)
	}
}

func rollback(t *testing.T, st hosting.Store) {
	ctx := context.Background()
	seed(t, st, "acct", "a1", "a2")
	s := share([]string{"a1"}, nil)
	create(t, st, s)
	boom := errors.New("boom")
	err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		if _, err := tx.Lock(ctx, s.ID); err != nil {
			return err
		}
		n := s.Clone()
		n.Hosts = hosting.NewHosts([]string{"a2"}, nil)
		if err := tx.Save(ctx, n, t0); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	got, _ := st.Get(ctx, s.ID)
	if !got.Hosts.Equal(s.Hosts) {
		t.Fatalf("rolled-back write is visible: %+v", got.Hosts)
	}
}

// auditPrincipals: the *By columns round-trip: created by the creator,
// updated by the last writer, deleted by the deleter.
func auditPrincipals(t *testing.T, st hosting.Store) {
	ctx := context.Background()
	seed(t, st, "acct", "a1", "p1")
	s := share([]string{"a1"}, nil)
	s.CreatedBy, s.UpdatedBy = "alice", "alice"
	create(t, st, s)
	step := func(fn func(ctx context.Context, tx hosting.Tx) error) hosting.Share {
		t.Helper()
		err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			if _, err := tx.Lock(ctx, s.ID); err != nil {
				return err
			}
			return fn(ctx, tx)
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.Get(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := step(func(context.Context, hosting.Tx) error { return nil })
	if got.CreatedBy != "alice" || got.UpdatedBy != "alice" || got.DeletedBy != "" {
		t.Fatalf("created: %q %q %q", got.CreatedBy, got.UpdatedBy, got.DeletedBy)
	}
	got = step(func(ctx context.Context, tx hosting.Tx) error {
		n := s.Clone()
		n.Hosts, n.UpdatedBy = hosting.NewHosts([]string{"a1"}, []string{"p1"}), "bob"
		return tx.Save(ctx, n, t0.Add(time.Minute))
	})
	if got.CreatedBy != "alice" || got.UpdatedBy != "bob" {
		t.Fatalf("saved: %q %q", got.CreatedBy, got.UpdatedBy)
	}
	got = step(func(ctx context.Context, tx hosting.Tx) error {
		return tx.Delete(ctx, s.ID, t0.Add(time.Hour), "carol")
	})
	if got.CreatedBy != "alice" || got.UpdatedBy != "carol" || got.DeletedBy != "carol" || got.Live() {
		t.Fatalf("deleted: %q %q %q", got.CreatedBy, got.UpdatedBy, got.DeletedBy)
	}
}

// outbox: events added in a transaction are pending only once it commits,
// in order, and leave the pending list once marked published.
func outbox(t *testing.T, st hosting.Store) {
	ob, ok := st.(hosting.Outbox)
	if !ok {
		t.Fatalf("%T has no outbox", st)
	}
	ctx := context.Background()
	msg := func(key string) hosting.EventMessage {
		return hosting.EventMessage{ID: hosting.NewID(), RoutingKey: key, Body: []byte(`{"k":"` + key + `"}`), OccurredAt: t0}
	}
	add := func(fail bool, keys ...string) error {
		return st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			otx, ok := tx.(hosting.OutboxTx)
			if !ok {
				t.Fatalf("%T has no outbox", tx)
			}
			var ms []hosting.EventMessage
			for _, k := range keys {
				ms = append(ms, msg(k))
			}
			if err := otx.AddEvents(ctx, ms); err != nil {
				return err
			}
			if fail {
				return errors.New("rolled back")
			}
			return nil
		})
	}
	if err := add(true, "rolled.back"); err == nil {
		t.Fatal("no error")
	}
	if err := add(false, "share.UPDATED", "share.DELETED"); err != nil {
		t.Fatal(err)
	}
	if err := add(false, "share.UPDATED"); err != nil {
		t.Fatal(err)
	}
	p, err := ob.Pending(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i, e := range p {
		keys = append(keys, e.RoutingKey)
		if i > 0 && e.Seq <= p[i-1].Seq {
			t.Fatalf("pending out of order: %v", p)
		}
	}
	if !slices.Equal(keys, []string{"share.UPDATED", "share.DELETED", "share.UPDATED"}) {
		t.Fatalf("pending %v", keys)
	}
	if err := ob.MarkPublished(ctx, []int64{p[0].Seq, p[1].Seq}, t0); err != nil {
		t.Fatal(err)
	}
	if p2, _ := ob.Pending(ctx, 10); len(p2) != 1 || p2[0].Seq != p[2].Seq || string(p2[0].Body) != string(p[2].Body) || !p2[0].OccurredAt.Equal(t0) {
		t.Fatalf("after marking: %+v", p2)
	}
}

func createTwice(t *testing.T, st hosting.Store) {
	seed(t, st, "acct", "a1")
	s := share([]string{"a1"}, nil)
	create(t, st, s)
	err := st.InTx(context.Background(), func(ctx context.Context, tx hosting.Tx) error { return tx.Create(ctx, s) })
	if !errors.Is(err, hosting.ErrExists) {
		t.Fatalf("err = %v, want ErrExists", err)
	}
}

// lockSeesCommitted: a transaction that waited for a lock reads what the
// holder committed, not what it read before.
func lockSeesCommitted(t *testing.T, st hosting.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed(t, st, "acct", "a1", "a2")
	s := share([]string{"a1", "a2"}, nil)
	create(t, st, s)
	locked := make(chan struct{})
	release := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			if _, err := tx.Lock(ctx, s.ID); err != nil {
				close(locked)
				return err
			}
			n := s.Clone()
			n.Hosts = hosting.NewHosts([]string{"a2"}, nil)
			if err := tx.Save(ctx, n, t0); err != nil {
				close(locked)
				return err
			}
			close(locked)
			<-release
			return nil
		})
	}()
	<-locked
	var seen hosting.Hosts
	done := make(chan error, 1)
	go func() {
		done <- st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			ss, err := tx.Lock(ctx, s.ID)
			if err == nil {
				seen = ss[0].Hosts
			}
			return err
		})
	}()
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !seen.Equal(hosting.NewHosts([]string{"a2"}, nil)) {
		t.Fatalf("second locker saw %+v", seen)
	}
}

// concurrentCascades: two cascades removing the last two hosts of one share
// at the same time never leave a live share with no host.
// concurrentCascades runs the race and returns in how many iterations a
// share stayed live with only deleted agents as hosts.
func concurrentCascades(t *testing.T, newStore func(t *testing.T) hosting.Store, iterations int, stale bool) int {
	var st hosting.Store = newStore(t)
	var ss *staleStore
	if stale {
		ss = &staleStore{Store: st}
		st = ss
	}
	f := zitifake.Start(t, zititest.Options{})
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: "fd", HealthCheck: hosting.HealthCheck{Interval: time.Second, Timeout: time.Second, Failures: 1}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	violations := 0
	for i := 0; i < iterations && ctx.Err() == nil; i++ {
		a, b := hosting.NewID(), hosting.NewID()
		seed(t, st, "acct", a, b)
		f.AddIdentity(a)
		f.AddIdentity(b)
		active, passive := []string{a, b}, []string(nil)
		if i%2 == 1 {
			active, passive = []string{a}, []string{b}
		}
		// Two shares hosted by both agents: each cascade locks both, in id
		// order, so the two never deadlock.
		var shares []hosting.Share
		for k := 0; k < 2; k++ {
			act, pas := active, passive
			if k == 1 {
				act, pas = []string{b, a}, nil
			}
			s, err := svc.Create(ctx, hosting.Share{AccountID: "acct", Name: "race", Kind: hosting.KindTCP, TargetAddress: "10.1.1.1", TargetPort: 22},
				hosting.Update{Active: hosting.Of(act...), Passive: hosting.Of(pas...)})
			if err != nil {
				t.Fatal(err)
			}
			shares = append(shares, s)
		}
		for _, ag := range []string{a, b} {
			if err := st.PutAgent(ctx, hosting.Agent{ID: ag, AccountID: "acct", Deleted: true}); err != nil {
				t.Fatal(err)
			}
		}
		if ss != nil {
			ss.arm()
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, ag := range []string{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[j] = svc.RemoveDeletedAgent(ctx, ag)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil && !stale {
			t.Fatalf("iteration %d: %v", i, err)
		}
		broken := false
		for _, s := range shares {
			got, err := st.Get(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Live() {
				if !stale {
					t.Errorf("iteration %d: share is live with hosts %+v, all deleted", i, got.Hosts)
				}
				broken = true
			}
		}
		if broken {
			violations++
			continue
		}
		// A redelivery does nothing.
		if evs, err := svc.RemoveDeletedAgent(ctx, a); err != nil || len(evs) != 0 {
			t.Fatalf("redelivery: %v, %v", evs, err)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("cascades did not finish within the bound: %v", ctx.Err())
	}
	return violations
}
