package vip

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// simMesh runs one Registry and Replicator per node of a testNet over a
// simulated network on the manual clock: control plane only.
type simMesh struct {
	tn    *testNet
	clock *transporttest.ManualClock
	net   *transporttest.Network
	sim   []*transporttest.Node
	reps  []*Replicator
	addr  map[NodeID]netip.AddrPort
	byAdr map[netip.AddrPort]NodeID
	errs  int
}

type simCarrier struct {
	m    *simMesh
	self int
}

func (c simCarrier) Send(_ context.Context, to NodeID, frame []byte) error {
	return c.m.sim[c.self].Send(c.m.addr[to], frame)
}

func newSimMesh(t testing.TB, n int, seed uint64, loss float64, publish bool) *simMesh {
	m := &simMesh{tn: newTestNet(t, n, seed), clock: transporttest.NewManualClock(), addr: map[NodeID]netip.AddrPort{}, byAdr: map[netip.AddrPort]NodeID{}}
	m.net = transporttest.NewNetwork(m.clock, seed)
	t.Cleanup(func() { m.net.Close() })
	if err := m.net.SetDefault(transporttest.LinkConfig{Latency: 20 * time.Millisecond, Jitter: 10 * time.Millisecond, Loss: loss}); err != nil {
		t.Fatal(err)
	}
	m.reps = make([]*Replicator, n)
	for i := range n {
		i := i
		nd := m.net.MustAddNode(m.tn.nodes[i].Name, transporttest.NodeOptions{Handler: func(p transporttest.Packet) {
			if err := m.reps[i].HandleFrame(context.Background(), m.byAdr[p.From], p.Data); err != nil {
				m.errs++
			}
		}})
		m.sim = append(m.sim, nd)
		m.addr[m.tn.nodes[i].ID] = nd.Addr()
		m.byAdr[nd.Addr()] = m.tn.nodes[i].ID
	}
	for i := range n {
		self := m.tn.nodes[i].ID
		peers := make([]NodeID, 0, n-1)
		for _, nd := range m.tn.nodes {
			if nd.ID != self {
				peers = append(peers, nd.ID)
			}
		}
		rep, err := NewReplicator(ReplicatorOptions{Registry: m.tn.regs[i], Carrier: simCarrier{m, i}, Peers: func() []NodeID { return peers },
			Clock: m.clock, NoPublishOnChange: !publish, Seed: seed + uint64(i)})
		if err != nil {
			t.Fatal(err)
		}
		m.reps[i] = rep
		m.tn.regs[i].o.OnChange = func(ids []ServiceID, local bool) {
			if local {
				rep.Publish(context.Background(), ids)
			}
		}
		rep.Start()
		t.Cleanup(rep.Stop)
	}
	return m
}

// holders counts the nodes whose replica holds service id at revision rev.
func (m *simMesh) holders(id ServiceID, rev Revision) int {
	n := 0
	for _, r := range m.tn.regs {
		if v, ok := r.ByID(id); ok && v.Revision == rev {
			n++
		}
	}
	return n
}

func runScale(t *testing.T, n int, maxPeriods int) {
	seed := testenv.Seed(t, 2026)
	m := newSimMesh(t, n, seed, 0.05, false)
	ctx := context.Background()
	origin := m.tn.regs[0]
	v, err := origin.Create(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	v, err = origin.PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{m.tn.nodes[1].ID, 6443}})
	if err != nil {
		t.Fatal(err)
	}
	periods := 0
	for m.holders(v.ID, v.Revision) < n {
		if periods == maxPeriods {
			t.Fatalf("after %d rotation periods only %d of %d nodes hold the edit", periods, m.holders(v.ID, v.Revision), n)
		}
		m.clock.Advance(DefaultRotation)
		periods++
	}
	var bytes, frames uint64
	for _, r := range m.reps {
		st := r.Stats()
		bytes += st.BytesSent
		frames += st.FramesSent
	}
	t.Logf("%d nodes, 5%% loss, publish-on-change off: every node holds the edit after %d rotation periods (%v); sent %.0f bytes and %.1f frames per node; network dropped %d",
		n, periods, time.Duration(periods)*DefaultRotation, float64(bytes)/float64(n), float64(frames)/float64(n), m.net.Stats().TotalDropped())
	if m.errs != 0 {
		t.Fatalf("%d frames were refused", m.errs)
	}
}

// TestReplicationScale200: with publish-on-change off, only the periodic
// rotation repairs; one edit reaches all 200 nodes under 5% loss within 10
// rotation periods.
func TestReplicationScale200(t *testing.T) { runScale(t, 200, 10) }

// TestReplicationScale1000 is the long run: 1,000 nodes.
func TestReplicationScale1000(t *testing.T) {
	if !testenv.Long() {
		t.Skip("long run: set VIPKIT_LONG=1")
	}
	runScale(t, 1000, 10)
}

// TestPartitionEditsMergeAfterHeal: configuration edits made on both sides
// of a partition reach every node after the heal, with publish on change.
func TestPartitionEditsMergeAfterHeal(t *testing.T) {
	seed := testenv.Seed(t, 77)
	m := newSimMesh(t, 4, seed, 0, true)
	ctx := context.Background()
	v, err := m.tn.regs[0].Create(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	m.clock.Advance(time.Second)
	if m.holders(v.ID, v.Revision) != 4 {
		t.Fatal("publish on change did not reach every node")
	}
	m.net.Partition(m.sim[:2], m.sim[2:])
	if _, err := m.tn.regs[0].PortAdd(ctx, "api", PortKey{TCP, 443}, []Backend{{m.tn.nodes[0].ID, 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.tn.regs[3].PortAdd(ctx, "api", PortKey{UDP, 53}, []Backend{{m.tn.nodes[3].ID, 53}}); err != nil {
		t.Fatal(err)
	}
	m.clock.Advance(5 * DefaultRotation)
	a, _ := m.tn.regs[1].ByID(v.ID)
	b, _ := m.tn.regs[2].ByID(v.ID)
	if len(a.Listeners) != 1 || len(b.Listeners) != 1 || a.Revision == b.Revision {
		t.Fatalf("partition leaked: %v / %v", a.Listeners, b.Listeners)
	}
	m.net.Heal()
	m.clock.Advance(5 * DefaultRotation)
	want, _ := m.tn.regs[0].ByID(v.ID)
	if len(want.Listeners) != 2 {
		t.Fatalf("merged service has %d listeners, want 2", len(want.Listeners))
	}
	if got := m.holders(v.ID, want.Revision); got != 4 {
		t.Fatalf("%d of 4 nodes hold the merged state", got)
	}
}

func TestHandleFrameRejectsBadInput(t *testing.T) {
	m := newSimMesh(t, 2, 5, 0, true)
	ctx := context.Background()
	r := m.reps[0]
	from := m.tn.nodes[1].ID
	cases := map[string][]byte{
		"short":       {frameMagic},
		"magic":       {0, frameVersion, frameSnapshot},
		"version":     {frameMagic, 9, frameSnapshot},
		"type":        {frameMagic, frameVersion, 99},
		"digest len":  {frameMagic, frameVersion, frameDigest, 5, 1, 2},
		"request len": {frameMagic, frameVersion, frameRequest, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"snapshot":    {frameMagic, frameVersion, frameSnapshot, 1, 2, 3},
	}
	before := len(m.tn.regs[0].Replica().Services())
	for name, f := range cases {
		if err := r.HandleFrame(ctx, from, f); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	big := make([]byte, r.FrameLimit()+1)
	copy(big, []byte{frameMagic, frameVersion, frameSnapshot})
	if err := r.HandleFrame(ctx, from, big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
	// A tampered snapshot is refused by crdt and changes nothing.
	v, _ := m.tn.regs[1].Create(ctx, "api")
	snap, _ := m.tn.regs[1].Replica().EncodedSnapshot(crdt.ServiceID(v.ID))
	snap[len(snap)-1] ^= 1
	if err := r.HandleFrame(ctx, from, snapshotFrame(snap)); !errors.Is(err, crdt.ErrBadSignature) {
		t.Fatalf("tampered snapshot: %v", err)
	}
	m.clock.Advance(time.Second) // the publish-on-change copy arrives intact
	if len(m.tn.regs[0].Replica().Services()) != before+1 {
		t.Fatal("intact snapshot not merged")
	}
	if r.Stats().Rejected != uint64(len(cases)+2) {
		t.Fatalf("rejected %d, want %d", r.Stats().Rejected, len(cases)+2)
	}
}

func FuzzHandleFrame(f *testing.F) {
	f.Add([]byte{frameMagic, frameVersion, frameDigest, 0})
	f.Add([]byte{frameMagic, frameVersion, frameRequest, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte{frameMagic, frameVersion, frameSnapshot, 1})
	m := newSimMesh(f, 2, 5, 0, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = m.reps[0].HandleFrame(context.Background(), m.tn.nodes[1].ID, b)
	})
}
