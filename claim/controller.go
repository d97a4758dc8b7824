package claim

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Default timings of the controller; docs/defaults.md gives their reasons.
const (
	DefaultRenewInterval   = 2 * time.Second  // the holder renews its lease this often
	DefaultLeaseTTL        = 20 * time.Second // the lease's TTL in etcd
	DefaultDropAfter       = 10 * time.Second // drop the VIP this long after the last answered renewal was sent
	DefaultElectionTimeout = 5 * time.Second  // etcd's election timeout, for promote's lease wait
)

// Channel is the client side of the members' channel (POST /v1/vip), as
// the controller uses it. Client implements it over HTTP. A peer's refusal
// is a *RefusalError that matches the refusal's sentinel with errors.Is; any
// other error means the peer did not answer.
type Channel interface {
	// Announce sends c to peer; nil means the peer took it.
	Announce(ctx context.Context, peer netip.Addr, c *Claim) error
	// Release asks peer, the holder, to release the VIP; it answers after
	// it has dropped the address, with the claim it held.
	Release(ctx context.Context, peer netip.Addr, r *Release) (*Claim, error)
	// Epoch asks peer for the newest claim it holds for vip (nil: none).
	Epoch(ctx context.Context, peer netip.Addr, vip netip.Addr) (*Claim, error)
}

// Config configures a Controller.
type Config struct {
	// Policy holds the mesh, the trust store and the overlay prefix.
	Policy *Policy
	// Self is this node's overlay address.
	Self netip.Addr
	// Key is this node's Ed25519 key. Nil makes an observer: a node outside
	// the pair that takes claims and routes the VIP but never claims.
	Key ed25519.PrivateKey
	// VIP is the service VIP this controller tends.
	VIP netip.Addr
	// Pair is the pair record (required for members; an observer keeps the
	// first valid record it sees when nil).
	Pair *PairRecord
	// KV is etcd (or a stand-in). Nil: no etcd; the VIP moves only by
	// Promote and the members' channel.
	KV KV
	// Carrier adds, drops and routes the address. Required.
	Carrier Carrier
	// Store keeps State across restarts. Required.
	Store StateStore
	// Clock is the controller's only source of time: renewal ages, the
	// drop deadline, steps, promote's wait and CallTimeout. Nil means
	// BootClock (CLOCK_BOOTTIME), which is what production must use: a
	// renewal's age must count suspended time. (Elsewhere in vipkit a nil
	// Clock means transport.RealClock; here it does not.)
	Clock transport.Clock
	// Channel and Peers: the members' channel and every peer to announce
	// moves to and to ask in a promote (the other member included).
	Channel Channel
	Peers   []netip.Addr
	// Timings; zero means the Default* constant. They must satisfy
	// 0 < RenewInterval < DropAfter < LeaseTTL.
	RenewInterval, LeaseTTL, DropAfter, ElectionTimeout time.Duration
	// CallTimeout bounds each KV, Carrier and channel call, on the Clock
	// (see "Time" in the package doc); 0 means RenewInterval.
	CallTimeout time.Duration
	// NoWatch turns off the watch that wakes the controller on key changes
	// (it then follows the keys by reading them every RenewInterval).
	// Deterministic simulations set it.
	NoWatch bool
	// Healthy, when set, reports whether this node's service check passes
	// on a fresh result (nil) or why not. A member asked to take the VIP
	// over (HandleHandOver) asks it, and refuses with ErrCheckFailing
	// unless it passes; nil refuses every hand-over. It is called without
	// the controller's lock and should answer at once.
	Healthy func() error
	// OnError, when set, receives errors the controller handles itself
	// (failed renewals, invalid values in the KV, failed announcements).
	// It is never called with a lock of the Controller held, so it may call
	// the Controller; it should not block, since it runs in the goroutine
	// that hit the error (a step, a watch, a Promote or a handler).
	// Errors of one goroutine arrive in order; no order holds across them.
	OnError func(error)
}

// Controller is keel's "vip tend" for one VIP: it renews its lease,
// follows the counter and holder keys, carries the VIP only while its last
// answered renewal is younger than DropAfter, fails over once the holder's
// lease is gone, and serves the members' channel (it is a Handler).
//
// All methods are safe for concurrent use. Start begins tending; Close
// stops it and drops the address, as keel's ExecStopPost does. A new pair
// has no holder until Promote runs on one member (see "The first holder"
// in the package doc). Watch reports the controller's changes and
// FenceToken guards an importer's own etcd writes.
type Controller struct {
	cfg   Config
	clock transport.Clock
	keys  Keys

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu syncx.Mutex
	// +checklocks:mu
	st State
	// +checklocks:mu
	carried bool
	// +checklocks:mu
	routedTo netip.Addr
	// +checklocks:mu
	lastRenew time.Time // when the last renewal etcd answered was sent; zero: none since start
	// +checklocks:mu
	dirty bool // keys must be read: start, watch event, not holding
	// +checklocks:mu
	stepping bool
	// +checklocks:mu
	promoting int // Promotes running: the holder self-check must not fence
	// +checklocks:mu
	told map[netip.Addr]toldClaim // the claim each peer answered last
	// +checklocks:mu
	verified map[string]verifiedValue // per key: the last value found valid
	// +checklocks:mu
	started bool
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	step transport.Timer
	// +checklocks:mu
	drop transport.Timer
	// +checklocks:mu
	stats Stats

	// +checklocks:mu
	published view // the view last published to the watchers
	// +checklocks:mu
	seq uint64
	// +checklocks:mu
	watchers map[*watcher]struct{}
	// +checklocks:mu
	watchEnded bool // Close ended the watches
	// +checklocks:mu
	token FenceToken // the holder key's put of the claim held, once confirmed or written
	// +checklocks:mu
	errs []error // reported under mu, handed to OnError by unlock once mu is released
}

type verifiedValue struct {
	raw  []byte
	kept *PairRecord
	c    *Claim
}

type toldClaim struct {
	c    *Claim
	took bool
}

// Stats counts what a Controller did.
type Stats struct {
	Renewals     uint64 // renewals etcd answered
	RenewErrors  uint64 // renewals that failed (each counts as no renewal)
	Claims       uint64 // claims this controller wrote
	Drops        uint64 // times it dropped the address
	Fences       uint64 // times it fenced itself
	BadValues    uint64 // invalid values read from the KV
	Announced    uint64 // announcements peers took
	AnnounceErrs uint64
}

// Status is what "keel vip status" shows.
type Status struct {
	Role   Role
	Epoch  uint64
	Holder netip.Addr // of the newest claim taken
	// Fenced is set for a fenced node, and for an unchecked one.
	Fenced bool
	// Unchecked is set while the node has no claim in its state and has
	// not yet learnt whether it held the VIP before (State.Unchecked):
	// with a KV, until etcd answers; without one, until the other member
	// does. It claims nothing meanwhile.
	Unchecked bool
	Released  bool
	Lease     LeaseID
	// RenewalAge is the age of the last answered renewal; -1 when none
	// since start.
	RenewalAge time.Duration
	Carried    bool
	RoutedTo   netip.Addr
}

// NewController checks cfg and loads the state. It carries nothing until
// Start has renewed its lease (or, without a KV, until the state says it
// holds and it is not fenced).
func NewController(cfg Config) (*Controller, error) {
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = DefaultRenewInterval
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.DropAfter == 0 {
		cfg.DropAfter = DefaultDropAfter
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = DefaultElectionTimeout
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = cfg.RenewInterval
	}
	switch {
	case cfg.Policy == nil || cfg.Policy.Trust == nil:
		return nil, fmt.Errorf("%w: no policy or trust store", ErrInvalidOptions)
	case !validAddr(cfg.Self) || !validAddr(cfg.VIP):
		return nil, fmt.Errorf("%w: self %v vip %v", ErrInvalidOptions, cfg.Self, cfg.VIP)
	case cfg.Carrier == nil || cfg.Store == nil:
		return nil, fmt.Errorf("%w: no carrier or state store", ErrInvalidOptions)
	case !(0 < cfg.RenewInterval && cfg.RenewInterval < cfg.DropAfter && cfg.DropAfter < cfg.LeaseTTL):
		return nil, fmt.Errorf("%w: need 0 < renew %v < drop %v < ttl %v", ErrInvalidOptions, cfg.RenewInterval, cfg.DropAfter, cfg.LeaseTTL)
	case cfg.Key != nil && cfg.Pair == nil:
		return nil, fmt.Errorf("%w: a member needs its pair record", ErrInvalidOptions)
	}
	if cfg.Key != nil {
		if err := cfg.Policy.CheckPair(nil, cfg.Pair); err != nil {
			return nil, fmt.Errorf("%w: pair record: %w", ErrInvalidOptions, err)
		}
		if cfg.Pair.VIP != cfg.VIP || !cfg.Pair.HasMember(cfg.Self, KeyOf(cfg.Key)) {
			return nil, fmt.Errorf("%w: pair record is not for this node and vip", ErrInvalidOptions)
		}
	}
	st, err := cfg.Store.Load()
	if err != nil {
		return nil, err
	}
	if st.Pair != nil && cfg.Pair != nil && !st.Pair.SameMembers(cfg.Pair) {
		return nil, fmt.Errorf("%w: configured pair record differs from the kept one", ErrPairChanged)
	}
	if st.Pair == nil {
		st.Pair = cfg.Pair
	}
	if st.Held != nil && st.Held.VIP != cfg.VIP {
		return nil, fmt.Errorf("%w: state holds a claim for %v", ErrCorruptState, st.Held.VIP)
	}
	if cfg.Key != nil && st.Held == nil {
		// No claim in the state: a new member, or one whose state file
		// was lost. It claims nothing until it has learnt whether it held
		// the VIP before (State.Unchecked).
		st.Unchecked = true
	}
	c := &Controller{cfg: cfg, clock: cfg.Clock, keys: KeysFor(cfg.Policy.Mesh, cfg.VIP), st: st, dirty: true}
	if c.clock == nil {
		c.clock = BootClock{}
	}
	c.mu.Lock()
	c.published = c.viewLocked() // c is not shared yet: the lock only satisfies checklocks
	c.mu.Unlock()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// VIP returns the VIP the controller tends.
func (c *Controller) VIP() netip.Addr { return c.cfg.VIP }

// Start begins tending: a step now and every RenewInterval, and with a KV
// (unless NoWatch) a watch on the keys that wakes it early. Without a KV it
// first carries the VIP if the stored state says this node holds it, and
// its steps only repeat the holder's announcement to the peers that have
// not answered it yet (a peer that was unreachable when the VIP moved
// still learns of the move once it is back). Steps run from the Clock's
// timers: on a manual clock, inside Advance.
//
// Start returns ErrStarted if it already started, ErrClosed after Close,
// and, without a KV, the Carrier's error when it cannot carry (or route)
// the VIP the stored state holds; on an error nothing is left running and
// Start may be called again. With a KV, Start does not wait for etcd: a
// KV that cannot be reached is no error, because the controller carries
// nothing until it has renewed a lease and must keep trying while etcd is
// away (each failed call goes to OnError).
func (c *Controller) Start() error {
	c.mu.Lock()
	defer c.unlock()
	switch {
	case c.closed:
		return ErrClosed
	case c.started:
		return ErrStarted
	}
	if c.cfg.KV == nil {
		if c.st.Role(c.cfg.Self) == RoleHolder {
			if err := c.carryCallLocked(); err != nil {
				return fmt.Errorf("claim: start: carry %v: %w", c.cfg.VIP, err)
			}
			c.carried = true
			c.routeLocked(netip.Addr{})
		} else if c.st.Held != nil && c.st.Held.Holder != c.cfg.Self {
			if err := c.routeCallLocked(c.st.Held.Holder); err != nil {
				return fmt.Errorf("claim: start: route %v to %v: %w", c.cfg.VIP, c.st.Held.Holder, err)
			}
		}
	}
	c.started = true
	c.step = c.clock.AfterFunc(0, c.runStep)
	if c.cfg.KV != nil && !c.cfg.NoWatch {
		c.wg.Add(1)
		go c.watch()
	}
	return nil
}

func (c *Controller) watch() {
	defer c.wg.Done()
	for c.ctx.Err() == nil {
		ch := c.cfg.KV.Watch(c.ctx, c.keys.Prefix, 0)
		for r := range ch {
			if r.Err != nil {
				c.report(fmt.Errorf("claim: watch: %w", r.Err))
				break
			}
			c.mu.Lock()
			c.dirty = true
			if !c.stepping && !c.closed && c.step != nil {
				c.step.Reset(0)
			}
			c.unlock()
		}
		if !transport.Sleep(c.clock, c.cfg.RenewInterval, c.ctx.Done()) {
			return
		}
	}
}

// Close stops tending, waits for a running step, and drops the address if
// carried (the state is kept: the next start renews before carrying).
func (c *Controller) Close() error {
	c.mu.Lock()
	if c.closed {
		c.unlock()
		return nil
	}
	c.closed = true
	if c.step != nil {
		c.step.Stop()
	}
	if c.drop != nil {
		c.drop.Stop()
	}
	c.unlock()
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	if c.carried {
		c.dropLocked()
	}
	c.publishLocked()
	c.finishWatchersLocked()
	c.unlock()
	return nil
}

// Status reports the controller's view.
func (c *Controller) Status() Status {
	c.mu.Lock()
	defer c.unlock()
	s := Status{Role: c.st.Role(c.cfg.Self), Fenced: c.st.Fenced || c.st.Unchecked, Unchecked: c.st.Unchecked, Released: c.st.Released,
		Lease: c.st.Lease, Carried: c.carried, RoutedTo: c.routedTo, RenewalAge: -1}
	if c.st.Held != nil {
		s.Epoch, s.Holder = c.st.Held.Epoch, c.st.Held.Holder
	}
	if !c.lastRenew.IsZero() {
		s.RenewalAge = c.clock.Now().Sub(c.lastRenew)
	}
	return s
}

// State returns a copy of the controller's state.
func (c *Controller) State() State {
	c.mu.Lock()
	defer c.unlock()
	return c.st
}

// Stats returns the controller's counters.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	defer c.unlock()
	return c.stats
}

// report hands err to OnError. c.mu must not be held: under it, use
// reportLocked.
func (c *Controller) report(err error) {
	if c.cfg.OnError != nil && err != nil {
		c.cfg.OnError(err)
	}
}

// reportLocked queues err for OnError; unlock hands it over once c.mu is
// released, so that OnError never runs under the controller's lock.
// +checklocks:c.mu
func (c *Controller) reportLocked(err error) {
	if c.cfg.OnError != nil && err != nil {
		c.errs = append(c.errs, err)
	}
}

// +checklocks:c.mu
func (c *Controller) saveLocked() {
	if err := c.cfg.Store.Save(c.st); err != nil {
		c.reportLocked(err)
	}
}

// renewedLocked reports whether the last answered renewal is younger than
// DropAfter: the condition for carrying.
// +checklocks:c.mu
func (c *Controller) renewedLocked() bool {
	if c.cfg.KV == nil {
		return true
	}
	return !c.lastRenew.IsZero() && c.clock.Now().Sub(c.lastRenew) < c.cfg.DropAfter
}

// carryLocked adds the address, after checking the renewal's age again.
// +checklocks:c.mu
func (c *Controller) carryLocked() {
	if c.closed || c.carried || !c.renewedLocked() || c.st.Role(c.cfg.Self) != RoleHolder {
		return
	}
	if err := c.carryCallLocked(); err != nil {
		c.reportLocked(fmt.Errorf("claim: carry %v: %w", c.cfg.VIP, err))
		return
	}
	c.carried = true
	c.routeLocked(netip.Addr{})
}

// carryCallLocked adds the address: with a KV and a LeasedCarrier, until
// the drop deadline of the last answered renewal, so that the OS removes
// it by itself if this controller stops renewing.
// +checklocks:c.mu
func (c *Controller) carryCallLocked() error {
	ctx, cancel := c.call(c.ctx)
	defer cancel()
	if lc, ok := c.cfg.Carrier.(LeasedCarrier); ok && c.cfg.KV != nil {
		return lc.CarryUntil(ctx, c.cfg.VIP, c.lastRenew.Add(c.cfg.DropAfter))
	}
	return c.cfg.Carrier.Carry(ctx, c.cfg.VIP)
}

// extendLocked moves the carried address's deadline to that of the renewal
// just answered. A failure leaves the earlier deadline in force (the
// address goes by itself then), and the next answered renewal tries again.
// +checklocks:c.mu
func (c *Controller) extendLocked() {
	if _, ok := c.cfg.Carrier.(LeasedCarrier); !ok || !c.carried || c.closed {
		return
	}
	if err := c.carryCallLocked(); err != nil {
		c.reportLocked(fmt.Errorf("claim: extend %v: %w", c.cfg.VIP, err))
	}
}

// +checklocks:c.mu
func (c *Controller) dropLocked() {
	if !c.carried {
		return
	}
	// Drop even if the context is done: this is the fence. A failed drop
	// leaves the VIP marked carried, so every step tries again, and the
	// abandoned lease is not revoked while the address may still be there.
	if err := c.cfg.Carrier.Drop(context.WithoutCancel(c.ctx), c.cfg.VIP); err != nil {
		c.reportLocked(fmt.Errorf("claim: drop %v: %w", c.cfg.VIP, err))
		return
	}
	c.carried = false
	c.stats.Drops++
}

// +checklocks:c.mu
func (c *Controller) routeLocked(to netip.Addr) {
	if err := c.routeCallLocked(to); err != nil {
		c.reportLocked(fmt.Errorf("claim: route %v to %v: %w", c.cfg.VIP, to, err))
	}
}

// routeCallLocked routes the VIP to the holder at to (zero: no route) unless
// it is routed there already.
// +checklocks:c.mu
func (c *Controller) routeCallLocked(to netip.Addr) error {
	if to == c.routedTo {
		return nil
	}
	ctx, cancel := c.call(c.ctx)
	defer cancel()
	if err := c.cfg.Carrier.Route(ctx, c.cfg.VIP, to); err != nil {
		return err
	}
	c.routedTo = to
	return nil
}

// fenceLocked drops the address and fences the node.
// +checklocks:c.mu
func (c *Controller) fenceLocked() {
	c.dropLocked()
	if !c.st.Fenced {
		c.stats.Fences++
	}
	c.st = c.st.Fence()
	c.saveLocked()
}

// checkAgeLocked drops the VIP once the last answered renewal is DropAfter
// old. It runs from the drop timer and at the start of every step, so a
// holder that wakes from suspend drops before anything else.
// +checklocks:c.mu
func (c *Controller) checkAgeLocked() {
	if c.cfg.KV == nil || c.closed {
		return
	}
	if c.carried && !c.renewedLocked() {
		c.fenceLocked()
	}
}

// +checklocks:c.mu
func (c *Controller) armDropLocked() {
	if c.closed || c.lastRenew.IsZero() {
		return
	}
	d := c.lastRenew.Add(c.cfg.DropAfter).Sub(c.clock.Now())
	if c.drop == nil {
		c.drop = c.clock.AfterFunc(d, func() {
			c.mu.Lock()
			defer c.unlock()
			c.checkAgeLocked()
		})
		return
	}
	c.drop.Reset(d)
}

func (c *Controller) runStep() {
	c.mu.Lock()
	if c.closed || c.stepping {
		c.unlock()
		return
	}
	c.stepping = true
	c.wg.Add(1)
	start := c.clock.Now()
	c.unlock()
	defer c.wg.Done()

	c.tend()

	c.mu.Lock()
	c.stepping = false
	if !c.closed {
		next := c.cfg.RenewInterval - c.clock.Now().Sub(start)
		c.step.Reset(max(next, 0))
	}
	c.unlock()
}

// tend is one round: renew, then follow the keys and claim if the holder
// is gone. A steady holder makes exactly one KV call (the renewal). Without
// a KV, a round only announces the held claim again to the peers that have
// not answered it.
func (c *Controller) tend() {
	ctx := c.ctx
	if c.cfg.KV == nil {
		c.checkPeer(ctx)
		c.announceHeld(ctx)
		return
	}
	c.mu.Lock()
	c.checkAgeLocked()
	c.unlock()

	if c.cfg.Key != nil { // an observer holds no lease
		c.renew(ctx)
	}

	c.mu.Lock()
	need := c.dirty || !c.carried
	c.unlock()
	if need {
		c.follow(ctx)
	}
	c.announceHeld(ctx)
}

// checkPeer ends an unchecked state without a KV: the peers are asked for
// their newest claim (as a promote asks them), and once the other member
// has answered, the newest valid claim of the answers is taken. When it
// is this node's own, the node held the VIP before its state was lost and
// is fenced; otherwise it is a replica that routes to the holder. Until
// the other member answers, the node stays unchecked and the next step
// asks again.
func (c *Controller) checkPeer(ctx context.Context) {
	c.mu.Lock()
	unchecked, pair := c.st.Unchecked, c.st.Pair
	c.unlock()
	if !unchecked || c.cfg.Key == nil || c.cfg.Channel == nil {
		return
	}
	newest, other := c.askEpochs(ctx, pair)
	if !other {
		return
	}
	c.mu.Lock()
	defer c.unlock()
	if c.closed || !c.st.Unchecked || c.st.Pair != pair {
		return // a promote or a taken claim moved the state meanwhile
	}
	self := c.cfg.Self
	fresh := newest != nil && Fresh(c.st.Held, newest) == nil
	c.heldCheckLocked(newest != nil && newest.Holder == self)
	if fresh {
		c.st = c.st.Take(self, newest)
		c.saveLocked()
		if newest.Holder != self {
			c.routeLocked(newest.Holder)
		}
	}
}

// askEpochs asks every peer for the newest claim it holds and returns the
// newest valid one (nil: none), and whether the other member of the pair
// answered at all.
func (c *Controller) askEpochs(ctx context.Context, pair *PairRecord) (newest *Claim, otherAnswered bool) {
	var other netip.Addr
	if pair != nil {
		if m, ok := pair.Other(c.cfg.Self); ok {
			other = m.Addr
		}
	}
	for _, p := range c.cfg.Peers {
		if p == c.cfg.Self {
			continue
		}
		cctx, cancel := c.call(ctx)
		cl, err := c.cfg.Channel.Epoch(cctx, p, c.cfg.VIP)
		cancel()
		if err != nil {
			continue
		}
		if p == other {
			otherAnswered = true
		}
		if cl == nil {
			continue
		}
		// Verify asks the trust store, a caller's: never under c.mu.
		if c.cfg.Policy.Verify(pair, cl, netip.Addr{}) == nil && cl.Newer(newest) {
			newest = cl
		}
	}
	return newest, otherAnswered
}

// announceHeld announces the held claim, if this node carries the VIP, to
// the peers that have not answered it yet.
func (c *Controller) announceHeld(ctx context.Context) {
	c.mu.Lock()
	var held *Claim
	if c.carried {
		held = c.st.Held
	}
	c.unlock()
	if held != nil {
		c.announce(ctx, held)
	}
}

// call bounds one KV, channel or Carrier call by CallTimeout on the Clock.
func (c *Controller) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return withClockTimeout(ctx, c.clock, c.cfg.CallTimeout)
}

// renew sends one renewal (or grant) and, when the node has something to
// clean up (an abandoned or released lease), one revoke.
func (c *Controller) renew(ctx context.Context) {
	kv := c.cfg.KV
	c.mu.Lock()
	lease, abandoned, released, carried := c.st.Lease, c.st.Abandoned, c.st.ReleasedLease, c.carried
	c.unlock()

	if abandoned != 0 && !carried {
		cctx, cancel := c.call(ctx)
		err := kv.Revoke(cctx, abandoned)
		cancel()
		if err == nil || errors.Is(err, ErrLeaseNotFound) {
			c.mu.Lock()
			c.st = c.st.LeaseGone(abandoned)
			c.saveLocked()
			c.unlock()
		}
	}
	if released != 0 {
		// The lease a release left behind: revoked here, after the
		// release was answered (see HandleRelease).
		cctx, cancel := c.call(ctx)
		err := kv.Revoke(cctx, released)
		cancel()
		if err == nil || errors.Is(err, ErrLeaseNotFound) {
			c.mu.Lock()
			c.st = c.st.LeaseGone(released)
			c.saveLocked()
			c.unlock()
		}
	}

	sent := c.clock.Now()
	cctx, cancel := c.call(ctx)
	defer cancel()
	if lease == 0 {
		id, _, err := kv.Grant(cctx, c.cfg.LeaseTTL)
		c.mu.Lock()
		defer c.unlock()
		if err != nil {
			c.stats.RenewErrors++
			c.reportLocked(fmt.Errorf("claim: grant: %w", err))
			return
		}
		if c.st.Lease != 0 || c.closed { // raced with a promote that granted one
			return
		}
		c.st.Lease = id
		c.lastRenew = sent
		c.stats.Renewals++
		c.saveLocked()
		c.armDropLocked()
		return
	}
	_, err := kv.KeepAliveOnce(cctx, lease)
	c.mu.Lock()
	defer c.unlock()
	switch {
	case err == nil:
		if lease == c.st.Lease {
			c.lastRenew = sent
			c.stats.Renewals++
			c.armDropLocked()
			c.extendLocked()
			if c.st.Role(c.cfg.Self) == RoleHolder && !c.carried {
				c.dirty = true // confirm the holder key before carrying
			}
		}
	case errors.Is(err, ErrLeaseNotFound):
		c.stats.RenewErrors++
		holder := c.st.Role(c.cfg.Self) == RoleHolder && lease == c.st.Lease
		c.st = c.st.LeaseGone(lease)
		if lease == c.st.Lease || holder {
			c.lastRenew = time.Time{}
		}
		if holder {
			c.fenceLocked()
		}
		c.saveLocked()
	default:
		c.stats.RenewErrors++
		c.reportLocked(fmt.Errorf("claim: renew: %w", err))
	}
}

// keyState is what one read of the keys says.
type keyState struct {
	rev         int64
	epochKV     *KeyValue
	holderKV    *KeyValue
	counter     *Claim // valid claim in the counter key
	holder      *Claim // valid claim in the holder key that equals the counter
	holderAlive bool
	selfHeld    bool // this node's held key exists: it claimed the VIP before
}

func (c *Controller) readKeys(g GetResponse) keyState {
	ks := keyState{rev: g.Revision}
	var selfHeld string
	if c.cfg.Key != nil {
		selfHeld = c.keys.HeldKey(KeyOf(c.cfg.Key))
	}
	for i := range g.KVs {
		switch g.KVs[i].Key {
		case c.keys.Epoch:
			ks.epochKV = &g.KVs[i]
		case c.keys.Holder:
			ks.holderKV = &g.KVs[i]
		case selfHeld:
			// Whatever its value, the key shows that this node claimed
			// before; a value that is not an epoch is counted and told.
			ks.selfHeld = true
			if _, err := ParseHeldValue(g.KVs[i].Value); err != nil {
				c.mu.Lock()
				c.stats.BadValues++
				c.unlock()
				c.report(fmt.Errorf("claim: value of %s: %w", selfHeld, err))
			}
		}
	}
	c.mu.Lock()
	kept := c.st.Pair
	c.unlock()
	parse := func(kv *KeyValue) *Claim {
		if kv == nil {
			return nil
		}
		// A value already verified (under the same kept record) is not
		// verified again: followers read the same keys every step.
		c.mu.Lock()
		v, ok := c.verified[kv.Key]
		c.unlock()
		if ok && v.kept == kept && bytes.Equal(v.raw, kv.Value) {
			return v.c
		}
		cl, err := ParseClaim(kv.Value)
		if err == nil && cl.VIP != c.cfg.VIP {
			err = fmt.Errorf("%w: key for %v holds %v", ErrPairMismatch, c.cfg.VIP, cl.VIP)
		}
		if err == nil {
			err = c.cfg.Policy.Verify(kept, cl, netip.Addr{})
		}
		if err != nil {
			c.mu.Lock()
			c.stats.BadValues++
			c.unlock()
			c.report(fmt.Errorf("claim: value of %s: %w", kv.Key, err))
			return nil
		}
		c.mu.Lock()
		if c.verified == nil {
			c.verified = map[string]verifiedValue{}
		}
		c.verified[kv.Key] = verifiedValue{raw: cl.Encode(), kept: kept, c: cl}
		c.unlock()
		return cl
	}
	ks.counter = parse(ks.epochKV)
	if h := parse(ks.holderKV); h != nil && ks.counter != nil && h.Equal(ks.counter) {
		ks.holder, ks.holderAlive = h, true
	}
	return ks
}

// follow reads the keys (one round trip), applies them, and claims (one
// more) when the holder's lease is gone and this node may fail over.
func (c *Controller) follow(ctx context.Context) {
	cctx, cancel := c.call(ctx)
	g, err := c.cfg.KV.Get(cctx, c.keys.Prefix, true)
	cancel()
	if err != nil {
		c.report(fmt.Errorf("claim: read keys: %w", err))
		return
	}
	ks := c.readKeys(g)
	if !c.apply(ks) {
		return
	}
	if _, err := c.claimTxn(ctx, ks); err != nil && !errors.Is(err, ErrCompareFailed) {
		c.report(err)
	}
}

// apply takes the counter's claim if newer, routes, confirms or fences a
// holder, and reports whether the node should claim now.
func (c *Controller) apply(ks keyState) bool {
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		return false
	}
	c.dirty = false
	self := c.cfg.Self
	if c.st.Unchecked && c.cfg.Key != nil {
		// The first read of the keys since the state was found empty:
		// before anything is taken from it, the held key says whether
		// this node held the VIP before.
		c.heldCheckLocked(ks.selfHeld)
	}
	if ks.counter != nil && ks.counter.Newer(c.st.Held) {
		if err := Fresh(c.st.Held, ks.counter); err != nil {
			c.reportLocked(fmt.Errorf("claim: counter: %w", err))
		} else {
			was := c.st.Role(self)
			c.st = c.st.Take(self, ks.counter)
			if was == RoleHolder && c.st.Role(self) != RoleHolder {
				c.fenceLocked()
			}
			c.saveLocked()
		}
	}
	if ks.holderAlive && ks.holder.Holder != self {
		c.routeLocked(ks.holder.Holder)
	}
	mineKey := ks.holderAlive && ks.holder.Holder == self && c.st.Lease != 0 && ks.holderKV.Lease == c.st.Lease
	if c.st.Role(self) == RoleHolder {
		if mineKey && c.st.Held.Equal(ks.holder) {
			c.token = FenceToken{Key: c.keys.Holder, ModRevision: ks.holderKV.ModRevision,
				Value: ks.holderKV.Value, Epoch: ks.holder.Epoch}
			c.carryLocked()
		} else if c.promoting == 0 && (c.renewedLocked() || c.carried) {
			// The holder key is not ours on our live lease: we lost the VIP.
			c.fenceLocked()
		}
		return false
	}
	if mineKey {
		// Not the holder (fenced or released), yet the holder key hangs on
		// our lease: stop renewing it, so the other member can fail over.
		c.st.Abandoned, c.st.Lease = c.st.Lease, 0
		c.lastRenew = time.Time{}
		c.saveLocked()
		return false
	}
	if c.cfg.Key == nil || c.st.Lease == 0 || !c.renewedLocked() {
		return false
	}
	return c.st.MayFailover(self, ks.counter, ks.holderAlive)
}

// heldCheckLocked ends an unchecked state: heldBefore says whether this
// node held the VIP before its state was lost. If it did, it is fenced
// (ErrStateLost goes to OnError).
// +checklocks:c.mu
func (c *Controller) heldCheckLocked(heldBefore bool) {
	if !c.st.Unchecked {
		return
	}
	c.st = c.st.HeldCheck(heldBefore)
	if heldBefore {
		c.stats.Fences++
		c.reportLocked(fmt.Errorf("%w (%v)", ErrStateLost, c.cfg.VIP))
	}
	c.saveLocked()
}

// claimTxn writes this node's claim for the epoch after the counter's, in
// one transaction that requires the counter at the revision read and the
// holder key absent (or, when it holds an invalid value, unchanged), and
// puts this node's held key (the claim's epoch, no lease). A failed
// compare is ErrCompareFailed and writes nothing.
func (c *Controller) claimTxn(ctx context.Context, ks keyState) (*Claim, error) {
	c.mu.Lock()
	lease, pair := c.st.Lease, c.st.Pair
	c.unlock()
	var epoch uint64 = 1
	if ks.counter != nil {
		var err error
		if epoch, err = nextEpoch(ks.counter.Epoch); err != nil {
			return nil, err
		}
	} else if ks.epochKV != nil {
		return nil, fmt.Errorf("%w: counter key holds no valid claim", ErrNoCounter)
	}
	cl, err := NewClaim(c.cfg.Key, c.cfg.Self, epoch, pair)
	if err != nil {
		return nil, err
	}
	t := Txn{
		If: []Compare{{Key: c.keys.Epoch, Target: ModRevision}},
		Then: []Op{
			Put(c.keys.Epoch, cl.Encode(), 0),
			Put(c.keys.Holder, cl.Encode(), lease),
			Put(c.keys.HeldKey(KeyOf(c.cfg.Key)), HeldValue(epoch), 0),
		},
		Else: []Op{GetOp(c.keys.Prefix, true)},
	}
	if ks.epochKV != nil {
		t.If[0].Revision = ks.epochKV.ModRevision
	}
	if ks.holderKV == nil {
		t.If = append(t.If, Compare{Key: c.keys.Holder, Target: CreateRevision})
	} else {
		t.If = append(t.If, Compare{Key: c.keys.Holder, Target: ModRevision, Revision: ks.holderKV.ModRevision})
	}
	cctx, cancel := c.call(ctx)
	r, err := c.cfg.KV.Txn(cctx, t)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("claim: claim txn: %w", err)
	}
	if !r.Succeeded {
		if len(r.Gets) == 1 {
			c.apply(c.readKeys(r.Gets[0]))
		}
		return nil, ErrCompareFailed
	}
	c.mu.Lock()
	c.st = c.st.Claimed(cl, lease)
	// Both keys were put at the transaction's revision.
	c.token = FenceToken{Key: c.keys.Holder, ModRevision: r.Revision, Value: cl.Encode(), Epoch: cl.Epoch}
	c.stats.Claims++
	c.saveLocked()
	c.carryLocked()
	c.unlock()
	c.announce(ctx, cl)
	return cl, nil
}

// announce tells every peer of a move on the members' channel, all peers
// at once (a peer that does not answer costs CallTimeout once, not once per
// peer after it), and returns when every call has ended. A peer that
// answered this claim before, taking or refusing it, is not asked again.
func (c *Controller) announce(ctx context.Context, cl *Claim) (taken, answered int) {
	if c.cfg.Channel == nil {
		return 0, 0
	}
	type result struct {
		p   netip.Addr
		err error
	}
	results := make(chan result, len(c.cfg.Peers))
	calls := 0
	for _, p := range c.cfg.Peers {
		if p == c.cfg.Self {
			continue
		}
		c.mu.Lock()
		prev, done := c.told[p]
		c.unlock()
		if done && prev.c.Equal(cl) {
			if prev.took {
				taken++
			}
			answered++
			continue
		}
		calls++
		go func() {
			cctx, cancel := c.call(ctx)
			defer cancel()
			results <- result{p, c.cfg.Channel.Announce(cctx, p, cl)}
		}()
	}
	for range calls {
		r := <-results
		var ref *RefusalError
		switch {
		case r.err == nil:
			taken++
			answered++
		case errors.As(r.err, &ref):
			answered++
		}
		c.mu.Lock()
		if r.err == nil || ref != nil {
			if c.told == nil {
				c.told = map[netip.Addr]toldClaim{}
			}
			c.told[r.p] = toldClaim{c: cl, took: r.err == nil}
		}
		if r.err == nil {
			c.stats.Announced++
		} else {
			c.stats.AnnounceErrs++
		}
		c.unlock()
		if r.err != nil {
			c.report(fmt.Errorf("claim: announce to %v: %w", r.p, r.err))
		}
	}
	return taken, answered
}
