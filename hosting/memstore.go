package hosting

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
)

// MemStore is an in-memory Store with the same contract as the SQL store:
// per-share locks held to the end of the transaction, taken in id order,
// and READ COMMITTED visibility (a transaction's writes are seen by others
// only once it commits). It passes hosting/storetest's suite.
//
// The zero value is not usable; make one with NewMemStore. It is safe for
// concurrent use.
type MemStore struct {
	// mu guards every field below.
	mu syncx.Mutex
	// +checklocks:mu
	shares map[string]Share
	// +checklocks:mu
	agents map[string]Agent
	// locks holds one token per share id.
	// +checklocks:mu
	locks map[string]chan struct{}
	// +checklocks:mu
	outbox []OutboxEntry
	// +checklocks:mu
	pubAt map[int64]time.Time
	// +checklocks:mu
	closed bool
	// inbox holds the ids of the consumed events whose effect committed.
	// +checklocks:mu
	inbox map[string]bool
	// agentAt is the time of the last event applied to each agent.
	// +checklocks:mu
	agentAt map[string]time.Time
}

var (
	_ Store    = (*MemStore)(nil)
	_ Outbox   = (*MemStore)(nil)
	_ IntakeTx = (*memTx)(nil)
)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{shares: map[string]Share{}, agents: map[string]Agent{}, locks: map[string]chan struct{}{}, inbox: map[string]bool{}, agentAt: map[string]time.Time{}}
}

// Close makes every later call fail with ErrClosed.
func (m *MemStore) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

// +checklocks:m.mu
func (m *MemStore) check() error {
	if m.closed {
		return ErrClosed
	}
	return nil
}

// Agents implements AgentLookup.
func (m *MemStore) Agents(ctx context.Context, ids []string) (map[string]Agent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	out := map[string]Agent{}
	for _, id := range ids {
		if a, ok := m.agents[id]; ok {
			out[id] = a
		}
	}
	return out, nil
}

// PutAgent implements Store.
func (m *MemStore) PutAgent(ctx context.Context, a Agent) error {
	if a.ID == "" {
		return fmt.Errorf("%w: agent without id", ErrStore)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	m.agents[a.ID] = a
	return nil
}

// Get implements Store.
func (m *MemStore) Get(ctx context.Context, id string) (Share, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return Share{}, err
	}
	s, ok := m.shares[id]
	if !ok {
		return Share{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return s.Clone(), nil
}

func match(s Share, f Filter) bool {
	if !s.Live() || f.AccountID != "" && s.AccountID != f.AccountID || f.Kind != "" && s.Kind != f.Kind {
		return false
	}
	if _, ok := s.Hosts.RoleOf(f.AgentID); f.AgentID != "" && !ok {
		return false
	}
	if f.ActiveAgentID != "" {
		if r, ok := s.Hosts.RoleOf(f.ActiveAgentID); !ok || r != Active {
			return false
		}
	}
	if f.PassiveAgentID != "" {
		if r, ok := s.Hosts.RoleOf(f.PassiveAgentID); !ok || r != Passive {
			return false
		}
	}
	return true
}

// +checklocks:m.mu
func (m *MemStore) find(f Filter) []Share {
	var out []Share
	for _, id := range slices.Sorted(maps.Keys(m.shares)) {
		if s := m.shares[id]; match(s, f) {
			out = append(out, s.Clone())
		}
	}
	return out
}

// Find implements Store.
func (m *MemStore) Find(ctx context.Context, f Filter) ([]Share, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	return m.find(f), nil
}

func ids(ss []Share) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

// SharesHostedBy implements Store.
func (m *MemStore) SharesHostedBy(ctx context.Context, agent string) ([]string, error) {
	return m.sharesHostedBy(agent)
}

func (m *MemStore) sharesHostedBy(agent string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	if agent == "" {
		return []string{}, nil
	}
	return ids(m.find(Filter{AgentID: agent})), nil
}

// FindLiveHostedOnlyBy implements Store.
func (m *MemStore) FindLiveHostedOnlyBy(ctx context.Context, agent string) ([]Share, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var out []Share
	for _, s := range m.find(Filter{AgentID: agent}) {
		if s.Hosts.Len() == 1 {
			out = append(out, s)
		}
	}
	return out, nil
}

// InTx implements Store.
func (m *MemStore) InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) (err error) {
	m.mu.Lock()
	if err := m.check(); err != nil {
		m.mu.Unlock()
		return err
	}
	m.mu.Unlock()
	tx := &memTx{m: m, held: map[string]bool{}, writes: map[string]Share{}, agents: map[string]Agent{}, agentAt: map[string]time.Time{}}
	defer tx.release()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	for id, s := range tx.writes {
		m.shares[id] = s
	}
	for id, a := range tx.agents {
		m.agents[id] = a
	}
	maps.Copy(m.agentAt, tx.agentAt)
	for _, id := range tx.claims {
		m.inbox[id] = true
	}
	for _, msg := range tx.events {
		m.outbox = append(m.outbox, OutboxEntry{Seq: int64(len(m.outbox) + 1), EventMessage: msg})
	}
	return nil
}

// Pending implements Outbox.
func (m *MemStore) Pending(ctx context.Context, limit int) ([]OutboxEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var out []OutboxEntry
	for _, e := range m.outbox {
		if _, done := m.pubAt[e.Seq]; !done && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

// MarkPublished implements Outbox.
func (m *MemStore) MarkPublished(ctx context.Context, seqs []int64, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	if m.pubAt == nil {
		m.pubAt = map[int64]time.Time{}
	}
	for _, s := range seqs {
		if _, done := m.pubAt[s]; !done {
			m.pubAt[s] = at
		}
	}
	return nil
}

type memTx struct {
	m      *MemStore
	held   map[string]bool
	writes map[string]Share // committed at the end
	events []EventMessage   // committed at the end
	// agents, agentAt and claims are committed at the end.
	agents  map[string]Agent
	agentAt map[string]time.Time
	claims  []string
}

// AddEvents implements OutboxTx.
func (t *memTx) AddEvents(ctx context.Context, msgs []EventMessage) error {
	t.events = append(t.events, msgs...)
	return nil
}

func (t *memTx) release() {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	for id := range t.held {
		<-t.m.locks[id]
	}
	t.held = nil
}

func (t *memTx) lockOne(ctx context.Context, id string) error {
	if t.held[id] {
		return nil
	}
	t.m.mu.Lock()
	ch, ok := t.m.locks[id]
	if !ok {
		ch = make(chan struct{}, 1)
		t.m.locks[id] = ch
	}
	t.m.mu.Unlock()
	select {
	case ch <- struct{}{}:
		t.held[id] = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *memTx) read(id string) (Share, bool) {
	if s, ok := t.writes[id]; ok {
		return s.Clone(), true
	}
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	s, ok := t.m.shares[id]
	return s.Clone(), ok
}

func (t *memTx) Agents(ctx context.Context, ids []string) (map[string]Agent, error) {
	out, err := t.m.Agents(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if a, ok := t.agents[id]; ok {
			out[id] = a
		}
	}
	return out, nil
}

// inboxLock is the lock key of an event id (share ids are UUIDs, so the
// prefix keeps the two apart).
const inboxLock = "inbox:"

// ClaimEvent implements IntakeTx: it takes the event id's lock, held to
// the end of the transaction, then looks in the committed inbox.
func (t *memTx) ClaimEvent(ctx context.Context, id, routingKey string, at time.Time) (bool, error) {
	if err := t.lockOne(ctx, inboxLock+id); err != nil {
		return false, err
	}
	if slices.Contains(t.claims, id) {
		return false, nil
	}
	t.m.mu.Lock()
	done := t.m.inbox[id]
	t.m.mu.Unlock()
	if done {
		return false, nil
	}
	t.claims = append(t.claims, id)
	return true, nil
}

// Handled implements IntakeTx.
func (t *memTx) Handled(ctx context.Context, id string) (bool, error) {
	if slices.Contains(t.claims, id) {
		return true, nil
	}
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	return t.m.inbox[id], nil
}

// agentLock is the lock key of an agent row.
const agentLock = "agent:"

// ApplyAgent implements IntakeTx.
func (t *memTx) ApplyAgent(ctx context.Context, a Agent, at time.Time) (bool, error) {
	if a.ID == "" {
		return false, fmt.Errorf("%w: agent without id", ErrStore)
	}
	if err := t.lockOne(ctx, agentLock+a.ID); err != nil {
		return false, err
	}
	cur, err := t.Agents(ctx, []string{a.ID})
	if err != nil {
		return false, err
	}
	old, exists := cur[a.ID]
	last, ok := t.agentAt[a.ID]
	if !ok {
		t.m.mu.Lock()
		last = t.m.agentAt[a.ID]
		t.m.mu.Unlock()
	}
	switch {
	case exists && old.Deleted:
		return false, nil // deleted is final
	case a.Deleted:
		if exists && a.AccountID == "" {
			a.AccountID = old.AccountID
		}
	case exists && !last.IsZero() && !at.After(last):
		return false, nil // a newer event was applied
	}
	t.agents[a.ID] = a
	if at.After(last) {
		t.agentAt[a.ID] = at
	}
	return true, nil
}

// DeleteAgentsOfAccount implements IntakeTx.
func (t *memTx) DeleteAgentsOfAccount(ctx context.Context, account string, at time.Time) error {
	t.m.mu.Lock()
	var ids []string
	for id, a := range t.m.agents {
		if a.AccountID == account {
			ids = append(ids, id)
		}
	}
	t.m.mu.Unlock()
	for id, a := range t.agents {
		if a.AccountID == account && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, err := t.ApplyAgent(ctx, Agent{ID: id, AccountID: account, Deleted: true}, at); err != nil {
			return err
		}
	}
	return nil
}

// LiveShareIDs implements IntakeTx.
func (t *memTx) LiveShareIDs(ctx context.Context) ([]string, error) {
	return t.merged(Filter{}), nil
}

func (t *memTx) Lock(ctx context.Context, ids ...string) ([]Share, error) {
	sorted := slices.Sorted(slices.Values(ids))
	sorted = slices.Compact(sorted)
	out := make([]Share, 0, len(sorted))
	for _, id := range sorted {
		if err := t.lockOne(ctx, id); err != nil {
			return nil, err
		}
		s, ok := t.read(id)
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		out = append(out, s)
	}
	return out, nil
}

// merged returns the live shares as this transaction sees them.
func (t *memTx) merged(f Filter) []string {
	t.m.mu.Lock()
	all := maps.Clone(t.m.shares)
	t.m.mu.Unlock()
	maps.Copy(all, t.writes)
	var out []string
	for _, id := range slices.Sorted(maps.Keys(all)) {
		if match(all[id], f) {
			out = append(out, id)
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}

func (t *memTx) SharesHostedBy(ctx context.Context, agent string) ([]string, error) {
	if agent == "" {
		return []string{}, nil
	}
	return t.merged(Filter{AgentID: agent}), nil
}

func (t *memTx) SharesOfAccount(ctx context.Context, account string) ([]string, error) {
	if account == "" {
		return []string{}, nil
	}
	return t.merged(Filter{AccountID: account}), nil
}

func (t *memTx) Create(ctx context.Context, s Share) error {
	if s.ID == "" {
		return fmt.Errorf("%w: share without id", ErrStore)
	}
	if err := t.lockOne(ctx, s.ID); err != nil {
		return err
	}
	if _, ok := t.read(s.ID); ok {
		return fmt.Errorf("%w: %s", ErrExists, s.ID)
	}
	t.writes[s.ID] = s.Clone()
	return nil
}

func (t *memTx) Save(ctx context.Context, s Share, now time.Time) error {
	if !t.held[s.ID] {
		return fmt.Errorf("%w: save of share %s that this transaction did not lock", ErrStore, s.ID)
	}
	old, ok := t.read(s.ID)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, s.ID)
	}
	s = s.Clone()
	s.CreatedAt, s.DeletedAt, s.UpdatedAt = old.CreatedAt, old.DeletedAt, now
	s.CreatedBy, s.DeletedBy = old.CreatedBy, old.DeletedBy
	t.writes[s.ID] = s
	return nil
}

func (t *memTx) Delete(ctx context.Context, id string, now time.Time, by string) error {
	if !t.held[id] {
		return fmt.Errorf("%w: delete of share %s that this transaction did not lock", ErrStore, id)
	}
	s, ok := t.read(id)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if s.Live() {
		s.DeletedAt, s.UpdatedAt, s.DeletedBy, s.UpdatedBy = now, now, by, by
	}
	t.writes[id] = s
	return nil
}
