// Package claimtest holds importable fakes and fixtures for code that uses
// package claim: a recording Carrier, a KV wrapper that counts round trips
// and injects faults, and a deterministic pair of members with their trust
// store. The reference controller's tests use them as claim's own do.
package claimtest

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// EventKind says what a carrier did.
type EventKind uint8

// Carrier event kinds.
const (
	Carry EventKind = iota + 1
	Drop
	Route
)

func (k EventKind) String() string {
	switch k {
	case Carry:
		return "carry"
	case Drop:
		return "drop"
	case Route:
		return "route"
	}
	return "?"
}

// Event is one change a carrier made.
type Event struct {
	At   time.Time
	Node string
	Kind EventKind
	VIP  netip.Addr
	To   netip.Addr // Route: the holder routed to
}

// History records the carrier events of many nodes in order. Safe for
// concurrent use.
type History struct {
	// mu guards events, watch, the events not yet handed to watch and the
	// delivering flag.
	mu syncx.Mutex
	// +checklocks:mu
	events []Event
	// +checklocks:mu
	watch func(Event)
	// +checklocks:mu
	undelivered []Event
	// +checklocks:mu
	delivering bool // a goroutine is handing undelivered to watch
}

// Events returns a copy of the events so far.
func (h *History) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

// OnEvent installs fn, called for every event recorded from now on, in the
// order recorded and one at a time, but never under a lock of the History
// or of a FakeCarrier: fn may call the History and the carriers. (It may
// still run inside the claim.Controller's Carrier call, under that
// controller's lock: it must not call that controller.)
func (h *History) OnEvent(fn func(Event)) {
	h.mu.Lock()
	h.watch = fn
	h.undelivered = nil
	h.mu.Unlock()
}

// add records e; the caller then calls deliver once it holds no lock.
func (h *History) add(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
	if h.watch != nil {
		h.undelivered = append(h.undelivered, e)
	}
}

// deliver hands the recorded events to the OnEvent callback, unlocked. One
// goroutine delivers at a time, in the order recorded: one that finds
// another delivering leaves its events to it.
func (h *History) deliver() {
	h.mu.Lock()
	if h.delivering {
		h.mu.Unlock()
		return
	}
	h.delivering = true
	for len(h.undelivered) > 0 && h.watch != nil {
		e, fn := h.undelivered[0], h.watch
		h.undelivered = h.undelivered[1:]
		h.mu.Unlock()
		fn(e)
		h.mu.Lock()
	}
	h.delivering = false
	h.mu.Unlock()
}

// FakeCarrier is a claim.Carrier that keeps the carried addresses and
// routes in memory and records every change in a History. Fail, when set,
// is returned by every call (and nothing changes).
type FakeCarrier struct {
	Name    string // +checklocksignore: set before use, read-only after
	Clock   transport.Clock
	History *History // +checklocksignore: set before use, read-only after; safe for concurrent use

	// mu guards the carried addresses, their deadlines, the routes and
	// fail.
	mu syncx.Mutex
	// +checklocks:mu
	carried map[netip.Addr]bool
	// +checklocks:mu
	deadlines map[netip.Addr]time.Time
	// +checklocks:mu
	routes map[netip.Addr]netip.Addr
	// +checklocks:mu
	fail error
}

var _ claim.LeasedCarrier = (*FakeCarrier)(nil)

// NewFakeCarrier returns a carrier for node name recording into h (nil: a
// new History).
func NewFakeCarrier(name string, clock transport.Clock, h *History) *FakeCarrier {
	if h == nil {
		h = new(History)
	}
	return &FakeCarrier{Name: name, Clock: transport.Or(clock), History: h,
		carried: map[netip.Addr]bool{}, routes: map[netip.Addr]netip.Addr{}}
}

// SetFail makes every later call fail with err (nil: succeed again).
func (f *FakeCarrier) SetFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

// Carry implements claim.Carrier.
func (f *FakeCarrier) Carry(ctx context.Context, vip netip.Addr) error {
	defer f.History.deliver() // after f.mu is released
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	delete(f.deadlines, vip)
	if !f.carried[vip] {
		f.carried[vip] = true
		f.History.add(Event{At: f.Clock.Now(), Node: f.Name, Kind: Carry, VIP: vip})
	}
	return nil
}

// CarryUntil implements claim.LeasedCarrier: it records the deadline
// (Deadline) and carries, or drops when less than claim.MinCarryLeft is
// left on the carrier's Clock. It does not remove the address by itself at
// the deadline: the controller's own drop is what the simulations check.
func (f *FakeCarrier) CarryUntil(ctx context.Context, vip netip.Addr, deadline time.Time) error {
	if deadline.Sub(f.Clock.Now()) < claim.MinCarryLeft {
		if err := f.Drop(ctx, vip); err != nil {
			return err
		}
		return claim.ErrDeadlinePassed
	}
	if err := f.Carry(ctx, vip); err != nil {
		return err
	}
	f.mu.Lock()
	if f.deadlines == nil {
		f.deadlines = map[netip.Addr]time.Time{}
	}
	f.deadlines[vip] = deadline
	f.mu.Unlock()
	return nil
}

// Deadline returns the deadline of the last CarryUntil of vip (zero: none,
// or carried without one).
func (f *FakeCarrier) Deadline(vip netip.Addr) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadlines[vip]
}

// Drop implements claim.Carrier.
func (f *FakeCarrier) Drop(ctx context.Context, vip netip.Addr) error {
	defer f.History.deliver() // after f.mu is released
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	delete(f.deadlines, vip)
	if f.carried[vip] {
		delete(f.carried, vip)
		f.History.add(Event{At: f.Clock.Now(), Node: f.Name, Kind: Drop, VIP: vip})
	}
	return nil
}

// Route implements claim.Carrier.
func (f *FakeCarrier) Route(ctx context.Context, vip, holder netip.Addr) error {
	defer f.History.deliver() // after f.mu is released
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if f.routes[vip] != holder {
		f.routes[vip] = holder
		f.History.add(Event{At: f.Clock.Now(), Node: f.Name, Kind: Route, VIP: vip, To: holder})
	}
	return nil
}

// Carried reports whether vip is carried.
func (f *FakeCarrier) Carried(vip netip.Addr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.carried[vip]
}

// RoutedTo returns the holder vip is routed to.
func (f *FakeCarrier) RoutedTo(vip netip.Addr) netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.routes[vip]
}

// Counts are the calls a CountingKV passed on, one round trip each.
type Counts struct {
	Get, Txn, Grant, KeepAlive, Revoke, TimeToLive, Watch uint64
}

// Total sums the round trips (a watch is counted once, when opened).
func (c Counts) Total() uint64 {
	return c.Get + c.Txn + c.Grant + c.KeepAlive + c.Revoke + c.TimeToLive + c.Watch
}

// Sub returns c - o.
func (c Counts) Sub(o Counts) Counts {
	return Counts{c.Get - o.Get, c.Txn - o.Txn, c.Grant - o.Grant, c.KeepAlive - o.KeepAlive,
		c.Revoke - o.Revoke, c.TimeToLive - o.TimeToLive, c.Watch - o.Watch}
}

// CountingKV wraps a claim.KV, counts every call, and can fail calls to
// model a node cut off from the cluster: with Down set, a call fails
// before it reaches the KV; with ReplyLost set, it reaches the KV but the
// answer is lost.
type CountingKV struct {
	claim.KV

	get, txn, grant, keep, revoke, ttl, watch atomic.Uint64
	down, replyLost                           atomic.Bool
}

// ErrUnavailable is what a CountingKV returns while Down or ReplyLost.
var ErrUnavailable = errorString("claimtest: kv unavailable")

type errorString string

func (e errorString) Error() string { return string(e) }

// NewCountingKV wraps kv.
func NewCountingKV(kv claim.KV) *CountingKV { return &CountingKV{KV: kv} }

// SetDown makes calls fail without reaching the KV.
func (c *CountingKV) SetDown(v bool) { c.down.Store(v) }

// SetReplyLost makes calls reach the KV but fail as if the answer was lost.
func (c *CountingKV) SetReplyLost(v bool) { c.replyLost.Store(v) }

// Counts returns the calls so far.
func (c *CountingKV) Counts() Counts {
	return Counts{c.get.Load(), c.txn.Load(), c.grant.Load(), c.keep.Load(), c.revoke.Load(), c.ttl.Load(), c.watch.Load()}
}

func (c *CountingKV) pre(n *atomic.Uint64) error {
	n.Add(1)
	if c.down.Load() {
		return ErrUnavailable
	}
	return nil
}

func (c *CountingKV) post(err error) error {
	if err == nil && c.replyLost.Load() {
		return ErrUnavailable
	}
	return err
}

// Get implements claim.KV.
func (c *CountingKV) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	if err := c.pre(&c.get); err != nil {
		return claim.GetResponse{}, err
	}
	r, err := c.KV.Get(ctx, key, prefix)
	return r, c.post(err)
}

// Txn implements claim.KV.
func (c *CountingKV) Txn(ctx context.Context, t claim.Txn) (claim.TxnResponse, error) {
	if err := c.pre(&c.txn); err != nil {
		return claim.TxnResponse{}, err
	}
	r, err := c.KV.Txn(ctx, t)
	return r, c.post(err)
}

// Grant implements claim.KV.
func (c *CountingKV) Grant(ctx context.Context, ttl time.Duration) (claim.LeaseID, time.Duration, error) {
	if err := c.pre(&c.grant); err != nil {
		return 0, 0, err
	}
	id, got, err := c.KV.Grant(ctx, ttl)
	return id, got, c.post(err)
}

// KeepAliveOnce implements claim.KV.
func (c *CountingKV) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	if err := c.pre(&c.keep); err != nil {
		return 0, err
	}
	ttl, err := c.KV.KeepAliveOnce(ctx, id)
	return ttl, c.post(err)
}

// Revoke implements claim.KV.
func (c *CountingKV) Revoke(ctx context.Context, id claim.LeaseID) error {
	if err := c.pre(&c.revoke); err != nil {
		return err
	}
	return c.post(c.KV.Revoke(ctx, id))
}

// TimeToLive implements claim.KV.
func (c *CountingKV) TimeToLive(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	if err := c.pre(&c.ttl); err != nil {
		return 0, err
	}
	ttl, err := c.KV.TimeToLive(ctx, id)
	return ttl, c.post(err)
}

// Watch implements claim.KV.
func (c *CountingKV) Watch(ctx context.Context, prefix string, rev int64) <-chan claim.WatchResponse {
	c.watch.Add(1)
	return c.KV.Watch(ctx, prefix, rev)
}

// Node is a fixture node: its name, overlay address and key.
type Node struct {
	Name string
	Addr netip.Addr
	Key  ed25519.PrivateKey
}

// Pub returns the node's public key.
func (n Node) Pub() claim.PublicKey { return claim.KeyOf(n.Key) }

// Fixture is a deterministic mesh: members A and B of a pair for VIP, an
// observer C, an outsider D (trusted, not in the pair), a trust root, all
// in the region fd7a:115c:a1e0::1:0/112 of the overlay fd7a:115c:a1e0::/48.
type Fixture struct {
	Mesh       string
	Overlay    netip.Prefix
	VIP        netip.Addr
	A, B, C, D Node
	Root       ed25519.PrivateKey
	Trust      *claim.Trust
	Pair       *claim.PairRecord // signed by A and B
}

// KeyFor derives a deterministic key from a label.
func KeyFor(label string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("vipkit claimtest " + label))
	return ed25519.NewKeyFromSeed(seed[:])
}

// NewFixture builds the fixture. It panics on error (it has none).
func NewFixture() *Fixture {
	f := &Fixture{
		Mesh:    "home",
		Overlay: netip.MustParsePrefix("fd7a:115c:a1e0::/48"),
		VIP:     netip.MustParseAddr("fd7a:115c:a1e0::1:100"),
		A:       Node{"a", netip.MustParseAddr("fd7a:115c:a1e0::1:1"), KeyFor("a")},
		B:       Node{"b", netip.MustParseAddr("fd7a:115c:a1e0::1:2"), KeyFor("b")},
		C:       Node{"c", netip.MustParseAddr("fd7a:115c:a1e0::1:3"), KeyFor("c")},
		D:       Node{"d", netip.MustParseAddr("fd7a:115c:a1e0::1:4"), KeyFor("d")},
		Root:    KeyFor("root"),
	}
	var nodes []claim.TrustedNode
	for _, n := range []Node{f.A, f.B, f.C, f.D} {
		nodes = append(nodes, claim.TrustedNode{ID: n.Name, Addr: n.Addr, Key: n.Pub()})
	}
	t, err := claim.NewTrust(nodes, []claim.PublicKey{claim.KeyOf(f.Root)})
	if err != nil {
		panic(err)
	}
	f.Trust = t
	f.Pair = f.NewPair(f.VIP, f.A, f.B, f.A.Key, f.B.Key)
	return f
}

// NewPair returns a pair record for vip and members x, y signed by signers.
func (f *Fixture) NewPair(vip netip.Addr, x, y Node, signers ...ed25519.PrivateKey) *claim.PairRecord {
	p, err := claim.NewPairRecord(f.Mesh, vip, claim.Member{Addr: x.Addr, Key: x.Pub()}, claim.Member{Addr: y.Addr, Key: y.Pub()})
	if err != nil {
		panic(err)
	}
	for _, k := range signers {
		if err := p.Sign(k); err != nil {
			panic(err)
		}
	}
	return p
}

// Policy returns a fresh policy for the fixture's mesh.
func (f *Fixture) Policy() *claim.Policy {
	return &claim.Policy{Mesh: f.Mesh, Trust: f.Trust, Overlay: f.Overlay}
}

// Claim signs a claim of n at epoch under the fixture's pair.
func (f *Fixture) Claim(n Node, epoch uint64) *claim.Claim {
	c, err := claim.NewClaim(n.Key, n.Addr, epoch, f.Pair)
	if err != nil {
		panic(err)
	}
	return c
}

var _ claim.HandOverChannel = (*DirectChannel)(nil)

// DirectChannel is a members' channel in process: it calls the peer's
// controller as the HTTP server would, with refusals as *claim.RefusalError.
type DirectChannel struct {
	From netip.Addr
	// Target returns the peer's controller, or an error when the peer is
	// unreachable or down.
	Target func(peer netip.Addr) (*claim.Controller, error)
	// BeforeEpoch, when set, can fail an epoch query before it is sent.
	BeforeEpoch func() error
	// AfterRelease, when set, runs after a release that the peer answered.
	AfterRelease func()
	// BeforeHandOver, when set, runs before a hand-over request is sent
	// and can fail it (or block until ctx ends).
	BeforeHandOver func(ctx context.Context) error
}

// Announce implements claim.Channel.
func (d *DirectChannel) Announce(ctx context.Context, peer netip.Addr, c *claim.Claim) error {
	t, err := d.Target(peer)
	if err != nil {
		return err
	}
	return claim.Refusal(t.HandleClaim(ctx, d.From, c))
}

// Release implements claim.Channel.
func (d *DirectChannel) Release(ctx context.Context, peer netip.Addr, r *claim.Release) (*claim.Claim, error) {
	t, err := d.Target(peer)
	if err != nil {
		return nil, err
	}
	c, err := t.HandleRelease(ctx, d.From, r)
	if err == nil && d.AfterRelease != nil {
		d.AfterRelease()
	}
	return c, claim.Refusal(err)
}

// Epoch implements claim.Channel.
func (d *DirectChannel) Epoch(ctx context.Context, peer netip.Addr, _ netip.Addr) (*claim.Claim, error) {
	if d.BeforeEpoch != nil {
		if err := d.BeforeEpoch(); err != nil {
			return nil, err
		}
	}
	t, err := d.Target(peer)
	if err != nil {
		return nil, err
	}
	return t.HandleEpoch(ctx)
}

// HandOver implements claim.HandOverChannel.
func (d *DirectChannel) HandOver(ctx context.Context, peer netip.Addr, _ netip.Addr) error {
	if d.BeforeHandOver != nil {
		if err := d.BeforeHandOver(ctx); err != nil {
			return err
		}
	}
	t, err := d.Target(peer)
	if err != nil {
		return err
	}
	return claim.Refusal(t.HandleHandOver(ctx, d.From))
}
