package hosting

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/vipkit/vipkit/hosting/internal/failpoint"
	"github.com/vipkit/vipkit/transport"
)

// EventType is the type of a share event.
type EventType string

// The share events.
const (
	EventUpdated EventType = "UPDATED"
	EventDeleted EventType = "DELETED"
)

// Event tells other services that a share changed.
type Event struct {
	ID    string // a UUID, the message id on the bus
	Type  EventType
	Share Share     // the share after the change (a deleted share keeps its hosts)
	At    time.Time // when the change was made
}

// Publisher sends share events. Publish is called after the transaction
// that made the change committed, once per changed share.
type Publisher interface {
	Publish(ctx context.Context, e Event) error
}

// View is a share as the API returns it. Hosting is set only by a single
// read (Service.Get) when the controller answered; listings never carry it.
type View struct {
	Share
	ActiveAgentIDs  []string `json:"activeAgentIds"`
	PassiveAgentIDs []string `json:"passiveAgentIds"`
	Hosting         *Hosting `json:"hosting,omitempty"`
}

func viewOf(s Share) View {
	return View{Share: s, ActiveAgentIDs: s.Hosts.Clone().Active, PassiveAgentIDs: s.Hosts.Clone().Passive}
}

// Options configure a Service.
type Options struct {
	Store      Store       // required
	Projection *Projection // required
	Publisher  Publisher   // nil publishes nothing
	Clock      transport.Clock
	Validator  Validator
	// Network gates the Ziti clean-up of a share delete; nil always cleans
	// up.
	Network NetworkAvailability
	// Ingress is the TCP shares' ingress; nil means they have none.
	Ingress Ingress
	// Outbox writes each change's events into the store's outbox in the
	// change's transaction (the store's Tx must implement OutboxTx), for
	// a relay to publish (hosting/events); Publisher is then not called.
	Outbox bool
	// OnOutbox, when set, is called after a commit that wrote outbox
	// events (events.Relay.Kick, so that the relay publishes at once
	// rather than at its next poll). It must not block.
	OnOutbox func()
	// OnDrift, when set, is called when a compensation in Ziti failed,
	// so that Ziti may hold what the store does not (Reconciler.Kick).
	// It must not block.
	OnDrift func()
}

// Service holds the share-host logic: validated create, update (PUT and
// PATCH), dry run and delete, the agent and account cascades, and single
// reads with the hosting status. Every path that changes a share locks the
// share and its hosts first, in id order, and decides from what it read
// under the lock; Ziti is written inside that transaction, and a failed
// transaction is compensated in Ziti with the reverse update.
//
// A Service is safe for concurrent use.
type Service struct {
	st   Store
	pr   *Projection
	pub  Publisher
	clk  transport.Clock
	val  Validator
	net  NetworkAvailability
	ing  Ingress
	box  bool
	kick func()
	drft func()
}

// NewService returns a service. It fails when Store or Projection is nil.
func NewService(o Options) (*Service, error) {
	if o.Store == nil || o.Projection == nil {
		return nil, fmt.Errorf("%w: a service needs a store and a projection", ErrInvalidOptions)
	}
	return &Service{st: o.Store, pr: o.Projection, pub: o.Publisher, clk: transport.Or(o.Clock), val: o.Validator, net: o.Network, ing: o.Ingress, box: o.Outbox, kick: o.OnOutbox, drft: o.OnDrift}, nil
}

// NewID returns a random (version 4) UUID.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func (sv *Service) publish(ctx context.Context, evs []Event) error {
	if sv.pub == nil {
		return nil
	}
	var errs []error
	for _, e := range evs {
		if err := sv.pub.Publish(ctx, e); err != nil {
			errs = append(errs, fmt.Errorf("hosting: publish %s %s: %w", e.Type, e.Share.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Create validates and stores a new share (s.ID may be empty: a UUID is
// made) with the hosts of u applied as a PUT, and projects it onto Ziti.
func (sv *Service) Create(ctx context.Context, s Share, u Update) (Share, error) {
	u.Method = Put
	if !u.Active.Present {
		u.Active = Of() // a create's omitted list is empty: rule 1 reports it
	}
	next, err := u.ApplyTo(s)
	if err != nil {
		return Share{}, err
	}
	if next.ID == "" {
		next.ID = NewID()
	}
	now := sv.clk.Now()
	next.CreatedAt, next.UpdatedAt, next.DeletedAt = now, now, time.Time{}
	by := PrincipalOf(ctx)
	next.CreatedBy, next.UpdatedBy, next.DeletedBy = by, by, ""
	projected := false
	err = sv.st.InTx(ctx, func(ctx context.Context, tx Tx) error {
		if err := sv.val.Validate(ctx, next, tx); err != nil {
			return err
		}
		if err := tx.Create(ctx, next); err != nil {
			return err
		}
		if err := sv.pr.Project(ctx, next); err != nil {
			return err
		}
		projected = true
		return failpoint.Eval(failpoint.BeforeCommit)
	})
	if err != nil {
		if projected {
			cerr := sv.pr.DeProject(context.WithoutCancel(ctx), next)
			sv.drifted(cerr)
			err = errors.Join(err, cerr)
		} else if errors.Is(err, errCompensation) {
			sv.drifted(err) // Project's own clean-up failed
		}
		return Share{}, err
	}
	return next, nil
}

// DryRun validates the share that u would make of share id, writing
// nothing. It reports the same violations as Update.
func (sv *Service) DryRun(ctx context.Context, id string, u Update) error {
	cur, err := sv.st.Get(ctx, id)
	if err != nil {
		return err
	}
	if !cur.Live() {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	next, err := u.ApplyTo(cur)
	if err != nil {
		return err
	}
	return sv.val.Validate(ctx, next, sv.st)
}

// DryRunCreate validates the share that Create(ctx, s, u) would make,
// writing nothing.
func (sv *Service) DryRunCreate(ctx context.Context, s Share, u Update) error {
	u.Method = Put
	if !u.Active.Present {
		u.Active = Of()
	}
	next, err := u.ApplyTo(s)
	if err != nil {
		return err
	}
	return sv.val.Validate(ctx, next, sv.st)
}

// deletedAgents returns which of the agents are deleted (or unknown).
func deletedAgents(ctx context.Context, l AgentLookup, agents []string) (map[string]bool, error) {
	found, err := l.Agents(ctx, agents)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, a := range agents {
		if ag, ok := found[a]; !ok || ag.Deleted {
			out[a] = true
		}
	}
	return out, nil
}

func union(a, b Hosts) []string { return normalize(append(a.All(), b.All()...)) }

func sameShare(a, b Share) bool {
	return a.Name == b.Name && a.TargetAddress == b.TargetAddress && a.TargetPort == b.TargetPort && a.Hosts.Equal(b.Hosts)
}

// change is one share changed inside a transaction, for compensation and
// events.
type change struct {
	prev, next Share
	deleted    map[string]bool
	skipBroken bool // the update skipped broken hosts (a cascade)
	removed    bool // the share was deleted
	skipped    bool // ... and its Ziti objects left alone (network gone)
}

// drifted tells OnDrift of a failed compensation.
func (sv *Service) drifted(cerr error) {
	if cerr != nil && sv.drft != nil {
		sv.drft()
	}
}

// compensate reverts the Ziti side of changes, newest first.
func (sv *Service) compensate(ctx context.Context, done []change) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for i := len(done) - 1; i >= 0; i-- {
		c := done[i]
		if c.skipped {
			continue
		}
		if c.removed {
			errs = append(errs, sv.pr.Project(ctx, c.prev))
		} else {
			_, err := sv.pr.UpdateWith(ctx, c.next, c.prev, UpdateOptions{Deleted: c.deleted, SkipBroken: c.skipBroken})
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// update changes one locked share from cur to next, in tx. With
// skipBroken (the cascades), a passive whose identity cannot be resolved
// does not fail it (UpdateOptions.SkipBroken).
func (sv *Service) update(ctx context.Context, tx Tx, cur, next Share, skipBroken bool, done *[]change) error {
	next.UpdatedBy = PrincipalOf(ctx)
	if err := tx.Save(ctx, next, sv.clk.Now()); err != nil {
		return err
	}
	deleted, err := deletedAgents(ctx, tx, union(cur.Hosts, next.Hosts))
	if err != nil {
		return err
	}
	o := UpdateOptions{Deleted: deleted, SkipBroken: skipBroken}
	if _, err := sv.pr.UpdateWith(ctx, cur, next, o); err != nil {
		_, cerr := sv.pr.UpdateWith(context.WithoutCancel(ctx), next, cur, o)
		sv.drifted(cerr)
		return errors.Join(err, cerr)
	}
	*done = append(*done, change{prev: cur, next: next, deleted: deleted, skipBroken: skipBroken})
	return nil
}

// remove deletes one locked share: it refuses while the share's ingress is
// up, removes its Ziti objects unless the network gate says there is
// nothing to clean up, and soft-deletes it.
func (sv *Service) remove(ctx context.Context, tx Tx, cur Share, done *[]change) error {
	if sv.ing != nil && cur.Kind == KindTCP {
		up, err := sv.ing.Up(ctx, cur)
		if err != nil {
			return err
		}
		if up {
			return fmt.Errorf("%w: share %s", ErrIngressUp, cur.ID)
		}
	}
	cleanup := true
	if sv.net != nil {
		var err error
		if cleanup, err = sv.net.ShouldCleanupZiti(ctx, cur); err != nil {
			return err
		}
	}
	if cleanup {
		if err := sv.pr.DeProject(ctx, cur); err != nil {
			return err
		}
		*done = append(*done, change{prev: cur, next: cur, removed: true})
	} else {
		*done = append(*done, change{prev: cur, next: cur, removed: true, skipped: true})
	}
	now, by := sv.clk.Now(), PrincipalOf(ctx)
	if err := tx.Delete(ctx, cur.ID, now, by); err != nil {
		return err
	}
	n := &(*done)[len(*done)-1].next
	n.DeletedAt, n.UpdatedAt, n.DeletedBy, n.UpdatedBy = now, now, by, by
	return nil
}

// tearDownIngress tears down the ingress of the live TCP shares in ss,
// before a transaction that may delete them.
func (sv *Service) tearDownIngress(ctx context.Context, ss []Share) error {
	if sv.ing == nil {
		return nil
	}
	for _, s := range ss {
		if s.Live() && s.Kind == KindTCP {
			if err := sv.ing.TearDown(ctx, s); err != nil {
				return fmt.Errorf("hosting: tear down the ingress of share %s: %w", s.ID, err)
			}
		}
	}
	return nil
}

// run runs fn in a transaction, compensates Ziti when it fails (or its
// commit does), and publishes one event per changed share after commit.
func (sv *Service) run(ctx context.Context, fn func(ctx context.Context, tx Tx, done *[]change) error) ([]Event, error) {
	var done []change
	var evs []Event
	err := sv.st.InTx(ctx, func(ctx context.Context, tx Tx) error {
		done, evs = done[:0], nil
		if skip, err := claimIntake(ctx, tx); err != nil || skip {
			return err // skip: the event's effect committed before
		}
		if err := fn(ctx, tx, &done); err != nil {
			return err
		}
		evs = sv.eventsOf(done)
		if !sv.box || len(evs) == 0 {
			return failpoint.Eval(failpoint.BeforeCommit)
		}
		ob, ok := tx.(OutboxTx)
		if !ok {
			return fmt.Errorf("%w: the store's transactions hold no outbox", ErrStore)
		}
		msgs := make([]EventMessage, 0, len(evs))
		for _, e := range evs {
			m, err := e.Message()
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		if err := ob.AddEvents(ctx, msgs); err != nil {
			return err
		}
		return failpoint.Eval(failpoint.BeforeCommit)
	})
	if err != nil {
		cerr := sv.compensate(ctx, done)
		sv.drifted(cerr)
		return nil, errors.Join(err, cerr)
	}
	if sv.box {
		if sv.kick != nil && len(evs) > 0 {
			sv.kick()
		}
		return evs, nil
	}
	return evs, sv.publish(ctx, evs)
}

// Update applies u (PUT or PATCH) to share id: it locks the share, merges,
// validates, stores and patches Ziti. An update that changes nothing writes
// nothing and returns before Ziti.
func (sv *Service) Update(ctx context.Context, id string, u Update) (Share, error) {
	var out Share
	_, err := sv.run(ctx, func(ctx context.Context, tx Tx, done *[]change) error {
		locked, err := tx.Lock(ctx, id)
		if err != nil {
			return err
		}
		cur := locked[0]
		if !cur.Live() {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		next, err := u.ApplyTo(cur)
		if err != nil {
			return err
		}
		if err := sv.val.Validate(ctx, next, tx); err != nil {
			return err
		}
		out = cur
		if sameShare(cur, next) {
			return nil
		}
		if err := sv.update(ctx, tx, cur, next, false, done); err != nil {
			return err
		}
		out = next
		return nil
	})
	if err != nil {
		return Share{}, err
	}
	return out, nil
}

// Delete locks and soft-deletes share id and removes its Ziti objects:
// policies, service, configs (unless the network gate says the network is
// gone). A TCP share's ingress is torn down first, outside the transaction.
func (sv *Service) Delete(ctx context.Context, id string) error {
	if sv.ing != nil {
		s, err := sv.st.Get(ctx, id)
		if err != nil {
			return err
		}
		if err := sv.tearDownIngress(ctx, []Share{s}); err != nil {
			return err
		}
	}
	_, err := sv.run(ctx, func(ctx context.Context, tx Tx, done *[]change) error {
		locked, err := tx.Lock(ctx, id)
		if err != nil {
			return err
		}
		if !locked[0].Live() {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return sv.remove(ctx, tx, locked[0], done)
	})
	return err
}

// RemoveDeletedAgent is the cascade of an agent's deletion, in one
// transaction for every share the agent hosts (live host rows only, so a
// redelivery does nothing): the agent leaves each share; if no active
// remains and passives do, every passive is promoted; if no host remains,
// the share is deleted. The cascade is per host: another host of the same
// share that is broken in Ziti (a live passive with no identity, or with
// several) does not fail it. That host gets no override and stays off the
// bind policy, and the share's hosting status reports its Problem; the
// share's next API update heals it or fails on it. Before the transaction it tears down the ingress of
// the shares the agent hosts alone, from an unlocked read; a share that
// became the agent's alone since is refused with ErrIngressUp, and the
// retry of the whole call tears it down. It returns the events it
// published.
func (sv *Service) RemoveDeletedAgent(ctx context.Context, agent string) ([]Event, error) {
	return sv.cascade(ctx,
		func(ctx context.Context) ([]Share, error) { return sv.st.FindLiveHostedOnlyBy(ctx, agent) },
		func(ctx context.Context, tx Tx) ([]string, error) { return tx.SharesHostedBy(ctx, agent) },
		func(ctx context.Context, tx Tx, cur Share, done *[]change) error {
			if _, hosts := cur.Hosts.RoleOf(agent); !cur.Live() || !hosts {
				return nil // changed before we got the lock
			}
			rest, _ := cur.Hosts.Without(agent)
			if rest.Empty() {
				return sv.remove(ctx, tx, cur, done)
			}
			next := cur.Clone()
			next.Hosts = rest
			return sv.update(ctx, tx, cur, next, true, done)
		})
}

// RemoveAccount deletes every share of an account, under the same locks,
// tearing their ingress down first.
func (sv *Service) RemoveAccount(ctx context.Context, account string) ([]Event, error) {
	return sv.cascade(ctx,
		func(ctx context.Context) ([]Share, error) { return sv.st.Find(ctx, Filter{AccountID: account}) },
		func(ctx context.Context, tx Tx) ([]string, error) { return tx.SharesOfAccount(ctx, account) },
		func(ctx context.Context, tx Tx, cur Share, done *[]change) error {
			if !cur.Live() || cur.AccountID != account {
				return nil
			}
			return sv.remove(ctx, tx, cur, done)
		})
}

// cascade changes many shares in one transaction. When the service has an
// ingress, it first tears down the ingress of the shares that unlocked
// reads, outside the transaction. In the transaction it locks the shares
// whose ids ids lists and passes each, locked, to step, which checks that
// the share still qualifies and changes it. It returns the events
// published.
func (sv *Service) cascade(ctx context.Context,
	unlocked func(ctx context.Context) ([]Share, error),
	ids func(ctx context.Context, tx Tx) ([]string, error),
	step func(ctx context.Context, tx Tx, cur Share, done *[]change) error,
) ([]Event, error) {
	if sv.ing != nil {
		if done, err := sv.handledIntake(ctx); err != nil || done {
			return nil, err
		}
		ss, err := unlocked(ctx)
		if err != nil {
			return nil, err
		}
		if err := sv.tearDownIngress(ctx, ss); err != nil {
			return nil, err
		}
	}
	return sv.run(ctx, func(ctx context.Context, tx Tx, done *[]change) error {
		list, err := ids(ctx, tx)
		if err != nil || len(list) == 0 {
			return err
		}
		locked, err := tx.Lock(ctx, list...)
		if err != nil {
			return err
		}
		for i, cur := range locked {
			if err := step(ctx, tx, cur, done); err != nil {
				return err
			}
			if i < len(locked)-1 {
				if err := failpoint.Eval(failpoint.CascadeStep); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// eventsOf makes one event per changed share.
func (sv *Service) eventsOf(done []change) []Event {
	var out []Event
	now := sv.clk.Now()
	for _, c := range done {
		t := EventUpdated
		if c.removed {
			t = EventDeleted
		}
		out = append(out, Event{ID: NewID(), Type: t, Share: c.next, At: now})
	}
	return out
}

// Get reads one share with its hosting status. The status is absent when
// the share is deleted or the controller cannot be asked.
func (sv *Service) Get(ctx context.Context, id string) (View, error) {
	s, err := sv.st.Get(ctx, id)
	if err != nil {
		return View{}, err
	}
	v := viewOf(s)
	if s.Live() {
		if h, err := sv.pr.Status(ctx, s); err == nil {
			v.Hosting = h
		}
	}
	return v, nil
}

// List lists live shares; views never carry the hosting block.
func (sv *Service) List(ctx context.Context, f Filter) ([]View, error) {
	ss, err := sv.st.Find(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]View, 0, len(ss))
	for _, s := range ss {
		out = append(out, viewOf(s))
	}
	return out, nil
}

// Store returns the service's store.
func (sv *Service) Store() Store { return sv.st }
