package hosting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Defaults of ReconcilerOptions.
const (
	DefaultReconcileInterval = 5 * time.Minute
	DefaultOrphanGrace       = 10 * time.Minute
	DefaultMaxRepairs        = 100
	// DefaultMinReconcileGap is the least time between two passes that
	// Kick starts, so that a burst of failed compensations makes one pass.
	DefaultMinReconcileGap = 10 * time.Second
	// DefaultMaxTrackedOrphans bounds the orphans whose first sighting
	// the reconciler remembers; one over it is held (HeldTracking) until
	// the others are gone.
	DefaultMaxTrackedOrphans = 10000
	// outboxScan is how many pending outbox entries a pass reads to learn
	// which shares they name; a full page holds every orphan (the outbox
	// may name more).
	outboxScan = 1000
)

// ReconcileLocker is a lock that one reconciler in a deployment holds at a
// time, across replicas (pgstore: a PostgreSQL advisory lock). A Store
// that implements it is used as the ReconcilerOptions.Locker when that is
// nil.
type ReconcileLocker interface {
	// TryLockReconciler takes the lock without waiting. ok is false when
	// another holder has it. unlock releases it and must be called once
	// when ok.
	TryLockReconciler(ctx context.Context) (unlock func(), ok bool, err error)
}

// ReconcilerOptions configure a Reconciler.
type ReconcilerOptions struct {
	Store      Store       // required
	Projection *Projection // required
	// Outbox, when set, is read each pass: an orphan of a share that a
	// pending entry names is never deleted (its transaction committed,
	// so the share is not an orphan for long, or it is the delete's own
	// event).
	Outbox Outbox
	// Locker is the lock across replicas; nil uses the Store's when it
	// implements ReconcileLocker, else a lock within this process.
	Locker ReconcileLocker
	Clock  transport.Clock
	// Interval is the time between periodic passes; 0 means
	// DefaultReconcileInterval.
	Interval time.Duration
	// MinGap is the least time between a pass and one Kick starts; 0
	// means DefaultMinReconcileGap.
	MinGap time.Duration
	// Grace is the least age of an orphan, counted from this
	// reconciler's first sighting of it, before it is deleted; another
	// replica may be creating it. 0 means DefaultOrphanGrace.
	Grace time.Duration
	// MaxRepairs bounds the repairs of one pass: the rate limit. A share
	// is repaired whole; once the bound is reached the drift of the
	// shares left is listed and held (HeldRateLimit) until the next
	// pass. 0 means DefaultMaxRepairs.
	MaxRepairs int
	// MaxTracked bounds the orphans whose first sighting is remembered
	// (the memory of the grace period); an orphan over it is held
	// (HeldTracking) until others are gone. 0 means
	// DefaultMaxTrackedOrphans.
	MaxTracked int
	// OnDrift, when set, is told of every drift a pass found (repaired,
	// held or broken), for logs and metrics. It must not block.
	OnDrift func(Drift)
	// OnError, when set, is told of a pass's failures. It must not block.
	OnError func(error)
	// WatchStates makes every pass (not a dry run) read each share's
	// hosting state after its repairs (Projection.Status), count the
	// shares per state (Report.States) and, when a share's state differs
	// from the one the previous pass saw, write a
	// HOSTING_STATE_CHANGED event into the outbox in the share's
	// transaction (when the store's Tx is an OutboxTx) and tell
	// OnStateChange. The first pass after start sees each state for the
	// first time and announces none.
	WatchStates bool
	// OnStateChange, when set, is told of each state change after its
	// transaction committed. It must not block.
	OnStateChange func(StateChange)
	// OnPass, when set, is told of each pass's report (not a dry run's).
	// It must not block.
	OnPass func(Report)
}

// Report is what one pass found and did.
type Report struct {
	// Locked is false when another reconciler held the lock: the pass
	// did nothing.
	Locked  bool     `json:"locked"`
	DryRun  bool     `json:"dryRun"`
	Shares  int      `json:"shares"` // live shares compared
	Drifts  []Drift  `json:"drifts"`
	Repairs int      `json:"repairs"` // writes made
	Held    int      `json:"held"`
	Errors  []string `json:"errors,omitempty"`
	// States counts the live shares by hosting state, with WatchStates;
	// StateUnknown counts those whose state could not be read.
	States map[State]int `json:"states,omitempty"`
}

// StateUnknown is the Report.States key of the shares whose hosting
// state could not be read (the controller failed).
const StateUnknown State = "UNKNOWN"

// ReconcileStats are a reconciler's counters since it was made.
type ReconcileStats struct {
	Passes  uint64 // passes made, dry runs not counted
	Skipped uint64 // passes that found the lock held elsewhere
	Repairs uint64
	Held    uint64
	Broken  uint64
	Errors  uint64
}

// Reconciler repairs drift between the store and Ziti: on start,
// periodically, and after a failed compensation (Kick). A pass takes the
// deployment's reconciler lock (one reconciler runs at a time), then for
// every live share locks its row, as every path that changes a share
// does, compares its Ziti objects with what the projection wants, and
// repairs them: stray or missing overrides, the standby config, names
// and host.v1 bodies, the bind policy's identities, the deployment tag.
// Then it deletes orphans: objects carrying this deployment's tag whose
// share is not live, once older than the grace period and not named in
// the outbox. Objects without the tag, or with another deployment's, are
// never deleted.
//
// A Reconciler is safe for concurrent use.
type Reconciler struct {
	st     Store
	pr     *Projection
	box    Outbox
	lk     ReconcileLocker
	clk    transport.Clock
	every  time.Duration
	gap    time.Duration
	grace  time.Duration
	max    int
	track  int
	onD    func(Drift)
	onE    func(error)
	watch  bool
	onS    func(StateChange)
	onP    func(Report)
	kick   chan struct{}
	passes atomic.Uint64
	skips  atomic.Uint64
	reps   atomic.Uint64
	held   atomic.Uint64
	brk    atomic.Uint64
	errs   atomic.Uint64
	// mu guards seen. It is never held while the store or Ziti is called.
	mu syncx.Mutex
	// seen maps an orphan object id to the time this reconciler first saw
	// it; entries go when the object is no longer an orphan.
	// +checklocks:mu
	seen map[string]time.Time
	// states maps a live share to the hosting state the last pass saw;
	// shares no pass lists any more are dropped.
	// +checklocks:mu
	states map[string]State
}

// NewReconciler checks the options and returns a reconciler.
func NewReconciler(o ReconcilerOptions) (*Reconciler, error) {
	if o.Store == nil || o.Projection == nil {
		return nil, fmt.Errorf("%w: a reconciler needs a store and a projection", ErrInvalidOptions)
	}
	if o.Interval < 0 || o.Grace < 0 || o.MinGap < 0 || o.MaxRepairs < 0 || o.MaxTracked < 0 {
		return nil, fmt.Errorf("%w: negative reconciler interval, gap, grace, repair or tracking bound", ErrInvalidOptions)
	}
	r := &Reconciler{st: o.Store, pr: o.Projection, box: o.Outbox, lk: o.Locker, clk: transport.Or(o.Clock),
		every: o.Interval, gap: o.MinGap, grace: o.Grace, max: o.MaxRepairs, track: o.MaxTracked, onD: o.OnDrift, onE: o.OnError,
		watch: o.WatchStates, onS: o.OnStateChange, onP: o.OnPass,
		kick: make(chan struct{}, 1), seen: map[string]time.Time{}, states: map[string]State{}}
	if r.lk == nil {
		if l, ok := o.Store.(ReconcileLocker); ok {
			r.lk = l
		} else {
			r.lk = &localLock{}
		}
	}
	if r.every == 0 {
		r.every = DefaultReconcileInterval
	}
	if r.gap == 0 {
		r.gap = DefaultMinReconcileGap
	}
	if r.grace == 0 {
		r.grace = DefaultOrphanGrace
	}
	if r.max == 0 {
		r.max = DefaultMaxRepairs
	}
	if r.track == 0 {
		r.track = DefaultMaxTrackedOrphans
	}
	return r, nil
}

// localLock is the reconciler lock of one process.
type localLock struct{ held atomic.Bool }

func (l *localLock) TryLockReconciler(context.Context) (func(), bool, error) {
	if !l.held.CompareAndSwap(false, true) {
		return nil, false, nil
	}
	return func() { l.held.Store(false) }, true, nil
}

// Kick asks for a pass soon (no sooner than MinGap after the last one); it
// never blocks, and kicks before that pass starts make one pass.
func (r *Reconciler) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Stats returns the counters.
func (r *Reconciler) Stats() ReconcileStats {
	return ReconcileStats{Passes: r.passes.Load(), Skipped: r.skips.Load(), Repairs: r.reps.Load(), Held: r.held.Load(), Broken: r.brk.Load(), Errors: r.errs.Load()}
}

// Run makes a pass at once, then every Interval and after each Kick, until
// ctx is done; it returns ctx's error. A failed pass is reported to
// OnError and the next one runs on time.
func (r *Reconciler) Run(ctx context.Context) error {
	tick := make(chan struct{}, 1)
	wake := func() {
		select {
		case tick <- struct{}{}:
		default:
		}
	}
	var last time.Time
	for {
		if _, err := r.Pass(ctx, false); err != nil && ctx.Err() == nil {
			r.report(err)
		}
		last = r.clk.Now()
		t := r.clk.AfterFunc(r.every, wake)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-tick:
		case <-r.kick:
			t.Stop()
			if wait := r.gap - r.clk.Now().Sub(last); wait > 0 {
				g := r.clk.AfterFunc(wait, wake)
				select {
				case <-ctx.Done():
					g.Stop()
					return ctx.Err()
				case <-tick:
				}
			}
		}
	}
}

func (r *Reconciler) report(err error) {
	r.errs.Add(1)
	if r.onE != nil {
		r.onE(err)
	}
}

// Pass makes one pass. A dry run takes no lock and writes nothing: its
// report lists every drift with Held set to HeldDryRun (orphans with the
// reason they would be held, if any). A pass that finds the lock held
// elsewhere returns a report with Locked false. The error joins the
// failures of single shares, which do not stop the pass.
func (r *Reconciler) Pass(ctx context.Context, dry bool) (Report, error) {
	rep := Report{DryRun: dry, Drifts: []Drift{}}
	if !dry {
		unlock, ok, err := r.lk.TryLockReconciler(ctx)
		if err != nil {
			return rep, fmt.Errorf("hosting: reconciler lock: %w", err)
		}
		if !ok {
			r.skips.Add(1)
			return rep, nil
		}
		defer unlock()
	}
	rep.Locked = true
	if !dry {
		r.passes.Add(1)
	}
	var errs []error
	fail := func(err error) {
		errs = append(errs, err)
		rep.Errors = append(rep.Errors, err.Error())
	}
	shares, err := r.st.Find(ctx, Filter{})
	if err != nil {
		return rep, err
	}
	live := map[string]bool{}
	budget := r.max
	watch := r.watch && !dry
	if watch {
		rep.States = map[State]int{}
	}
	var changes []StateChange
	for _, s := range shares {
		live[s.ID] = true
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		held := !dry && budget <= 0
		ds, n, ch, err := r.share(ctx, s.ID, dry || held, watch)
		if watch && ds != nil {
			rep.States[ch.To]++
			if ch.ID != "" {
				changes = append(changes, ch)
			}
		}
		if held {
			for i := range ds {
				if ds[i].Kind != DriftBroken {
					ds[i].Held = HeldRateLimit
				}
			}
		}
		budget -= n
		rep.Repairs += n
		if ds != nil {
			rep.Shares++
		}
		rep.Drifts = append(rep.Drifts, ds...)
		if err != nil {
			fail(err)
		}
	}
	if r.pr.o.DeploymentID != "" {
		ds, n, err := r.orphans(ctx, live, dry, &budget)
		rep.Drifts = append(rep.Drifts, ds...)
		rep.Repairs += n
		if err != nil {
			fail(err)
		}
	}
	for _, d := range rep.Drifts {
		switch {
		case d.Kind == DriftBroken:
			r.brk.Add(1)
		case d.Held != "":
			rep.Held++
			if !dry {
				r.held.Add(1)
			}
		}
		if r.onD != nil && !dry {
			r.onD(d)
		}
	}
	r.reps.Add(uint64(rep.Repairs))
	if len(errs) > 0 {
		r.errs.Add(uint64(len(errs)))
	}
	if watch {
		r.mu.Lock()
		for id := range r.states {
			if !live[id] {
				delete(r.states, id)
			}
		}
		r.mu.Unlock()
		if r.onS != nil {
			for _, c := range changes {
				r.onS(c)
			}
		}
	}
	if !dry && r.onP != nil {
		r.onP(rep)
	}
	return rep, errors.Join(errs...)
}

// share reconciles one share under its row lock. ds is nil when the share
// is gone or deleted since the listing. With watch, ch.To is the share's
// hosting state after the repairs, and ch.ID is set when that state
// differs from the last pass's (the change is then in the outbox).
func (r *Reconciler) share(ctx context.Context, id string, dry, watch bool) (ds []Drift, writes int, ch StateChange, err error) {
	err = r.st.InTx(ctx, func(ctx context.Context, tx Tx) error {
		ds, writes, ch = nil, 0, StateChange{}
		locked, err := tx.Lock(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		s := locked[0]
		if !s.Live() {
			return nil
		}
		deleted, err := deletedAgents(ctx, tx, s.Hosts.All())
		if err != nil {
			return err
		}
		d := &driftRun{share: s.ID, dry: dry}
		rerr := r.pr.reconcileInto(ctx, d, s, deleted)
		ds, writes = d.out, d.writes
		if ds == nil {
			ds = []Drift{}
		}
		if !watch {
			return rerr
		}
		ch = StateChange{Share: s, To: StateUnknown, At: r.clk.Now()}
		h, serr := r.pr.Status(ctx, s)
		if serr != nil {
			return rerr // not known: no change announced, the last state kept
		}
		ch.To, ch.Hosting = h.State, *h
		r.mu.Lock()
		prev, seen := r.states[s.ID]
		r.mu.Unlock()
		if !seen || prev == h.State {
			r.setState(s.ID, h.State)
			return rerr
		}
		ch.ID, ch.From = NewID(), prev
		if ob, ok := tx.(OutboxTx); ok {
			m, err := ch.Message()
			if err != nil {
				return errors.Join(rerr, err)
			}
			if err := ob.AddEvents(ctx, []EventMessage{m}); err != nil {
				return errors.Join(rerr, err)
			}
		}
		return rerr
	})
	if err != nil {
		ch.ID = "" // rolled back: not announced, seen again next pass
		return ds, writes, ch, err
	}
	if ch.ID != "" {
		r.setState(id, ch.To)
	}
	return ds, writes, ch, nil
}

func (r *Reconciler) setState(id string, s State) {
	r.mu.Lock()
	r.states[id] = s
	r.mu.Unlock()
}

// pendingShares returns the share ids the pending outbox names, and
// whether the outbox may name more than it read.
func (r *Reconciler) pendingShares(ctx context.Context) (map[string]bool, bool, error) {
	out := map[string]bool{}
	if r.box == nil {
		return out, false, nil
	}
	es, err := r.box.Pending(ctx, outboxScan)
	if err != nil {
		return nil, false, err
	}
	for _, e := range es {
		var env struct {
			Entity string `json:"entity"`
			Data   struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if json.Unmarshal(e.Body, &env) == nil && env.Entity == EntityShare && env.Data.ID != "" {
			out[env.Data.ID] = true
		}
	}
	return out, len(es) >= outboxScan, nil
}

// orphans finds the objects of this deployment whose share is not live,
// and deletes those older than the grace period and not named in the
// outbox, under the share's row lock when the share has a row.
func (r *Reconciler) orphans(ctx context.Context, live map[string]bool, dry bool, budget *int) ([]Drift, int, error) {
	dp, err := r.pr.deployedObjects(ctx)
	if err != nil {
		return nil, 0, err
	}
	named, full, err := r.pendingShares(ctx)
	if err != nil {
		return nil, 0, err
	}
	now, grace, track := r.clk.Now(), r.grace, r.track
	var out []Drift
	writes := 0
	// Forget the orphans that are gone first, so that they free their
	// place in the tracking bound for this pass.
	current := map[string]bool{}
	for _, sh := range dp.shares() {
		if !live[sh] {
			for _, o := range dp.orphanIDs(sh) {
				current[o.id] = true
			}
		}
	}
	if !dry {
		r.mu.Lock()
		for id := range r.seen {
			if !current[id] {
				delete(r.seen, id)
			}
		}
		r.mu.Unlock()
	}
	var errs []error
	for _, sh := range dp.shares() {
		if live[sh] {
			continue
		}
		objs := dp.orphanIDs(sh)
		// Age and holds, per object.
		type cand struct {
			o    orphanObject
			held string
		}
		var cands []cand
		r.mu.Lock()
		for _, o := range objs {
			first, ok := r.seen[o.id]
			if !ok && !dry {
				if len(r.seen) >= track {
					cands = append(cands, cand{o, HeldTracking})
					continue
				}
				r.seen[o.id], first = now, now
			} else if !ok {
				first = now
			}
			held := ""
			switch {
			case named[sh] || full:
				held = HeldOutbox
			case now.Sub(first) < grace:
				held = HeldGrace
			case dry:
				held = HeldDryRun
			case *budget <= 0:
				held = HeldRateLimit
			}
			cands = append(cands, cand{o, held})
		}
		r.mu.Unlock()
		deletable := false
		for _, c := range cands {
			if c.held == "" {
				deletable = true
			}
		}
		if !deletable {
			for _, c := range cands {
				out = append(out, Drift{ShareID: sh, Kind: DriftOrphan, Object: c.o.id, Detail: c.o.kind + " " + c.o.name, Held: c.held})
			}
			continue
		}
		// Lock the share's row, when it has one, and check again that it
		// is not live.
		err := r.st.InTx(ctx, func(ctx context.Context, tx Tx) error {
			locked, err := tx.Lock(ctx, sh)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			if err == nil && locked[0].Live() {
				return nil // created since the listing
			}
			for _, c := range cands {
				d := Drift{ShareID: sh, Kind: DriftOrphan, Object: c.o.id, Detail: c.o.kind + " " + c.o.name, Held: c.held}
				if c.held == "" {
					if err := r.pr.deleteOrphan(ctx, c.o); err != nil {
						out = append(out, d)
						return fmt.Errorf("hosting: delete orphan %s %s of share %s: %w", c.o.kind, c.o.id, sh, err)
					}
					d.Repaired = true
					writes++
					*budget--
					r.mu.Lock()
					delete(r.seen, c.o.id)
					r.mu.Unlock()
				}
				out = append(out, d)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, writes, errors.Join(errs...)
}
