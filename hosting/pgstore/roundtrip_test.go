package pgstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/internal/testenv"
)

// sqlLog records the statements a pool sends.
type sqlLog struct {
	mu sync.Mutex
	// +checklocks:mu
	sql []string
}

func (l *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
	return ctx
}

func (l *sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *sqlLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.sql
	l.sql = nil
	return out
}

// An update's transaction sends only statements that decide or write
// something: the level is known from the BEGIN the store sent, and the
// host rows that Lock read and locked are not read again by Save.
func TestUpdateTransactionSendsNoIdleStatement(t *testing.T) {
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
	log := &sqlLog{}
	cfg.ConnConfig.Tracer = log
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := pgstore.Migrate(ctx, p, ""); err != nil {
		t.Fatal(err)
	}
	st := pgstore.New(p, pgstore.Options{})
	for _, a := range []string{"a1", "p1"} {
		if err := st.PutAgent(ctx, hosting.Agent{ID: a, AccountID: "acct"}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	s := hosting.Share{ID: hosting.NewID(), AccountID: "acct", Name: "db", Kind: hosting.KindTCP, TargetAddress: "h", TargetPort: 1,
		Hosts: hosting.NewHosts([]string{"a1"}, []string{"p1"}), CreatedAt: now, UpdatedAt: now}
	if err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error { return tx.Create(ctx, s) }); err != nil {
		t.Fatal(err)
	}
	for round, hosts := range []hosting.Hosts{hosting.NewHosts([]string{"p1"}, []string{"a1"}), hosting.NewHosts([]string{"a1"}, []string{"p1"})} {
		log.take()
		err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
			ss, err := tx.Lock(ctx, s.ID)
			if err != nil {
				return err
			}
			next := ss[0]
			next.Hosts = hosts
			if err := tx.Save(ctx, next, now); err != nil {
				return err
			}
			next.Hosts = hosts // a second save in one transaction starts from the first
			return tx.Save(ctx, next, now)
		})
		if err != nil {
			t.Fatal(err)
		}
		hostReads := 0
		for _, q := range log.take() {
			if strings.Contains(q, "current_setting") {
				t.Errorf("round %d: the transaction asked for its level: %s", round, q)
			}
			if strings.HasPrefix(q, "SELECT share_id::text, agent_id, role FROM host") {
				hostReads++
			}
		}
		if hostReads != 1 {
			t.Errorf("round %d: the host rows were read %d times, want once (by Lock)", round, hostReads)
		}
		got, err := st.Get(ctx, s.ID)
		if err != nil || !got.Hosts.Equal(hosts) {
			t.Fatalf("round %d: hosts %+v (%v), want %+v", round, got.Hosts, err, hosts)
		}
	}
}
