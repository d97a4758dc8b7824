package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/pgstore/pgtest"
	"github.com/vipkit/vipkit/hosting/storetest"
	"github.com/vipkit/vipkit/internal/testenv"
)

var (
	server   *pgtest.Server
	startErr error
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	server, startErr = pgtest.Start(ctx)
	cancel()
	code := m.Run()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest stop:", err)
		}
	}
	if code == 0 {
		if err := goleak.Find(testenv.IdleHTTP()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// pool returns a pool on a fresh database, migrated up to version to
// ("" for all).
func pool(t *testing.T, to string) *pgxpool.Pool { return poolTB(t, to) }

func poolTB(t testing.TB, to string) *pgxpool.Pool {
	t.Helper()
	if server == nil {
		testenv.Skip(t, "PostgreSQL: %v", startErr)
	}
	ctx := context.Background()
	cs, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(cs)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := pgstore.Migrate(ctx, p, to); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) hosting.Store { return pgstore.New(pool(t, ""), pgstore.Options{}) }, storetest.Options{Iterations: 100})
}

func TestLockRefusesOtherIsolationLevels(t *testing.T) {
	p := pool(t, "")
	for _, lvl := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		st := pgstore.New(p, pgstore.Options{IsoLevel: lvl})
		err := st.InTx(context.Background(), func(ctx context.Context, tx hosting.Tx) error {
			_, err := tx.Lock(ctx, hosting.NewID())
			return err
		})
		if !errors.Is(err, hosting.ErrIsolation) {
			t.Fatalf("%s: err = %v, want ErrIsolation", lvl, err)
		}
	}
}

func TestMigrationV1014MovesAgentIDToActiveHosts(t *testing.T) {
	ctx := context.Background()
	p := pool(t, "1.0.13")
	ids := []string{hosting.NewID(), hosting.NewID(), hosting.NewID()}
	if _, err := p.Exec(ctx, "INSERT INTO agent (id, account_id) VALUES ('ag1','acct'), ('ag2','acct')"); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		agent := []string{"ag1", "ag2", "ag1"}[i]
		kind := []string{"tcp", "ipsec", "http"}[i]
		if _, err := p.Exec(ctx, `INSERT INTO share (id, account_id, name, kind, target_address, target_port, agent_id, created_at, updated_at)
			VALUES ($1, 'acct', 'seeded', $2, '10.0.0.1', 80, $3, now(), now())`, id, kind, agent); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgstore.Migrate(ctx, p, ""); err != nil {
		t.Fatal(err)
	}
	st := pgstore.New(p, pgstore.Options{})
	for i, id := range ids {
		s, err := st.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := hosting.NewHosts([]string{[]string{"ag1", "ag2", "ag1"}[i]}, nil)
		if !s.Hosts.Equal(want) {
			t.Fatalf("share %d hosts %+v, want %+v", i, s.Hosts, want)
		}
	}
	var n int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM host WHERE role = 'ACTIVE'").Scan(&n); err != nil || n != 3 {
		t.Fatalf("ACTIVE rows = %d, %v", n, err)
	}
	if err := p.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'share' AND column_name = 'agent_id'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("agent_id columns left: %d, %v", n, err)
	}
	// Running it again applies nothing.
	if err := pgstore.Migrate(ctx, p, ""); err != nil {
		t.Fatal(err)
	}
}

func TestMigrationChecksumMismatchRefused(t *testing.T) {
	ctx := context.Background()
	p := pool(t, "")
	if _, err := p.Exec(ctx, "UPDATE schema_migrations SET checksum = 'x' WHERE version = '1.0.14'"); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, p, ""); !errors.Is(err, pgstore.ErrMigration) {
		t.Fatalf("err = %v, want ErrMigration", err)
	}
	if err := pgstore.Migrate(ctx, p, "9.9.9"); !errors.Is(err, pgstore.ErrMigration) {
		t.Fatalf("unknown target: %v", err)
	}
}

// One reconciler at a time across replicas: the advisory lock is taken
// by one store, refused to another on the same database, free again after
// unlock, and released by the server when the holder's connections die.
func TestReconcilerAdvisoryLock(t *testing.T) {
	ctx := context.Background()
	p := pool(t, "")
	cfg := p.Config().Copy()
	p2, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	a, b := pgstore.New(p, pgstore.Options{}), pgstore.New(p2, pgstore.Options{})
	unlock, ok, err := a.TryLockReconciler(ctx)
	if err != nil || !ok {
		t.Fatalf("first: %v %v", ok, err)
	}
	if _, ok, err := b.TryLockReconciler(ctx); err != nil || ok {
		t.Fatalf("second while held: %v %v", ok, err)
	}
	unlock()
	unlockB, ok, err := b.TryLockReconciler(ctx)
	if err != nil || !ok {
		t.Fatalf("second after unlock: %v %v", ok, err)
	}
	// The holder's session dies (as with a SIGKILLed replica): the
	// server releases the lock.
	var n int
	if err := p.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid()
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the holder: %d %v", n, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		unlockA, ok, err := a.TryLockReconciler(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			unlockA()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lock outlived its holder's session")
		}
		time.Sleep(10 * time.Millisecond)
	}
	unlockB() // its connection is dead: unlock closes it
}

// Two transactions claim one event id: the second waits for the first
// on the inbox's key and, once it committed, finds the id taken; after a
// rollback the id is free again. PruneInbox removes the old ids only.
func TestInboxClaimIsOncePerCommit(t *testing.T) {
	ctx := context.Background()
	p := pool(t, "")
	st := pgstore.New(p, pgstore.Options{})
	id := hosting.NewID()
	claim := func(ctx context.Context, tx hosting.Tx) (bool, error) {
		return tx.(hosting.IntakeTx).ClaimEvent(ctx, id, hosting.RouteAgentCreated, time.Now())
	}
	// A claim that rolls back leaves the id free.
	_ = st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		if ok, err := claim(ctx, tx); !ok || err != nil {
			t.Fatalf("first claim %v %v", ok, err)
		}
		return errors.New("roll back")
	})
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan bool, 1)
	go func() {
		_ = st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			ok, err := claim(ctx, tx)
			if !ok || err != nil {
				t.Errorf("claim after the rollback %v %v", ok, err)
			}
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	go func() {
		_ = st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			ok, err := claim(ctx, tx)
			if err != nil {
				t.Error(err)
			}
			done <- ok
			return nil
		})
	}()
	// The second claim waits on the first transaction's row lock.
	var waiting bool
	deadline := time.Now().Add(30 * time.Second)
	for !waiting && time.Now().Before(deadline) {
		_ = p.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO inbox%'").Scan(&waiting)
	}
	if !waiting {
		t.Fatal("the second claim did not wait for the first")
	}
	close(release)
	if <-done {
		t.Fatal("the same event id was claimed twice")
	}
	// Handled sees the committed id and claims nothing for an unknown one.
	_ = st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
		itx := tx.(hosting.IntakeTx)
		if ok, err := itx.Handled(ctx, id); !ok || err != nil {
			t.Errorf("Handled(committed) = %v, %v", ok, err)
		}
		if ok, err := itx.Handled(ctx, "never-seen"); ok || err != nil {
			t.Errorf("Handled(unknown) = %v, %v", ok, err)
		}
		return nil
	})
	if _, err := p.Exec(ctx, "INSERT INTO inbox (event_id, routing_key, occurred_at, handled_at) VALUES ('old', 'agent.CREATED', now(), now() - interval '8 days')"); err != nil {
		t.Fatal(err)
	}
	n, err := st.PruneInbox(ctx, time.Now().Add(-7*24*time.Hour))
	var left int
	_ = p.QueryRow(ctx, "SELECT count(*) FROM inbox").Scan(&left)
	if n != 1 || err != nil || left != 1 {
		t.Fatalf("pruned %d (%v), %d left; want 1 and 1", n, err, left)
	}
}

// One relay lock per database: a second try fails while the first holds
// it, Held sees the holder's session end, and Unlock frees it.
func TestRelayAdvisoryLock(t *testing.T) {
	ctx := context.Background()
	p := pool(t, "")
	a, b := pgstore.New(p, pgstore.Options{}), pgstore.New(p, pgstore.Options{})
	l, ok, err := a.TryLockRelay(ctx)
	if !ok || err != nil {
		t.Fatalf("first lock %v %v", ok, err)
	}
	if err := l.Held(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.TryLockRelay(ctx); ok || err != nil {
		t.Fatalf("second lock %v %v", ok, err)
	}
	l.Unlock()
	l2, ok, err := b.TryLockRelay(ctx)
	if !ok || err != nil {
		t.Fatalf("after unlock %v %v", ok, err)
	}
	// The holder's session ends (its process died): Held says so, and
	// the lock is free.
	var n int
	if err := p.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND ((classid::bigint << 32) | objid::bigint) = $1`, pgstore.RelayLockKey).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the holder: %d %v", n, err)
	}
	if err := l2.Held(ctx); err == nil {
		t.Fatal("Held after the session ended")
	}
	l2.Unlock()
	// pg_terminate_backend only signals the backend: the server frees
	// the lock when that process has exited, a moment later.
	deadline := time.Now().Add(time.Minute)
	for {
		l3, ok, err := a.TryLockRelay(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			l3.Unlock()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay lock outlived its holder's session")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
