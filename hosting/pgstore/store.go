// Package pgstore is the PostgreSQL implementation of hosting.Store, on
// pgx v5.
//
// The schema comes from versioned migrations embedded in the package
// (migrations/V<version>__<name>.sql), applied by Migrate. V1.0.14 creates
// the host table and moves every share's legacy agent_id into it as an
// ACTIVE host row. All share kinds live in one share table (kind column);
// host.share_id has no foreign key, as the shares are soft-deleted.
//
// Every transaction runs at READ COMMITTED, and Lock refuses any other
// level with hosting.ErrIsolation: at a snapshot level the host rows read
// after a SELECT … FOR UPDATE would come from the snapshot taken before the
// other writer committed. Lock takes the row locks one share at a time in
// id order, so two transactions never deadlock on each other.
//
// Usage:
//
//	pool, _ := pgxpool.New(ctx, connString)
//	if err := pgstore.Migrate(ctx, pool, ""); err != nil { … }
//	st := pgstore.New(pool, pgstore.Options{})
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/hosting"
)

// Options configure a Store.
type Options struct {
	// IsoLevel is the level transactions begin at; "" means READ
	// COMMITTED, the only level Lock accepts. It exists to show the refusal.
	IsoLevel pgx.TxIsoLevel
}

// Store is a hosting.Store on a pgx pool. It is safe for concurrent use;
// the pool's owner closes the pool.
type Store struct {
	pool *pgxpool.Pool
	iso  pgx.TxIsoLevel
}

var (
	_ hosting.Store    = (*Store)(nil)
	_ hosting.Outbox   = (*Store)(nil)
	_ hosting.OutboxTx = (*tx)(nil)
	_ hosting.IntakeTx = (*tx)(nil)
)

// New returns a store on pool, which must be migrated (Migrate).
func New(pool *pgxpool.Pool, o Options) *Store {
	if o.IsoLevel == "" {
		o.IsoLevel = pgx.ReadCommitted
	}
	return &Store{pool: pool, iso: o.IsoLevel}
}

// querier is what pool and tx share.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func storeErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, hosting.ErrNotFound) || errors.Is(err, hosting.ErrExists) || errors.Is(err, hosting.ErrIsolation) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", hosting.ErrStore, err)
}

const shareCols = "id::text, account_id, name, kind, target_address, target_port, created_at, updated_at, deleted_at, coalesce(created_by, ''), coalesce(updated_by, ''), coalesce(deleted_by, '')"

func scanShare(r pgx.Row) (hosting.Share, error) {
	var s hosting.Share
	var kind string
	var port int32
	var del *time.Time
	if err := r.Scan(&s.ID, &s.AccountID, &s.Name, &kind, &s.TargetAddress, &port, &s.CreatedAt, &s.UpdatedAt, &del, &s.CreatedBy, &s.UpdatedBy, &s.DeletedBy); err != nil {
		return s, err
	}
	s.Kind = hosting.Kind(kind)
	if port < 1 || port > 65535 {
		return s, fmt.Errorf("%w: share %s has target port %d", hosting.ErrStore, s.ID, port)
	}
	s.TargetPort = uint16(port)
	if del != nil {
		s.DeletedAt = *del
	}
	return s, nil
}

// withHosts fills in the live host rows of shares.
func withHosts(ctx context.Context, q querier, ss []hosting.Share, lock bool) error {
	if len(ss) == 0 {
		return nil
	}
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.ID
	}
	sql := "SELECT share_id::text, agent_id, role FROM host WHERE share_id = ANY($1::uuid[]) AND deleted_at IS NULL ORDER BY share_id, agent_id"
	if lock {
		sql += " FOR UPDATE"
	}
	rows, err := q.Query(ctx, sql, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	act, pas := map[string][]string{}, map[string][]string{}
	for rows.Next() {
		var sid, agent, role string
		if err := rows.Scan(&sid, &agent, &role); err != nil {
			return err
		}
		switch hosting.Role(role) {
		case hosting.Active:
			act[sid] = append(act[sid], agent)
		case hosting.Passive:
			pas[sid] = append(pas[sid], agent)
		default:
			return fmt.Errorf("%w: host row of share %s has role %q", hosting.ErrStore, sid, role)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range ss {
		ss[i].Hosts = hosting.NewHosts(act[ss[i].ID], pas[ss[i].ID])
	}
	return nil
}

func queryShares(ctx context.Context, q querier, sql string, args ...any) ([]hosting.Share, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	ss, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (hosting.Share, error) { return scanShare(r) })
	if err != nil {
		return nil, err
	}
	return ss, withHosts(ctx, q, ss, false)
}

func agents(ctx context.Context, q querier, ids []string) (map[string]hosting.Agent, error) {
	out := map[string]hosting.Agent{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, "SELECT id, account_id, deleted_at IS NOT NULL FROM agent WHERE id = ANY($1)", ids)
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a hosting.Agent
		if err := rows.Scan(&a.ID, &a.AccountID, &a.Deleted); err != nil {
			return nil, storeErr(err)
		}
		out[a.ID] = a
	}
	return out, storeErr(rows.Err())
}

// Agents implements hosting.AgentLookup.
func (s *Store) Agents(ctx context.Context, ids []string) (map[string]hosting.Agent, error) {
	return agents(ctx, s.pool, ids)
}

// PutAgent implements hosting.Store.
func (s *Store) PutAgent(ctx context.Context, a hosting.Agent) error {
	if a.ID == "" {
		return fmt.Errorf("%w: agent without id", hosting.ErrStore)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO agent (id, account_id, deleted_at) VALUES ($1, $2, CASE WHEN $3 THEN now() END)
		ON CONFLICT (id) DO UPDATE SET account_id = EXCLUDED.account_id,
		deleted_at = CASE WHEN $3 THEN COALESCE(agent.deleted_at, now()) END`, a.ID, a.AccountID, a.Deleted)
	return storeErr(err)
}

// Get implements hosting.Store.
func (s *Store) Get(ctx context.Context, id string) (hosting.Share, error) {
	if !hosting.ValidUUID(id) {
		return hosting.Share{}, fmt.Errorf("%w: %s", hosting.ErrNotFound, id)
	}
	ss, err := queryShares(ctx, s.pool, "SELECT "+shareCols+" FROM share WHERE id = $1", id)
	if err != nil {
		return hosting.Share{}, storeErr(err)
	}
	if len(ss) == 0 {
		return hosting.Share{}, fmt.Errorf("%w: %s", hosting.ErrNotFound, id)
	}
	return ss[0], nil
}

// Find implements hosting.Store: live shares, filtered through live host
// rows.
func (s *Store) Find(ctx context.Context, f hosting.Filter) ([]hosting.Share, error) {
	sql := "SELECT " + shareCols + " FROM share s WHERE s.deleted_at IS NULL"
	var args []any
	add := func(cond string, v string) {
		args = append(args, v)
		sql += fmt.Sprintf(" AND "+cond, len(args))
	}
	if f.AccountID != "" {
		add("s.account_id = $%d", f.AccountID)
	}
	if f.Kind != "" {
		add("s.kind = $%d", string(f.Kind))
	}
	if f.AgentID != "" {
		add("EXISTS (SELECT 1 FROM host h WHERE h.share_id = s.id AND h.deleted_at IS NULL AND h.agent_id = $%d)", f.AgentID)
	}
	if f.ActiveAgentID != "" {
		add("EXISTS (SELECT 1 FROM host h WHERE h.share_id = s.id AND h.deleted_at IS NULL AND h.role = 'ACTIVE' AND h.agent_id = $%d)", f.ActiveAgentID)
	}
	if f.PassiveAgentID != "" {
		add("EXISTS (SELECT 1 FROM host h WHERE h.share_id = s.id AND h.deleted_at IS NULL AND h.role = 'PASSIVE' AND h.agent_id = $%d)", f.PassiveAgentID)
	}
	sql += " ORDER BY s.id"
	ss, err := queryShares(ctx, s.pool, sql, args...)
	return ss, storeErr(err)
}

const hostedBy = `SELECT s.id::text FROM share s WHERE s.deleted_at IS NULL AND s.id IN
	(SELECT h.share_id FROM host h WHERE h.agent_id = $1 AND h.deleted_at IS NULL) ORDER BY s.id`

func sharesHostedBy(ctx context.Context, q querier, agent string) ([]string, error) {
	return queryIDs(ctx, q, hostedBy, agent)
}

// queryIDs runs sql, whose rows are one id each, and returns the ids (an
// empty list, not nil, when there is none).
func queryIDs(ctx context.Context, q querier, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, storeErr(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if ids == nil {
		ids = []string{}
	}
	return ids, storeErr(err)
}

// SharesHostedBy implements hosting.Store.
func (s *Store) SharesHostedBy(ctx context.Context, agent string) ([]string, error) {
	return sharesHostedBy(ctx, s.pool, agent)
}

// FindLiveHostedOnlyBy implements hosting.Store.
func (s *Store) FindLiveHostedOnlyBy(ctx context.Context, agent string) ([]hosting.Share, error) {
	ss, err := queryShares(ctx, s.pool, "SELECT "+shareCols+` FROM share s WHERE s.deleted_at IS NULL
		AND EXISTS (SELECT 1 FROM host h WHERE h.share_id = s.id AND h.deleted_at IS NULL AND h.agent_id = $1)
		AND NOT EXISTS (SELECT 1 FROM host h WHERE h.share_id = s.id AND h.deleted_at IS NULL AND h.agent_id <> $1)
		ORDER BY s.id`, agent)
	return ss, storeErr(err)
}

// InTx implements hosting.Store. fn's error is returned as it is; a failed
// begin or commit is hosting.ErrStore.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx hosting.Tx) error) error {
	t, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: s.iso})
	if err != nil {
		return storeErr(err)
	}
	defer t.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	// A transaction this store began at READ COMMITTED is known to run at
	// it (BEGIN named the level), so Lock need not ask the server.
	if err := fn(ctx, &tx{t: t, locked: map[string]bool{}, hosts: map[string]hosting.Hosts{}, iso: s.iso == pgx.ReadCommitted}); err != nil {
		return err
	}
	return storeErr(t.Commit(ctx))
}

type tx struct {
	t      pgx.Tx
	locked map[string]bool
	// hosts holds the live host rows of each share this transaction
	// locked or created, as they stand in it: Save reads them here
	// rather than from the server, as nothing else can change them
	// while the rows are locked.
	hosts map[string]hosting.Hosts
	iso   bool // the transaction is known to run at READ COMMITTED
}

func (t *tx) Agents(ctx context.Context, ids []string) (map[string]hosting.Agent, error) {
	return agents(ctx, t.t, ids)
}

func (t *tx) checkIsolation(ctx context.Context) error {
	if t.iso {
		return nil
	}
	var level string
	if err := t.t.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&level); err != nil {
		return storeErr(err)
	}
	if level != "read committed" {
		return fmt.Errorf("%w: transaction runs at %s", hosting.ErrIsolation, level)
	}
	t.iso = true
	return nil
}

// Lock implements hosting.Tx: one share at a time in id order, its row and
// then its live host rows FOR UPDATE, read after the lock was granted.
func (t *tx) Lock(ctx context.Context, ids ...string) ([]hosting.Share, error) {
	if err := t.checkIsolation(ctx); err != nil {
		return nil, err
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(ids)))
	out := make([]hosting.Share, 0, len(sorted))
	for _, id := range sorted {
		if !hosting.ValidUUID(id) {
			return nil, fmt.Errorf("%w: %s", hosting.ErrNotFound, id)
		}
		row := t.t.QueryRow(ctx, "SELECT "+shareCols+" FROM share WHERE id = $1 FOR UPDATE", id)
		s, err := scanShare(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%w: %s", hosting.ErrNotFound, id)
		}
		if err != nil {
			return nil, storeErr(err)
		}
		one := []hosting.Share{s}
		if err := withHosts(ctx, t.t, one, true); err != nil {
			return nil, storeErr(err)
		}
		t.locked[id] = true
		t.hosts[id] = one[0].Hosts.Clone()
		out = append(out, one[0])
	}
	return out, nil
}

func (t *tx) SharesHostedBy(ctx context.Context, agent string) ([]string, error) {
	return sharesHostedBy(ctx, t.t, agent)
}

func (t *tx) SharesOfAccount(ctx context.Context, account string) ([]string, error) {
	return queryIDs(ctx, t.t, "SELECT id::text FROM share WHERE account_id = $1 AND deleted_at IS NULL ORDER BY id", account)
}

func (t *tx) insertHosts(ctx context.Context, id string, role hosting.Role, agents []string, now time.Time, by string) error {
	for _, a := range agents {
		if _, err := t.t.Exec(ctx, "INSERT INTO host (share_id, agent_id, role, created_at, updated_at, created_by, updated_by) VALUES ($1, $2, $3, $4, $4, $5, $5)", id, a, string(role), now, by); err != nil {
			return storeErr(err)
		}
	}
	return nil
}

func (t *tx) Create(ctx context.Context, s hosting.Share) error {
	if !hosting.ValidUUID(s.ID) {
		return fmt.Errorf("%w: share id %q is not a lowercase UUID", hosting.ErrStore, s.ID)
	}
	_, err := t.t.Exec(ctx, `INSERT INTO share (id, account_id, name, kind, target_address, target_port, created_at, updated_at, created_by, updated_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), nullif($10, ''))`, s.ID, s.AccountID, s.Name, string(s.Kind), s.TargetAddress, int32(s.TargetPort), s.CreatedAt, s.UpdatedAt, s.CreatedBy, s.UpdatedBy)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" {
		return fmt.Errorf("%w: %s", hosting.ErrExists, s.ID)
	}
	if err != nil {
		return storeErr(err)
	}
	t.locked[s.ID] = true
	if err := t.insertHosts(ctx, s.ID, hosting.Active, s.Hosts.Active, s.CreatedAt, s.CreatedBy); err != nil {
		return err
	}
	if err := t.insertHosts(ctx, s.ID, hosting.Passive, s.Hosts.Passive, s.CreatedAt, s.CreatedBy); err != nil {
		return err
	}
	t.hosts[s.ID] = s.Hosts.Clone()
	return nil
}

func (t *tx) Save(ctx context.Context, s hosting.Share, now time.Time) error {
	if !t.locked[s.ID] {
		return fmt.Errorf("%w: save of share %s that this transaction did not lock", hosting.ErrStore, s.ID)
	}
	by := s.UpdatedBy
	if _, err := t.t.Exec(ctx, `UPDATE share SET name = $2, target_address = $3, target_port = $4, updated_at = $5, updated_by = nullif($6, '') WHERE id = $1`,
		s.ID, s.Name, s.TargetAddress, int32(s.TargetPort), now, by); err != nil {
		return storeErr(err)
	}
	old, ok := t.hosts[s.ID]
	if !ok {
		cur := []hosting.Share{{ID: s.ID}}
		if err := withHosts(ctx, t.t, cur, true); err != nil {
			return storeErr(err)
		}
		old = cur[0].Hosts
	}
	// Until every write below succeeded, the rows are unknown here: a
	// failed statement aborts the transaction anyway.
	delete(t.hosts, s.ID)
	for _, a := range old.All() {
		was, _ := old.RoleOf(a)
		now2, still := s.Hosts.RoleOf(a)
		switch {
		case !still:
			_, err := t.t.Exec(ctx, "UPDATE host SET deleted_at = $3, updated_at = $3, deleted_by = $4, updated_by = $4 WHERE share_id = $1 AND agent_id = $2 AND deleted_at IS NULL", s.ID, a, now, by)
			if err != nil {
				return storeErr(err)
			}
		case was != now2:
			_, err := t.t.Exec(ctx, "UPDATE host SET role = $3, updated_at = $4, updated_by = $5 WHERE share_id = $1 AND agent_id = $2 AND deleted_at IS NULL", s.ID, a, string(now2), now, by)
			if err != nil {
				return storeErr(err)
			}
		}
	}
	for _, role := range []hosting.Role{hosting.Active, hosting.Passive} {
		ids := s.Hosts.Active
		if role == hosting.Passive {
			ids = s.Hosts.Passive
		}
		var add []string
		for _, a := range ids {
			if _, ok := old.RoleOf(a); !ok {
				add = append(add, a)
			}
		}
		if err := t.insertHosts(ctx, s.ID, role, add, now, by); err != nil {
			return err
		}
	}
	t.hosts[s.ID] = s.Hosts.Clone()
	return nil
}

func (t *tx) Delete(ctx context.Context, id string, now time.Time, by string) error {
	if !t.locked[id] {
		return fmt.Errorf("%w: delete of share %s that this transaction did not lock", hosting.ErrStore, id)
	}
	_, err := t.t.Exec(ctx, `UPDATE share SET deleted_at = COALESCE(deleted_at, $2), updated_at = $2,
		deleted_by = COALESCE(deleted_by, nullif($3, '')), updated_by = nullif($3, '') WHERE id = $1 AND deleted_at IS NULL`, id, now, by)
	return storeErr(err)
}

// AddEvents implements hosting.OutboxTx: the events go into the outbox
// table in this transaction.
func (t *tx) AddEvents(ctx context.Context, msgs []hosting.EventMessage) error {
	for _, m := range msgs {
		if !hosting.ValidUUID(m.ID) {
			return fmt.Errorf("%w: event id %q is not a lowercase UUID", hosting.ErrStore, m.ID)
		}
		if _, err := t.t.Exec(ctx, "INSERT INTO outbox (event_id, routing_key, body, occurred_at) VALUES ($1, $2, $3, $4)",
			m.ID, m.RoutingKey, m.Body, m.OccurredAt); err != nil {
			return storeErr(err)
		}
	}
	return nil
}

// ClaimEvent implements hosting.IntakeTx: an insert into the inbox that
// waits, on the primary key, for another transaction that claimed the
// same id, and reports false once that one committed.
func (t *tx) ClaimEvent(ctx context.Context, id, routingKey string, at time.Time) (bool, error) {
	tag, err := t.t.Exec(ctx, "INSERT INTO inbox (event_id, routing_key, occurred_at) VALUES ($1, $2, $3) ON CONFLICT (event_id) DO NOTHING", id, routingKey, at)
	if err != nil {
		return false, storeErr(err)
	}
	return tag.RowsAffected() == 1, nil
}

// Handled implements hosting.IntakeTx.
func (t *tx) Handled(ctx context.Context, id string) (bool, error) {
	var done bool
	if err := t.t.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM inbox WHERE event_id = $1)", id).Scan(&done); err != nil {
		return false, storeErr(err)
	}
	return done, nil
}

// ApplyAgent implements hosting.IntakeTx, in one statement: the row is
// written unless it is deleted or holds a newer event.
func (t *tx) ApplyAgent(ctx context.Context, a hosting.Agent, at time.Time) (bool, error) {
	if a.ID == "" {
		return false, fmt.Errorf("%w: agent without id", hosting.ErrStore)
	}
	var tag pgconn.CommandTag
	var err error
	if a.Deleted {
		tag, err = t.t.Exec(ctx, `INSERT INTO agent (id, account_id, deleted_at, event_at) VALUES ($1, $2, $3, $3)
			ON CONFLICT (id) DO UPDATE SET deleted_at = EXCLUDED.deleted_at, event_at = GREATEST(agent.event_at, EXCLUDED.event_at)
			WHERE agent.deleted_at IS NULL`, a.ID, a.AccountID, at)
	} else {
		tag, err = t.t.Exec(ctx, `INSERT INTO agent (id, account_id, event_at) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO UPDATE SET account_id = EXCLUDED.account_id, event_at = EXCLUDED.event_at
			WHERE agent.deleted_at IS NULL AND (agent.event_at IS NULL OR agent.event_at < EXCLUDED.event_at)`, a.ID, a.AccountID, at)
	}
	if err != nil {
		return false, storeErr(err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteAgentsOfAccount implements hosting.IntakeTx.
func (t *tx) DeleteAgentsOfAccount(ctx context.Context, account string, at time.Time) error {
	_, err := t.t.Exec(ctx, "UPDATE agent SET deleted_at = $2, event_at = GREATEST(event_at, $2) WHERE account_id = $1 AND deleted_at IS NULL", account, at)
	return storeErr(err)
}

// LiveShareIDs implements hosting.IntakeTx.
func (t *tx) LiveShareIDs(ctx context.Context) ([]string, error) {
	return queryIDs(ctx, t.t, "SELECT id::text FROM share WHERE deleted_at IS NULL ORDER BY id")
}

// PruneInbox deletes the inbox rows handled before before, and returns
// how many went. An event redelivered after its row was pruned would be
// applied again, so the retention must exceed the longest redelivery
// (the daemon keeps seven days).
func (s *Store) PruneInbox(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, "DELETE FROM inbox WHERE handled_at < $1", before)
	if err != nil {
		return 0, storeErr(err)
	}
	return tag.RowsAffected(), nil
}

// Pending implements hosting.Outbox.
func (s *Store) Pending(ctx context.Context, limit int) ([]hosting.OutboxEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT seq, event_id::text, routing_key, body, occurred_at FROM outbox
		WHERE published_at IS NULL ORDER BY seq LIMIT $1`, limit)
	if err != nil {
		return nil, storeErr(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (hosting.OutboxEntry, error) {
		var e hosting.OutboxEntry
		err := r.Scan(&e.Seq, &e.ID, &e.RoutingKey, &e.Body, &e.OccurredAt)
		return e, err
	})
	return out, storeErr(err)
}

// MarkPublished implements hosting.Outbox.
func (s *Store) MarkPublished(ctx context.Context, seqs []int64, at time.Time) error {
	_, err := s.pool.Exec(ctx, "UPDATE outbox SET published_at = $2 WHERE seq = ANY($1) AND published_at IS NULL", seqs, at)
	return storeErr(err)
}

// ReconcilerLockKey is the key of the PostgreSQL advisory lock that one
// reconciler of a deployment (of a database) holds at a time.
const ReconcilerLockKey int64 = 0x7669706b69740001 // "vipkit" and 1

var _ hosting.ReconcileLocker = (*Store)(nil)

// TryLockReconciler implements hosting.ReconcileLocker with a session
// advisory lock (pg_try_advisory_lock) on a connection taken from the
// pool and kept until unlock. A replica that dies ends its session, and
// the server releases the lock with it. unlock releases the lock and
// returns the connection; when the release fails, it closes the
// connection, which releases the lock too. The pass holds that connection
// while its transactions take others: the pool needs at least two.
func (s *Store) TryLockReconciler(ctx context.Context) (func(), bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, storeErr(err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", ReconcilerLockKey).Scan(&ok); err != nil {
		conn.Release()
		return nil, false, storeErr(err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var released bool
		if err := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", ReconcilerLockKey).Scan(&released); err != nil || !released {
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}, true, nil
}

// RelayLockKey is the key of the PostgreSQL advisory lock that the one
// outbox relay of a database holds.
const RelayLockKey int64 = 0x7669706b69740002 // "vipkit" and 2

var _ hosting.RelayLocker = (*Store)(nil)

// advisoryLock is a session advisory lock on a connection kept from the
// pool until Unlock.
type advisoryLock struct {
	conn *pgxpool.Conn
	key  int64
}

// TryLockRelay implements hosting.RelayLocker with a session advisory
// lock (pg_try_advisory_lock) on a connection of its own. A relay that
// dies ends its session, and the server releases the lock with it; Held
// asks the server whether this session still holds it.
func (s *Store) TryLockRelay(ctx context.Context) (hosting.RelayLock, bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, storeErr(err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", RelayLockKey).Scan(&ok); err != nil {
		conn.Release()
		return nil, false, storeErr(err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return &advisoryLock{conn: conn, key: RelayLockKey}, true, nil
}

// Held implements hosting.RelayLock.
func (l *advisoryLock) Held(ctx context.Context) error {
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
		AND ((classid::bigint << 32) | objid::bigint) = $1)`, l.key).Scan(&held)
	if err != nil {
		return storeErr(err)
	}
	if !held {
		return fmt.Errorf("%w: the relay lock is not held", hosting.ErrStore)
	}
	return nil
}

// Unlock implements hosting.RelayLock; when the release fails it closes
// the connection, which releases the lock too.
func (l *advisoryLock) Unlock() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var released bool
	if err := l.conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", l.key).Scan(&released); err != nil || !released {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
}
