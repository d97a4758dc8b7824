package vip

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/crdt"
)

// testNet is a network of members, each with a replica and a registry,
// wired by hand (tests move snapshots between them explicitly).
type testNet struct {
	t      testing.TB
	netID  crdt.NetworkID
	prefix netip.Prefix
	keys   []ed25519.PrivateKey
	// mu guards nodes against the Registries' Nodes callbacks; the test's
	// goroutine, its only writer, writes under mu and reads without it
	// (which checklocks cannot express, so nodes carries no annotation).
	mu      sync.Mutex
	nodes   []NodeInfo
	regs    []*Registry
	members []crdt.AuthorID
	// hostileCtr is the counter of fields signed by hand (hostileField).
	hostileCtr uint64
}

func newTestNet(t testing.TB, n int, seed uint64) *testNet {
	tn := &testNet{t: t, prefix: netip.MustParsePrefix("100.80.0.0/16")}
	copy(tn.netID[:], "test-network-id!")
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range n {
		var s [32]byte
		for j := range s {
			s[j] = byte(rng.Uint32())
		}
		k := ed25519.NewKeyFromSeed(s[:])
		tn.keys = append(tn.keys, k)
		var id NodeID
		copy(id[:], k.Public().(ed25519.PublicKey))
		tn.nodes = append(tn.nodes, NodeInfo{ID: id, Name: fmt.Sprintf("server%d", i+1), Addr: netip.AddrFrom4([4]byte{100, 80, 0, byte(i + 1)})})
		tn.members = append(tn.members, crdt.AuthorID(id))
	}
	for i := range n {
		tn.regs = append(tn.regs, tn.open(i, crdt.NewMemStore(), Limits{}))
	}
	return tn
}

func (tn *testNet) open(i int, store crdt.Store, lim Limits) *Registry {
	tn.t.Helper()
	rep, err := crdt.Open(context.Background(), crdt.Config{Network: tn.netID, Signer: tn.keys[i], Members: tn.members, Store: store, Obsolete: Obsolete, Check: CheckField, Rank: Rank})
	if err != nil {
		tn.t.Fatal(err)
	}
	tn.t.Cleanup(func() { rep.Close() })
	reg, err := NewRegistry(RegistryOptions{Network: "home", Prefix: tn.prefix, Replica: rep, Nodes: tn.nodeList, Limits: lim,
		Rand: rand.NewChaCha8([32]byte{byte(i), 99})})
	if err != nil {
		tn.t.Fatal(err)
	}
	return reg
}

func (tn *testNet) nodeList() []NodeInfo {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return append([]NodeInfo(nil), tn.nodes...)
}

// sync copies every snapshot of from into to.
func (tn *testNet) sync(from, to int) {
	tn.t.Helper()
	src, dst := tn.regs[from].Replica(), tn.regs[to].Replica()
	var changed []ServiceID
	for _, in := range src.Services() {
		snap, _ := src.EncodedSnapshot(in.ID)
		res, err := dst.MergeSnapshot(context.Background(), snap)
		if err != nil {
			tn.t.Fatalf("merge %d→%d: %v", from, to, err)
		}
		for _, id := range res.Changed {
			changed = append(changed, ServiceID(id))
		}
	}
	tn.regs[to].Merged(changed)
}

func TestRegistryMutations(t *testing.T) {
	tn := newTestNet(t, 3, 1)
	ctx := context.Background()
	r := tn.regs[0]
	v, err := r.Create(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if !v.Addr.IsValid() || !tn.prefix.Contains(v.Addr) || v.Revision == "" || !v.Routable {
		t.Fatalf("created %+v", v)
	}
	for _, n := range tn.nodes {
		if v.Addr == n.Addr {
			t.Fatalf("VIP took node %s's address", n.Name)
		}
	}
	if _, err := r.Create(ctx, "api"); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := r.Create(ctx, "server1"); !errors.Is(err, ErrExists) {
		t.Fatalf("node's name: %v", err)
	}
	b1, err := r.ResolveBackend("server1:6443")
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := r.ResolveBackend("server2:7443")
	v, err = r.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := v.Listener(PortKey{TCP, 443})
	if len(l.Backends) != 2 || l.Generation == 0 {
		t.Fatalf("listener %+v", l)
	}
	b3, _ := r.ResolveBackend(tn.nodes[2].ID.String()[:10] + ":6443") // id prefix
	if v, err = r.BackendAdd(ctx, "api", PortKey{TCP, 443}, b3); err != nil {
		t.Fatal(err)
	}
	if v, err = r.BackendRemove(ctx, "api", PortKey{TCP, 443}, b2); err != nil {
		t.Fatal(err)
	}
	off := false
	iv := Duration(5e9)
	if v, err = r.PortSet(ctx, v.ID.String()[:6], PortKey{TCP, 443}, PortSettings{PortCheck: &off, Interval: &iv}); err != nil {
		t.Fatal(err)
	}
	l, _ = v.Listener(PortKey{TCP, 443})
	if l.Check.Enabled() || l.Check.Interval != iv || len(l.Backends) != 2 || !containsBackend(l.Backends, b3) || containsBackend(l.Backends, b2) {
		t.Fatalf("after edits: %+v", l)
	}
	if _, err := r.PortAdd(ctx, "api", PortKey{UDP, 53}, []Backend{b1}); err != nil {
		t.Fatal(err)
	}
	// Renaming a node keeps it a backend: backends hold identities.
	tn.mu.Lock()
	tn.nodes[0].Name = "renamed"
	tn.mu.Unlock()
	r.Refresh()
	v, _ = r.Get("api")
	l, _ = v.Listener(PortKey{UDP, 53})
	if len(l.Backends) != 1 || l.Backends[0].Node != tn.nodes[0].ID {
		t.Fatalf("renamed node lost: %+v", l)
	}
	if _, err := r.ResolveBackend("renamed:53"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PortRemove(ctx, "api", PortKey{UDP, 53}); err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(ctx, "api", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get("api"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after remove: %v", err)
	}
	// Recreating gives a fresh id.
	v2, err := r.Create(ctx, "api")
	if err != nil || v2.ID == v.ID {
		t.Fatalf("recreate: %v %v", v2.ID, err)
	}
}

func containsBackend(bs []Backend, b Backend) bool {
	for _, x := range bs {
		if x == b {
			return true
		}
	}
	return false
}

func TestStaleDraftRefusedAndNothingWritten(t *testing.T) {
	tn := newTestNet(t, 2, 2)
	ctx := context.Background()
	r := tn.regs[0]
	v, _ := r.Create(ctx, "api")
	shown := v.Revision
	draft := v.Service.Clone()
	draft.Listeners = append(draft.Listeners, Listener{Proto: TCP, Port: 80, Backends: []Backend{{tn.nodes[1].ID, 80}}})
	// Someone else edits meanwhile (here: the same node's CLI).
	if _, err := r.PortAdd(ctx, "api", PortKey{TCP, 22}, nil); err != nil {
		t.Fatal(err)
	}
	cur, _ := r.Get("api")
	_, err := r.Save(ctx, draft, shown)
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) || ce.Current != cur.Revision || ce.Shown != shown {
		t.Fatalf("stale save: %v", err)
	}
	after, _ := r.Get("api")
	if after.Revision != cur.Revision || len(after.Listeners) != 1 {
		t.Fatalf("stale draft wrote something: %+v", after)
	}
	// Reloaded, the same draft saves.
	draft = after.Service.Clone()
	draft.Listeners = append(draft.Listeners, Listener{Proto: TCP, Port: 80, Backends: []Backend{{tn.nodes[1].ID, 80}}})
	if _, err := r.Save(ctx, draft, after.Revision); err != nil {
		t.Fatal(err)
	}
	// An invalid draft is refused with its specific message, and nothing is written.
	before, _ := r.Get("api")
	bad := before.Service.Clone()
	bad.Listeners[0].Backends = append(bad.Listeners[0].Backends, Backend{NodeID{9}, 1})
	if _, err := r.Save(ctx, bad, before.Revision); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not a member") {
		t.Fatalf("invalid draft: %v", err)
	}
	if again, _ := r.Get("api"); again.Revision != before.Revision {
		t.Fatal("invalid draft changed the revision")
	}
}

func TestAmbiguousSelectorChangesNothing(t *testing.T) {
	tn := newTestNet(t, 2, 3)
	ctx := context.Background()
	r := tn.regs[0]
	var ids []string
	for i := 0; len(ids) < 2 || ids[0][0] != ids[1][0]; i++ {
		// Create until two services share a first hex digit.
		v, err := r.Create(ctx, fmt.Sprintf("svc%d", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID.String())
		for j := 0; j < len(ids)-1; j++ {
			if ids[j][0] == v.ID.String()[0] {
				ids = []string{ids[j], v.ID.String()}
				break
			}
		}
	}
	revs := map[ServiceID]Revision{}
	for _, v := range r.List() {
		revs[v.ID] = v.Revision
	}
	_, err := r.PortAdd(ctx, ids[0][:1], PortKey{TCP, 1}, nil)
	var ae *AmbiguousError
	if !errors.As(err, &ae) || len(ae.Candidates) < 2 {
		t.Fatalf("ambiguous prefix: %v", err)
	}
	for _, v := range r.List() {
		if revs[v.ID] != v.Revision {
			t.Fatal("an ambiguous selector changed a service")
		}
	}
}

// TestConcurrentEditsMerge: edits of different backends on two nodes
// during a partition merge; one field edited on both resolves the same way
// on both.
func TestConcurrentEditsMerge(t *testing.T) {
	tn := newTestNet(t, 2, 4)
	ctx := context.Background()
	a, b := tn.regs[0], tn.regs[1]
	v, _ := a.Create(ctx, "api")
	if _, err := a.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{tn.nodes[0].ID, 1}}); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	// Partitioned: each adds a backend, and both change the interval.
	ia, ib := Duration(4e9), Duration(6e9)
	if _, err := a.BackendAdd(ctx, "api", PortKey{TCP, 443}, Backend{tn.nodes[0].ID, 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PortSet(ctx, "api", PortKey{TCP, 443}, PortSettings{Interval: &ia}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.BackendAdd(ctx, "api", PortKey{TCP, 443}, Backend{tn.nodes[1].ID, 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PortSet(ctx, "api", PortKey{TCP, 443}, PortSettings{Interval: &ib}); err != nil {
		t.Fatal(err)
	}
	tn.sync(0, 1)
	tn.sync(1, 0)
	va, _ := a.ByID(v.ID)
	vb, _ := b.ByID(v.ID)
	if va.Revision != vb.Revision {
		t.Fatalf("revisions differ after heal: %s %s", va.Revision, vb.Revision)
	}
	l, _ := va.Listener(PortKey{TCP, 443})
	if len(l.Backends) != 3 {
		t.Fatalf("backends did not merge: %+v", l.Backends)
	}
	lb, _ := vb.Listener(PortKey{TCP, 443})
	if l.Check.Interval != lb.Check.Interval || (l.Check.Interval != ia && l.Check.Interval != ib) {
		t.Fatalf("conflicting field resolved differently: %v vs %v", l.Check.Interval, lb.Check.Interval)
	}
}

// TestRemovedListenerBackendsNeverReappear: a port removed and added again
// gets a new generation; replaying the old backend fields (an old snapshot
// from a returning replica) does not bring them back.
func TestRemovedListenerBackendsNeverReappear(t *testing.T) {
	tn := newTestNet(t, 2, 5)
	ctx := context.Background()
	a := tn.regs[0]
	v, _ := a.Create(ctx, "api")
	old := Backend{tn.nodes[1].ID, 7443}
	if _, err := a.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{old}); err != nil {
		t.Fatal(err)
	}
	stale, _ := a.Replica().EncodedSnapshot(crdt.ServiceID(v.ID))
	if _, err := a.PortRemove(ctx, "api", PortKey{TCP, 443}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{tn.nodes[0].ID, 6443}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Replica().MergeSnapshot(ctx, stale); err != nil {
		t.Fatal(err)
	}
	a.Merged([]ServiceID{v.ID})
	got, _ := a.Get("api")
	l, _ := got.Listener(PortKey{TCP, 443})
	if len(l.Backends) != 1 || l.Backends[0].Port != 6443 {
		t.Fatalf("old backend reappeared: %+v", l.Backends)
	}
	// The old generation's fields were dropped as obsolete.
	for _, f := range a.Replica().Fields(crdt.ServiceID(v.ID)) {
		if strings.Contains(f.Key, "/7443") {
			t.Fatalf("obsolete field kept: %q", f.Key)
		}
	}
}

// TestMergedOverLimitLeftOutOfRouting: two nodes each add backends within
// the limit; the merge exceeds it and the service is reported and not
// routed, on both, whatever the arrival order.
func TestMergedOverLimitLeftOutOfRouting(t *testing.T) {
	tn := newTestNet(t, 2, 6)
	ctx := context.Background()
	lim := Limits{BackendsPerListener: 3}
	tn.regs[0] = tn.open(0, crdt.NewMemStore(), lim)
	tn.regs[1] = tn.open(1, crdt.NewMemStore(), lim)
	a, b := tn.regs[0], tn.regs[1]
	v, _ := a.Create(ctx, "api")
	a.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{tn.nodes[0].ID, 1}})
	tn.sync(0, 1)
	a.BackendAdd(ctx, "api", PortKey{TCP, 443}, Backend{tn.nodes[0].ID, 2})
	a.BackendAdd(ctx, "api", PortKey{TCP, 443}, Backend{tn.nodes[0].ID, 3})
	b.BackendAdd(ctx, "api", PortKey{TCP, 443}, Backend{tn.nodes[1].ID, 4})
	tn.sync(1, 0)
	tn.sync(0, 1)
	for i, r := range []*Registry{a, b} {
		got, _ := r.ByID(v.ID)
		var le *LimitError
		if got.Routable || !errors.As(got.Error(), &le) || le.Limit != "BackendsPerListener" || !strings.Contains(got.Err, "limit of 3") {
			t.Fatalf("node %d: over-limit merge: routable=%v err=%v", i, got.Routable, got.Error())
		}
	}
}

func TestLookupForDNS(t *testing.T) {
	tn := newTestNet(t, 2, 8)
	ctx := context.Background()
	r := tn.regs[0]
	v, _ := r.Create(ctx, "api")
	if a, ok := r.Lookup("api"); !ok || a != v.Addr {
		t.Fatalf("api → %v %v, want %v", a, ok, v.Addr)
	}
	if a, ok := r.Lookup("server2"); !ok || a != tn.nodes[1].Addr {
		t.Fatalf("node name → %v %v", a, ok)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Fatal("unknown name resolved")
	}
	dns, err := NewDNSServer(DNSOptions{Domain: r.Network(), Lookup: r.Lookup})
	if err != nil || dns == nil {
		t.Fatal(err)
	}
}
