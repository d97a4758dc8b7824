package probe

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Defaults of CheckConfig and SchedulerConfig (docs/defaults.md gives
// their reasons).
const (
	DefaultCheckInterval  = 3 * time.Second        // between connects to one target
	DefaultCheckTimeout   = 2 * time.Second        // a connect slower than this fails
	DefaultCheckFailures  = 2                      // consecutive failures that exclude
	DefaultCheckSuccesses = 1                      // consecutive successes that recover
	DefaultMaxChecks      = 32                     // active shared TCP checks (Limits)
	DefaultMaxConcurrent  = 32                     // connects in flight at once
	DefaultCheckTick      = 250 * time.Millisecond // the worker tick
)

// CheckKey names a shared TCP connect check: checks for the same overlay
// network, node, address and TCP port are one check, whatever listeners use
// it. Addr is the address dialed (the node's overlay address, or a local
// address for a local backend) and the application's TCP port.
type CheckKey struct {
	Network string
	Node    NodeID
	Addr    netip.AddrPort
}

// CheckConfig is one listener's port-check settings. Zero fields take the
// defaults (3 s interval, 2 s timeout, 2 failures to exclude, 1 success to
// recover); negative values are invalid. A listener with port checks off
// does not subscribe at all: its backends keep only the data-plane probes.
type CheckConfig struct {
	Interval  time.Duration
	Timeout   time.Duration
	Failures  int
	Successes int
}

func (c CheckConfig) withDefaults() (CheckConfig, error) {
	if c.Interval < 0 || c.Timeout < 0 || c.Failures < 0 || c.Successes < 0 {
		return c, invalid("check interval %v, timeout %v, failures %d, successes %d: negative", c.Interval, c.Timeout, c.Failures, c.Successes)
	}
	if c.Interval == 0 {
		c.Interval = DefaultCheckInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultCheckTimeout
	}
	if c.Failures == 0 {
		c.Failures = DefaultCheckFailures
	}
	if c.Successes == 0 {
		c.Successes = DefaultCheckSuccesses
	}
	return c, nil
}

// SchedulerConfig sets the scheduler's limits. Zero fields take the
// defaults (32 and 32).
type SchedulerConfig struct {
	MaxChecks     int // distinct targets checked at once; beyond it Acquire fails with ErrCheckLimit
	MaxConcurrent int // connects in flight at once (slots)
}

// CheckStatus is one subscription's view of its check.
type CheckStatus struct {
	// Passing is false after Failures consecutive failed connects, until
	// Successes consecutive successful ones. A new subscription passes
	// until proven otherwise: the data-plane probe gates the path meanwhile.
	Passing   bool
	Checked   bool          // at least one connect has completed
	Failures  int           // consecutive failures
	Successes int           // consecutive successes
	LastErr   error         // the newest failure's error; kept after recovery
	LastAt    time.Time     // when the newest connect completed
	Elapsed   time.Duration // how long the newest connect took
}

// Result is the outcome of one connect started by the Scheduler.
type Result struct {
	Err     error         // nil when the connection was accepted
	Elapsed time.Duration // from start to outcome
}

// Start is a connect the Scheduler wants made now: dial Key.Addr over TCP,
// give up after Timeout, close at once on success (no data is sent), and
// hand the Result back to Complete with this Start.
type Start struct {
	Key     CheckKey
	Timeout time.Duration
	Due     time.Time // when the check fell due; Start's time minus Due is its wait
	slot    int32
	gen     uint32
}

// SchedulerStats are the scheduler's counters.
type SchedulerStats struct {
	Checks        int    // active shared checks
	Subscriptions int    // listeners' subscriptions to them
	InFlight      int    // connects started and not completed
	MaxInFlight   int    // the most ever in flight at once
	Started       uint64 // connects started
	Passed        uint64 // connects accepted in time (by the longest timeout)
	Failed        uint64 // connects refused, failed or timed out
	Refused       uint64 // Acquire calls refused by MaxChecks
}

// ErrStaleStart is returned by Scheduler.Complete for a Start that was
// already completed (a caller bug); it changes nothing.
var ErrStaleStart = errors.New("probe: check start already completed")

type check struct {
	key       CheckKey
	subs      []*Subscription
	interval  time.Duration // the shortest of the subscriptions'
	timeout   time.Duration // the longest of the subscriptions'
	due       int64         // due time in ns since the scheduler's base
	seq       uint64        // FIFO among equal due times
	hidx      int           // index in the due heap; -1 when not queued
	running   bool
	removed   bool
	lastStart int64 // ns since base; valid when started
	started   bool
}

type slot struct {
	c   *check
	gen uint32
}

// Scheduler is the TCP connect checker's state machine: the shared checks,
// their subscriptions (one per listener and backend), when each check is
// due, and the connect slots. It never dials and reads no clock: Tick and
// Complete take now and return the connects to start. Checker runs it on a
// transport.Clock with a Dialer.
//
// Fairness: checks are served strictly in the order they fell due (ties in
// the order they were queued), so none starves however many exist. A check
// is next due Interval after its previous start, or at its completion if
// that is later. Slots freed by Complete are refilled at once from the
// checks already due; checks that fall due between ticks are noticed at the
// next Tick. So with N checks due and S slots, each starts within
// ceil(N/S) × the longest timeout + one tick of falling due.
//
// Scheduler is safe for concurrent use. Tick and Complete do not allocate
// beyond growing out, except to record a failure's error.
type Scheduler struct {
	// mu guards every field below and the checks' state.
	mu       syncx.Mutex
	maxCheck int // +checklocksignore: set by NewScheduler, read-only after
	// +checklocks:mu
	checks map[CheckKey]*check
	// +checklocks:mu
	due dueHeap
	// +checklocks:mu
	slots []slot
	// free lists the indexes of the free slots.
	// +checklocks:mu
	free []int32
	// +checklocks:mu
	seq uint64
	// +checklocks:mu
	subs int
	// +checklocks:mu
	stats SchedulerStats
	// base is the first now seen: times are kept as ns since it.
	// +checklocks:mu
	base time.Time
	// +checklocks:mu
	hasBase bool
}

// ns converts t to the scheduler's integer time.
//
// +checklocks:s.mu
func (s *Scheduler) ns(t time.Time) int64 {
	if !s.hasBase {
		s.base, s.hasBase = t, true
	}
	return int64(t.Sub(s.base))
}

// +checklocks:s.mu
func (s *Scheduler) time(ns int64) time.Time { return s.base.Add(time.Duration(ns)) }

// NewScheduler returns an empty scheduler.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if cfg.MaxChecks < 0 || cfg.MaxConcurrent < 0 {
		return nil, invalid("scheduler max checks %d / max concurrent %d is negative", cfg.MaxChecks, cfg.MaxConcurrent)
	}
	if cfg.MaxChecks == 0 {
		cfg.MaxChecks = DefaultMaxChecks
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	s := &Scheduler{
		maxCheck: cfg.MaxChecks,
		checks:   make(map[CheckKey]*check, min(cfg.MaxChecks, 1<<16)),
		due:      make(dueHeap, 0, min(cfg.MaxChecks, 1<<16)),
		slots:    make([]slot, cfg.MaxConcurrent),
		free:     make([]int32, cfg.MaxConcurrent),
	}
	for i := range s.free {
		s.free[i] = int32(cfg.MaxConcurrent - 1 - i)
	}
	return s, nil
}

// Subscription is one listener's use of a shared check, with that
// listener's thresholds: the shared connects are judged against its own
// Timeout, Failures and Successes. Release it when the listener or backend
// goes away; the check stops when its last subscription is released.
type Subscription struct {
	s        *Scheduler
	c        *check
	cfg      CheckConfig
	st       CheckStatus
	released bool
}

// Acquire subscribes to the check for key with cfg's thresholds, creating
// the check (first due at now) when no listener uses the target yet. It
// fails with ErrInvalidOptions, or with ErrCheckLimit when a new target would
// exceed MaxChecks.
func (s *Scheduler) Acquire(key CheckKey, cfg CheckConfig, now time.Time) (*Subscription, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if !key.Addr.IsValid() || key.Addr.Port() == 0 {
		return nil, invalid("check address %v needs an IP address and a TCP port", key.Addr)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.checks[key]
	if c == nil {
		if len(s.checks) >= s.maxCheck {
			s.stats.Refused++
			return nil, fmt.Errorf("%w: limit %d active TCP checks, %v not checked", ErrCheckLimit, s.maxCheck, key.Addr)
		}
		c = &check{key: key, hidx: -1, due: s.ns(now)}
		s.checks[key] = c
		s.stats.Checks = len(s.checks)
		c.interval, c.timeout = cfg.Interval, cfg.Timeout
		s.push(c)
	}
	sub := &Subscription{s: s, c: c, cfg: cfg, st: CheckStatus{Passing: true}}
	c.subs = append(c.subs, sub)
	s.subs++
	s.stats.Subscriptions = s.subs
	s.retime(c)
	return sub, nil
}

// retime recomputes the check's interval and timeout from its subscriptions
// and moves its due time earlier if the interval shrank.
//
// +checklocks:s.mu
func (s *Scheduler) retime(c *check) {
	c.interval, c.timeout = c.subs[0].cfg.Interval, c.subs[0].cfg.Timeout
	for _, sub := range c.subs[1:] {
		c.interval = min(c.interval, sub.cfg.Interval)
		c.timeout = max(c.timeout, sub.cfg.Timeout)
	}
	if c.hidx >= 0 && c.started {
		if d := c.lastStart + int64(c.interval); d < c.due {
			c.due = d
			s.due.fix(c.hidx)
		}
	}
}

// Release ends the subscription. The last release removes the check; a
// connect already in flight keeps its slot until it completes. Release is
// idempotent.
func (sub *Subscription) Release() {
	s := sub.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if sub.released {
		return
	}
	sub.released = true
	c := sub.c
	for i, o := range c.subs {
		if o == sub {
			c.subs[i] = c.subs[len(c.subs)-1]
			c.subs[len(c.subs)-1] = nil
			c.subs = c.subs[:len(c.subs)-1]
			break
		}
	}
	s.subs--
	s.stats.Subscriptions = s.subs
	if len(c.subs) > 0 {
		s.retime(c)
		return
	}
	c.removed = true
	delete(s.checks, c.key)
	s.stats.Checks = len(s.checks)
	if c.hidx >= 0 {
		s.due.remove(c.hidx)
	}
}

// Key returns the check's target.
func (sub *Subscription) Key() CheckKey { return sub.c.key }

// Config returns the subscription's thresholds, defaults filled in.
func (sub *Subscription) Config() CheckConfig { return sub.cfg }

// Status returns the subscription's current view of the check.
func (sub *Subscription) Status() CheckStatus {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	return sub.st
}

// +checklocks:s.mu
func (s *Scheduler) push(c *check) {
	s.seq++
	c.seq = s.seq
	s.due.push(c)
}

// Tick appends to out the checks due at now that free slots allow, in the
// order they fell due, and returns out.
func (s *Scheduler) Tick(now time.Time, out []Start) []Start {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fill(now, s.ns(now), out)
}

// +checklocks:s.mu
func (s *Scheduler) fill(now time.Time, nowNS int64, out []Start) []Start {
	for len(s.free) > 0 && len(s.due) > 0 && s.due[0].due <= nowNS {
		c := s.due.pop()
		i := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		sl := &s.slots[i]
		sl.c = c
		sl.gen++
		c.running, c.started, c.lastStart = true, true, nowNS
		s.stats.Started++
		s.stats.InFlight = len(s.slots) - len(s.free)
		s.stats.MaxInFlight = max(s.stats.MaxInFlight, s.stats.InFlight)
		out = append(out, Start{Key: c.key, Timeout: c.timeout, Due: s.time(c.due), slot: i, gen: sl.gen})
	}
	return out
}

// Complete records the result of st at now, frees its slot, queues the
// check for its next run, and appends to out the due checks the freed slot
// lets start now. It fails with ErrStaleStart for a Start already
// completed.
func (s *Scheduler) Complete(st Start, res Result, now time.Time, out []Start) ([]Start, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.slot < 0 || int(st.slot) >= len(s.slots) || s.slots[st.slot].gen != st.gen || s.slots[st.slot].c == nil {
		return out, fmt.Errorf("%w: %v", ErrStaleStart, st.Key.Addr)
	}
	sl := &s.slots[st.slot]
	c := sl.c
	sl.c = nil
	s.free = append(s.free, st.slot)
	s.stats.InFlight = len(s.slots) - len(s.free)
	c.running = false
	if res.Err == nil && res.Elapsed <= c.timeout {
		s.stats.Passed++
	} else {
		s.stats.Failed++
	}
	if !c.removed {
		for _, sub := range c.subs {
			sub.record(res, now)
		}
		nowNS := s.ns(now)
		c.due = max(c.lastStart+int64(c.interval), nowNS)
		s.push(c)
	}
	return s.fill(now, s.ns(now), out), nil
}

func (sub *Subscription) record(res Result, now time.Time) {
	st := &sub.st
	st.Checked, st.LastAt, st.Elapsed = true, now, res.Elapsed
	err := res.Err
	if err == nil && res.Elapsed > sub.cfg.Timeout {
		err = fmt.Errorf("%w: accepted after %v, limit %v", ErrCheckTimeout, res.Elapsed, sub.cfg.Timeout)
	}
	if err == nil {
		st.Successes++
		st.Failures = 0
		if !st.Passing && st.Successes >= sub.cfg.Successes {
			st.Passing = true
		}
		return
	}
	st.LastErr = err
	st.Failures++
	st.Successes = 0
	if st.Passing && st.Failures >= sub.cfg.Failures {
		st.Passing = false
	}
}

// Next returns the earliest due time among queued checks, and false when
// none is queued. A driver that wants to sleep between ticks while nothing
// is due may use it.
func (s *Scheduler) Next() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.due) == 0 {
		return time.Time{}, false
	}
	return s.time(s.due[0].due), true
}

// Stats returns the scheduler's counters.
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// dueHeap is a min-heap of checks by (due, seq), typed to avoid
// container/heap's interface conversions on the scheduling path.
type dueHeap []*check

func (h dueHeap) less(i, j int) bool {
	a, b := h[i], h[j]
	return a.due < b.due || a.due == b.due && a.seq < b.seq
}

func (h dueHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx = i
	h[j].hidx = j
}

func (h *dueHeap) push(c *check) {
	c.hidx = len(*h)
	*h = append(*h, c)
	h.up(c.hidx)
}

func (h *dueHeap) pop() *check {
	return h.remove(0)
}

func (h *dueHeap) remove(i int) *check {
	old := *h
	n := len(old) - 1
	c := old[i]
	if i != n {
		old.swap(i, n)
	}
	old[n] = nil
	*h = old[:n]
	if i != n {
		h.fix(i)
	}
	c.hidx = -1
	return c
}

func (h dueHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h dueHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h dueHeap) down(i0 int) bool {
	i, n := i0, len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && h.less(r, l) {
			j = r
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
