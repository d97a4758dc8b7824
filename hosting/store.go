package hosting

import (
	"context"
	"time"
)

// Store holds shares and their host rows, and the agents they name. The SQL
// implementation is package hosting/pgstore (PostgreSQL); MemStore keeps the
// same contract in memory; hosting/storetest is the contract suite both pass.
//
// Implementations are safe for concurrent use.
type Store interface {
	AgentLookup

	// InTx runs fn in one transaction at READ COMMITTED, committing when fn
	// returns nil and rolling back otherwise. fn may run more than once only
	// if the implementation documents it; these do not retry.
	InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error

	// Get reads a share without locking it. A deleted share reads back with
	// the hosts it had. A missing id is ErrNotFound.
	Get(ctx context.Context, id string) (Share, error)

	// Find lists the live shares that match f, by id, from live host rows.
	Find(ctx context.Context, f Filter) ([]Share, error)

	// SharesHostedBy lists the ids of the live shares that agent hosts in
	// either role (live host rows only), sorted.
	SharesHostedBy(ctx context.Context, agent string) ([]string, error)

	// FindLiveHostedOnlyBy lists the live shares whose only host is agent.
	FindLiveHostedOnlyBy(ctx context.Context, agent string) ([]Share, error)

	// PutAgent creates or replaces an agent row.
	PutAgent(ctx context.Context, a Agent) error
}

// Filter selects live shares. Empty fields match everything.
type Filter struct {
	AccountID      string
	Kind           Kind   // a share kind
	AgentID        string // a host in either role
	ActiveAgentID  string // an active host
	PassiveAgentID string // a passive host
}

// Tx is a store transaction at READ COMMITTED. Every path that changes a
// share locks it first with Lock and decides from what Lock read. A Tx is
// used by one goroutine.
type Tx interface {
	AgentLookup

	// Lock locks the shares and their host rows (SELECT … FOR UPDATE) in id
	// order, whatever the order of ids, and returns them sorted by id as
	// they are after every earlier writer committed. Deleted shares are
	// locked and returned too (callers check Live). A missing id is
	// ErrNotFound. A transaction at any other isolation level than READ
	// COMMITTED is refused with ErrIsolation.
	Lock(ctx context.Context, ids ...string) ([]Share, error)

	// SharesHostedBy is Store.SharesHostedBy inside the transaction.
	SharesHostedBy(ctx context.Context, agent string) ([]string, error)

	// SharesOfAccount lists the ids of the live shares of an account, sorted.
	SharesOfAccount(ctx context.Context, account string) ([]string, error)

	// Create inserts a share and its host rows, locked until the end of the
	// transaction, recording s.CreatedBy and s.UpdatedBy. An id in use
	// (live or deleted) is ErrExists.
	Create(ctx context.Context, s Share) error

	// Save writes a locked share's fields and its hosts, by difference:
	// host rows of agents that left are soft-deleted at now, new agents get
	// rows, role changes update the row; every row it writes records
	// s.UpdatedBy as the principal.
	Save(ctx context.Context, s Share, now time.Time) error

	// Delete soft-deletes a locked share at now, by the principal by. Its
	// host rows stay, so the share reads back with the hosts it had.
	Delete(ctx context.Context, id string, now time.Time, by string) error
}
