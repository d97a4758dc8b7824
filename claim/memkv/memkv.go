// Package memkv is a claim.KV in memory with etcd's semantics, on a
// transport.Clock: one cluster-wide revision that every write bumps, keys
// with create and mod revisions and versions, transactions with compares on
// them, leases that expire on the clock and delete their keys, and watches
// that replay history from a revision.
//
// On a transporttest.ManualClock a KV is deterministic: leases expire inside
// the test's Advance calls, in deadline order. LeaderChange models what an
// etcd leader election does to leases (every lease gets its full TTL again,
// plus the election time), so simulations can put elections in their
// schedules.
//
// The same contract suite (package claim/kvtest) runs against this KV and a
// real etcd.
//
//	kv := memkv.New(memkv.Options{Clock: clock})
//	defer kv.Close()
//	id, _, _ := kv.Grant(ctx, 20*time.Second)
package memkv

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Options configures a KV. The zero value is usable: the real clock, a
// 1 s minimum TTL and 100,000 revisions of watch history.
type Options struct {
	Clock transport.Clock
	// MinTTL is the shortest lease granted; a shorter request is raised to
	// it, as etcd does with its minimum TTL. 0 means 1 s.
	MinTTL time.Duration
	// History is how many revisions of events a watch can replay. 0 means
	// 100,000; a watch from an older revision fails with claim.ErrCompacted.
	History int
}

// MaxTTL is the longest lease, etcd's limit (9,000,000,000 s).
const MaxTTL = 9_000_000_000 * time.Second

// KV is the in-memory claim.KV. It is safe for concurrent use. Close ends
// every watch and stops every lease timer.
type KV struct {
	clock   transport.Clock // +checklocksignore: set by New, read-only after
	minTTL  time.Duration   // +checklocksignore: set by New, read-only after
	history int             // +checklocksignore: set by New, read-only after

	// mu guards the store: revisions, keys, leases, events, watchers and
	// the closed flag.
	mu syncx.Mutex
	// +checklocks:mu
	rev int64
	// +checklocks:mu
	compacted int64 // oldest revision whose events are gone
	// +checklocks:mu
	keys map[string]*claim.KeyValue
	// +checklocks:mu
	leases map[claim.LeaseID]*lease
	// +checklocks:mu
	nextLease claim.LeaseID
	// +checklocks:mu
	events []revEvents
	// +checklocks:mu
	watchers map[*watcher]struct{}
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup
}

var _ claim.KV = (*KV)(nil)

type lease struct {
	id     claim.LeaseID
	ttl    time.Duration
	expiry time.Time
	keys   map[string]struct{}
	timer  transport.Timer
}

type revEvents struct {
	rev    int64
	events []claim.WatchEvent
}

// New returns an empty KV at revision 1.
func New(o Options) *KV {
	if o.MinTTL <= 0 {
		o.MinTTL = time.Second
	}
	if o.History <= 0 {
		o.History = 100_000
	}
	return &KV{
		clock: transport.Or(o.Clock), minTTL: o.MinTTL, history: o.History,
		rev: 1, keys: map[string]*claim.KeyValue{}, leases: map[claim.LeaseID]*lease{},
		watchers: map[*watcher]struct{}{},
	}
}

// +checklocks:k.mu
func (k *KV) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if k.closed {
		return claim.ErrClosed
	}
	return nil
}

// Revision returns the current revision.
func (k *KV) Revision() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rev
}

// Get implements claim.KV.
func (k *KV) Get(ctx context.Context, key string, prefix bool) (claim.GetResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check(ctx); err != nil {
		return claim.GetResponse{}, err
	}
	return k.getLocked(key, prefix), nil
}

// +checklocks:k.mu
func (k *KV) getLocked(key string, prefix bool) claim.GetResponse {
	r := claim.GetResponse{Revision: k.rev}
	if !prefix {
		if kv := k.keys[key]; kv != nil {
			r.KVs = []claim.KeyValue{cloneKV(kv)}
		}
		return r
	}
	for name, kv := range k.keys {
		if strings.HasPrefix(name, key) {
			r.KVs = append(r.KVs, cloneKV(kv))
		}
	}
	slices.SortFunc(r.KVs, func(a, b claim.KeyValue) int { return strings.Compare(a.Key, b.Key) })
	return r
}

func cloneKV(kv *claim.KeyValue) claim.KeyValue {
	c := *kv
	c.Value = slices.Clone(kv.Value)
	return c
}

// Txn implements claim.KV. All writes of a transaction share one revision;
// a transaction that writes nothing leaves the revision alone.
func (k *KV) Txn(ctx context.Context, t claim.Txn) (claim.TxnResponse, error) {
	if err := t.Validate(); err != nil {
		return claim.TxnResponse{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check(ctx); err != nil {
		return claim.TxnResponse{}, err
	}
	ok := true
	for _, c := range t.If {
		if !compare(k.keys[c.Key], c) {
			ok = false
			break
		}
	}
	ops := t.Then
	if !ok {
		ops = t.Else
	}
	// etcd refuses the whole request when a put names a lease that is gone.
	for _, o := range ops {
		if o.Kind == claim.OpPut && o.Lease != 0 && k.leases[o.Lease] == nil {
			return claim.TxnResponse{}, fmt.Errorf("%w: %d", claim.ErrLeaseNotFound, o.Lease)
		}
	}
	resp := claim.TxnResponse{Succeeded: ok}
	var evs []claim.WatchEvent
	next := k.rev + 1
	for _, o := range ops {
		switch o.Kind {
		case claim.OpGet:
			g := k.getLocked(o.Key, o.Prefix)
			resp.Gets = append(resp.Gets, g)
		case claim.OpPut:
			evs = append(evs, k.putLocked(next, o))
		case claim.OpDelete:
			evs = append(evs, k.deleteLocked(next, o.Key, o.Prefix)...)
		}
	}
	k.commitLocked(evs)
	for i := range resp.Gets {
		resp.Gets[i].Revision = k.rev
	}
	resp.Revision = k.rev
	return resp, nil
}

// compare reports whether c holds for kv (nil: the key is missing), as
// etcd decides it.
func compare(kv *claim.KeyValue, c claim.Compare) bool {
	if c.Target == claim.Value {
		return kv != nil && bytes.Equal(kv.Value, c.Value)
	}
	var got int64
	if kv != nil {
		if c.Target == claim.ModRevision {
			got = kv.ModRevision
		} else {
			got = kv.CreateRevision
		}
	}
	return got == c.Revision
}

// +checklocks:k.mu
func (k *KV) putLocked(rev int64, o claim.Op) claim.WatchEvent {
	kv := k.keys[o.Key]
	if kv == nil {
		kv = &claim.KeyValue{Key: o.Key, CreateRevision: rev}
		k.keys[o.Key] = kv
	}
	if kv.Lease != 0 && kv.Lease != o.Lease {
		if l := k.leases[kv.Lease]; l != nil {
			delete(l.keys, o.Key)
		}
	}
	kv.Value = slices.Clone(o.Value)
	kv.ModRevision = rev
	kv.Version++
	kv.Lease = o.Lease
	if l := k.leases[o.Lease]; l != nil {
		l.keys[o.Key] = struct{}{}
	}
	return claim.WatchEvent{Type: claim.EventPut, KV: cloneKV(kv)}
}

// +checklocks:k.mu
func (k *KV) deleteLocked(rev int64, key string, prefix bool) []claim.WatchEvent {
	var names []string
	if prefix {
		for name := range k.keys {
			if strings.HasPrefix(name, key) {
				names = append(names, name)
			}
		}
		slices.Sort(names)
	} else if k.keys[key] != nil {
		names = []string{key}
	}
	var evs []claim.WatchEvent
	for _, name := range names {
		kv := k.keys[name]
		if l := k.leases[kv.Lease]; l != nil {
			delete(l.keys, name)
		}
		delete(k.keys, name)
		evs = append(evs, claim.WatchEvent{Type: claim.EventDelete, KV: claim.KeyValue{Key: name, ModRevision: rev}})
	}
	return evs
}

// commitLocked bumps the revision when evs holds writes, records them and
// hands them to the watchers.
// +checklocks:k.mu
func (k *KV) commitLocked(evs []claim.WatchEvent) {
	if len(evs) == 0 {
		return
	}
	k.rev++
	k.events = append(k.events, revEvents{rev: k.rev, events: evs})
	if over := len(k.events) - k.history; over > 0 {
		k.compacted = k.events[over-1].rev
		k.events = slices.Delete(k.events, 0, over)
	}
	for w := range k.watchers {
		w.offer(revEvents{rev: k.rev, events: evs})
	}
}

// Grant implements claim.KV.
func (k *KV) Grant(ctx context.Context, ttl time.Duration) (claim.LeaseID, time.Duration, error) {
	if ttl <= 0 || ttl > MaxTTL {
		return 0, 0, fmt.Errorf("%w: %v", claim.ErrInvalidTTL, ttl)
	}
	ttl = time.Duration(math.Ceil(ttl.Seconds())) * time.Second
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.check(ctx); err != nil {
		return 0, 0, err
	}
	if ttl < k.minTTL {
		ttl = k.minTTL
	}
	k.nextLease++
	l := &lease{id: k.nextLease, ttl: ttl, keys: map[string]struct{}{}}
	l.expiry = k.clock.Now().Add(ttl)
	l.timer = k.clock.AfterFunc(ttl, func() { k.expire(l) })
	k.leases[l.id] = l
	return l.id, ttl, nil
}

func (k *KV) expire(l *lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.leases[l.id] != l || k.closed {
		return
	}
	if left := l.expiry.Sub(k.clock.Now()); left > 0 {
		l.timer.Reset(left)
		return
	}
	k.revokeLocked(l)
}

// +checklocks:k.mu
func (k *KV) revokeLocked(l *lease) {
	l.timer.Stop()
	delete(k.leases, l.id)
	names := make([]string, 0, len(l.keys))
	for name := range l.keys {
		names = append(names, name)
	}
	slices.Sort(names)
	var evs []claim.WatchEvent
	for _, name := range names {
		evs = append(evs, k.deleteLocked(k.rev+1, name, false)...)
	}
	k.commitLocked(evs)
}

// KeepAliveOnce implements claim.KV.
func (k *KV) KeepAliveOnce(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, err := k.leaseLocked(ctx, id)
	if err != nil {
		return 0, err
	}
	l.expiry = k.clock.Now().Add(l.ttl)
	l.timer.Reset(l.ttl)
	return l.ttl, nil
}

// Revoke implements claim.KV.
func (k *KV) Revoke(ctx context.Context, id claim.LeaseID) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, err := k.leaseLocked(ctx, id)
	if err != nil {
		return err
	}
	k.revokeLocked(l)
	return nil
}

// TimeToLive implements claim.KV.
func (k *KV) TimeToLive(ctx context.Context, id claim.LeaseID) (time.Duration, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, err := k.leaseLocked(ctx, id)
	if err != nil {
		return 0, err
	}
	return l.expiry.Sub(k.clock.Now()), nil
}

// leaseLocked returns the live lease id, after the checks every call
// makes (ctx, closed); claim.ErrLeaseNotFound when there is none. k.mu is
// held.
// +checklocks:k.mu
func (k *KV) leaseLocked(ctx context.Context, id claim.LeaseID) (*lease, error) {
	if err := k.check(ctx); err != nil {
		return nil, err
	}
	l := k.leases[id]
	if l == nil {
		return nil, fmt.Errorf("%w: %d", claim.ErrLeaseNotFound, id)
	}
	return l, nil
}

// LeaderChange models an etcd leader election that ends now: like etcd's
// lessor on promotion, it gives every lease its full TTL again plus extend
// (etcd passes the election timeout), so one re-election never expires a
// lease that was being renewed.
func (k *KV) LeaderChange(extend time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.clock.Now()
	for _, l := range k.leases {
		l.expiry = now.Add(l.ttl + extend)
		l.timer.Reset(l.ttl + extend)
	}
}

// Leases returns the number of live leases.
func (k *KV) Leases() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.leases)
}

// Close ends every watch, stops every lease timer and waits for the watch
// goroutines to exit. Later calls fail with claim.ErrClosed.
func (k *KV) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	for _, l := range k.leases {
		l.timer.Stop()
	}
	for w := range k.watchers {
		w.stop()
	}
	k.mu.Unlock()
	k.wg.Wait()
	return nil
}

// Watch implements claim.KV. Each watch has one goroutine, which exits when
// ctx ends or the KV closes; events queue without bound meanwhile, so a slow
// reader never loses one.
func (k *KV) Watch(ctx context.Context, prefix string, rev int64) <-chan claim.WatchResponse {
	out := make(chan claim.WatchResponse)
	w := &watcher{prefix: prefix, out: out, wake: make(chan struct{}, 1), done: make(chan struct{})}
	k.mu.Lock()
	if k.closed || ctx.Err() != nil {
		k.mu.Unlock()
		close(out)
		return out
	}
	if rev > 0 {
		if rev <= k.compacted {
			w.queue = append(w.queue, claim.WatchResponse{Revision: k.rev, Err: fmt.Errorf("%w: watch from %d, oldest kept %d", claim.ErrCompacted, rev, k.compacted+1)})
			w.final = true
		} else {
			for _, e := range k.events {
				if e.rev >= rev {
					w.offer(e)
				}
			}
		}
	}
	if !w.final {
		k.watchers[w] = struct{}{}
	}
	k.wg.Add(1)
	k.mu.Unlock()
	go func() {
		defer k.wg.Done()
		w.pump(ctx)
		k.mu.Lock()
		delete(k.watchers, w)
		k.mu.Unlock()
	}()
	return out
}

type watcher struct {
	prefix string
	out    chan claim.WatchResponse
	wake   chan struct{}
	done   chan struct{}

	mu       syncx.Mutex
	queue    []claim.WatchResponse
	final    bool // the queue ends with an error
	stopOnce sync.Once
}

// offer queues the events of one revision that match the prefix. Called
// with the KV's lock held; never blocks.
func (w *watcher) offer(e revEvents) {
	var evs []claim.WatchEvent
	for _, ev := range e.events {
		if strings.HasPrefix(ev.KV.Key, w.prefix) {
			evs = append(evs, ev)
		}
	}
	if len(evs) == 0 {
		return
	}
	w.mu.Lock()
	w.queue = append(w.queue, claim.WatchResponse{Revision: e.rev, Events: evs})
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) stop() { w.stopOnce.Do(func() { close(w.done) }) }

func (w *watcher) pump(ctx context.Context) {
	defer close(w.out)
	for {
		w.mu.Lock()
		var next *claim.WatchResponse
		if len(w.queue) > 0 {
			r := w.queue[0]
			w.queue = w.queue[1:]
			next = &r
		}
		w.mu.Unlock()
		if next == nil {
			select {
			case <-w.wake:
				continue
			case <-ctx.Done():
				return
			case <-w.done:
				return
			}
		}
		select {
		case w.out <- *next:
			if next.Err != nil {
				return
			}
		case <-ctx.Done():
			return
		case <-w.done:
			return
		}
	}
}
