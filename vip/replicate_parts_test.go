package vip

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// queuedFrame is a frame a queueCarrier holds for delivery.
type queuedFrame struct {
	from, to NodeID
	frame    []byte
}

// frameQueue holds the frames of several replicators until the test
// delivers them, in order: the control plane without a network.
type frameQueue struct {
	mu sync.Mutex
	// +checklocks:mu
	q []queuedFrame
}

func (fq *frameQueue) take() []queuedFrame {
	fq.mu.Lock()
	defer fq.mu.Unlock()
	q := fq.q
	fq.q = nil
	return q
}

// queueCarrier is one replicator's Carrier on a frameQueue.
type queueCarrier struct {
	fq   *frameQueue
	self NodeID
}

func (c queueCarrier) Send(_ context.Context, to NodeID, frame []byte) error {
	c.fq.mu.Lock()
	defer c.fq.mu.Unlock()
	c.fq.q = append(c.fq.q, queuedFrame{c.self, to, append([]byte(nil), frame...)})
	return nil
}

// openLimited opens node i of tn on a fresh MemStore with crdt limits cl
// and registry limits vl.
func openLimited(t *testing.T, tn *testNet, i int, cl crdt.Limits, vl Limits) *Registry {
	t.Helper()
	rep, err := crdt.Open(context.Background(), crdt.Config{Network: tn.netID, Signer: tn.keys[i], Members: tn.members, Store: crdt.NewMemStore(),
		Obsolete: Obsolete, Check: CheckField, Rank: Rank, Limits: cl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	reg, err := NewRegistry(RegistryOptions{Network: "home", Prefix: tn.prefix, Replica: rep, Nodes: tn.nodeList, Limits: vl,
		Rand: rand.NewChaCha8([32]byte{byte(i), 98})})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// createDelete creates and deletes n services on reg (names prefix0...),
// one at a time, and then creates keep services that stay.
func createDelete(t *testing.T, reg *Registry, prefix string, n, keep int) {
	t.Helper()
	ctx := context.Background()
	for i := range n + keep {
		name := fmt.Sprintf("%s%d", prefix, i)
		if _, err := reg.Create(ctx, name); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if i < n {
			if err := reg.Remove(ctx, name, ""); err != nil {
				t.Fatalf("remove %s (deletion %d): %v", name, i+1, err)
			}
		}
	}
}

// copyAll merges every snapshot of from into to.
func copyAll(t *testing.T, from, to *Registry) {
	t.Helper()
	var snaps [][]byte
	for _, in := range from.Replica().Services() {
		s, _ := from.Replica().EncodedSnapshot(in.ID)
		snaps = append(snaps, s)
	}
	for _, s := range snaps {
		if _, err := to.Replica().MergeSnapshot(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

// repairUntilEqual runs a's and b's replicators on a manual clock, each
// sending its digest to the other every period and the test delivering
// every frame, until b holds exactly what a holds, for at most periods
// rotations. It returns the rotations it took.
func repairUntilEqual(t *testing.T, tn *testNet, a, b *Registry, periods int) (int, *Replicator, *Replicator) {
	t.Helper()
	clock := transporttest.NewManualClock()
	fq := &frameQueue{}
	ids := [2]NodeID{tn.nodes[0].ID, tn.nodes[1].ID}
	regs := map[NodeID]*Registry{ids[0]: a, ids[1]: b}
	reps := map[NodeID]*Replicator{}
	for i, id := range ids {
		other := ids[1-i]
		rep, err := NewReplicator(ReplicatorOptions{Registry: regs[id], Carrier: queueCarrier{fq, id}, Peers: func() []NodeID { return []NodeID{other} },
			Clock: clock, NoPublishOnChange: true, Seed: uint64(i + 1),
			// The digest alone: compaction would drop the markers whose
			// repair these tests count.
			NoCompaction: true})
		if err != nil {
			t.Fatal(err)
		}
		reps[id] = rep
		rep.Start()
		t.Cleanup(rep.Stop)
	}
	same := func() bool {
		x, y := a.Replica().Services(), b.Replica().Services()
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i].ID != y[i].ID || x[i].Revision != y[i].Revision {
				return false
			}
		}
		return true
	}
	for p := 1; p <= periods; p++ {
		clock.Advance(DefaultRotation)
		for q := fq.take(); len(q) > 0; q = fq.take() {
			for _, f := range q {
				if err := reps[f.to].HandleFrame(context.Background(), f.from, f.frame); err != nil {
					t.Logf("period %d: frame to %s: %v", p, f.to.String()[:8], err)
				}
			}
		}
		if same() {
			return p, reps[ids[0]], reps[ids[1]]
		}
	}
	return -1, reps[ids[0]], reps[ids[1]]
}

// TestDigestOverFrameLimitRepairs: with the deletion history raised to
// 3000 and 2800 deletions, the digest (67,205 bytes) outgrows the 65,539
// byte frame limit. It goes in parts, so that a replica that returns
// empty is repaired completely and no frame is refused for its size.
func TestDigestOverFrameLimitRepairs(t *testing.T) {
	tn := newTestNet(t, 2, testenv.Seed(t, 37))
	cl := crdt.Limits{MaxTombstones: 3000}
	vl := Limits{Tombstones: 3000}
	a, b := openLimited(t, tn, 0, cl, vl), openLimited(t, tn, 1, cl, vl)
	createDelete(t, a, "s", 2800, 0)
	if got := len(a.Replica().Services()); got != 2800 {
		t.Fatalf("a holds %d services, want 2800 tombstones", got)
	}
	periods, ra, rb := repairUntilEqual(t, tn, a, b, 10)
	sa, sb := ra.Stats(), rb.Stats()
	t.Logf("a: %+v", sa)
	t.Logf("b: %+v", sb)
	if periods < 0 {
		t.Fatalf("after 10 rotations b holds %d of a's %d services; a sent %d frames, %d rejected", len(b.Replica().Services()), 2800, sa.FramesSent, sa.Rejected)
	}
	if sa.Rejected+sb.Rejected != 0 {
		t.Errorf("%d frames rejected, want none", sa.Rejected+sb.Rejected)
	}
	t.Logf("b repaired with all 2800 tombstones after %d rotation periods", periods)
}

// TestDigestPartsRepairAtHeldCaps: a replica holds what merges may bring
// at most, the hard caps (twice the limits: 128 active services and 1200
// tombstones here), and the frame limit is small (2,051 bytes, 83
// services a part), so that its digest of 1328 services goes in 16
// parts. A replica that returns empty gets all of it, and after that the
// digest exchange finds nothing to send.
func TestDigestPartsRepairAtHeldCaps(t *testing.T) {
	tn := newTestNet(t, 3, testenv.Seed(t, 38))
	cl := crdt.Limits{MaxTombstones: 600, MaxSnapshotBytes: 2048}
	vl := Limits{Tombstones: 600}
	a, b, c := openLimited(t, tn, 0, cl, vl), openLimited(t, tn, 1, cl, vl), openLimited(t, tn, 2, cl, vl)
	// a and c, apart, each delete up to the limit and keep the most
	// active services; a then merges c's: the hard caps.
	createDelete(t, a, "a", 600, crdt.DefaultMaxServices)
	createDelete(t, c, "c", 600, crdt.DefaultMaxServices)
	copyAll(t, c, a)
	held := a.Replica().Services()
	tombs := 0
	for _, in := range held {
		if in.Deleted {
			tombs++
		}
	}
	if tombs != 1200 || len(held)-tombs != 2*crdt.DefaultMaxServices {
		t.Fatalf("a holds %d tombstones and %d active services, want the caps 1200 and %d", tombs, len(held)-tombs, 2*crdt.DefaultMaxServices)
	}
	periods, ra, rb := repairUntilEqual(t, tn, a, b, 10)
	if periods < 0 {
		t.Fatalf("after 10 rotations b holds %d of a's %d services", len(b.Replica().Services()), len(held))
	}
	if parts := len(ra.digestParts()); parts != 16 {
		t.Errorf("a's digest went in %d parts, want 16", parts)
	}
	for _, part := range ra.digestParts() {
		if len(part) > ra.FrameLimit() {
			t.Fatalf("a digest part of %d bytes, over the limit %d", len(part), ra.FrameLimit())
		}
	}
	if r := ra.Stats().Rejected + rb.Stats().Rejected; r != 0 {
		t.Errorf("%d frames rejected, want none", r)
	}
	// In sync: a rotation sends the 16 digest parts each way and nothing
	// else, no snapshot and no request.
	if p, ra2, rb2 := repairUntilEqual(t, tn, a, b, 1); p != 1 || ra2.Stats().FramesSent != 16 || rb2.Stats().FramesSent != 16 {
		t.Errorf("in sync, one rotation: a sent %d frames, b %d; want the 16 digest parts each", ra2.Stats().FramesSent, rb2.Stats().FramesSent)
	}
	t.Logf("b repaired with %d services (%d tombstones) after %d rotation periods", len(held), tombs, periods)
}

// TestDigestPartPushesOnlyItsRange: a digest part speaks for the ids
// between its bounds alone: the receiver pushes what it holds there that
// the part lacks, nothing outside, and never asks for a bound.
func TestDigestPartPushesOnlyItsRange(t *testing.T) {
	tn := newTestNet(t, 2, testenv.Seed(t, 39))
	reg := tn.regs[0]
	createDelete(t, reg, "s", 0, 10)
	held := reg.Replica().Services()
	cc := newCountCarrier()
	rep, err := NewReplicator(ReplicatorOptions{Registry: reg, Carrier: cc, Peers: func() []NodeID { return nil },
		Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	from := tn.nodes[1].ID
	part := appendDigest(nil, held[3:5], &held[2].ID, &held[7].ID)
	if err := rep.HandleFrame(context.Background(), from, part); err != nil {
		t.Fatal(err)
	}
	frames, bytes := cc.sent(from)
	want := held[5].SnapshotBytes + held[6].SnapshotBytes + 2*frameHeader
	if frames != 2 || bytes != want {
		t.Errorf("a part for (s2, s7) listing s3, s4: %d frames, %d bytes sent; want the snapshots of s5 and s6 (%d bytes)", frames, bytes, want)
	}
	// The same services without bounds: a whole digest, as from an agent
	// that never splits: everything it lacks is pushed.
	cc = newCountCarrier()
	rep.o.Carrier = cc
	if err := rep.HandleFrame(context.Background(), from, appendDigest(nil, held[3:5], nil, nil)); err != nil {
		t.Fatal(err)
	}
	if frames, _ := cc.sent(from); frames != 8 {
		t.Errorf("a whole digest listing 2 of 10: %d frames sent, want 8 snapshots", frames)
	}
	// Bounds among the services bound nothing; bounds are never asked for.
	cc = newCountCarrier()
	rep.o.Carrier = cc
	odd := appendDigest(nil, []crdt.ServiceInfo{held[3], {ID: held[4].ID, Revision: crdt.NoRevision}, held[5]}, nil, nil)
	if err := rep.HandleFrame(context.Background(), from, odd); err != nil {
		t.Fatal(err)
	}
	if frames, _ := cc.sent(from); frames != 8 {
		t.Errorf("a digest with a bound among its services: %d frames sent, want the 8 snapshots it lacks (s4 included)", frames)
	}
}

// TestReplicatorRefusesFrameLimitBelowDigestPart: a control frame limit
// too small for one service between two bounds (76 bytes) is refused at
// start with the figures; 76 is accepted.
func TestReplicatorRefusesFrameLimitBelowDigestPart(t *testing.T) {
	tn := newTestNet(t, 1, testenv.Seed(t, 40))
	for _, c := range []struct {
		snap int
		ok   bool
	}{{minDigestPart - frameHeader - 1, false}, {minDigestPart - frameHeader, true}, {minDigestPart - frameHeader + 1, true}} {
		reg := openLimited(t, tn, 0, crdt.Limits{MaxSnapshotBytes: c.snap}, Limits{})
		_, err := NewReplicator(ReplicatorOptions{Registry: reg, Carrier: newCountCarrier(), Peers: func() []NodeID { return nil }})
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidOptions)) {
			t.Errorf("MaxSnapshotBytes %d (frame limit %d): %v, want ok %v", c.snap, c.snap+frameHeader, err, c.ok)
		}
		if c.ok {
			if got := digestPartEntries(c.snap + frameHeader); got < 1 {
				t.Errorf("frame limit %d: %d services a part", c.snap+frameHeader, got)
			}
		}
	}
	if minDigestPart != 76 {
		t.Errorf("minDigestPart = %d, want 76", minDigestPart)
	}
}

// fillBig adds listeners udp/base.. to service name on reg, with backends
// until the service is at its field limit: 15 listeners of 11 backends,
// 182 fields with its name and address.
func fillBig(t *testing.T, tn *testNet, reg *Registry, name string, base uint16) {
	t.Helper()
	ctx := context.Background()
	for l := range uint16(15) {
		var bs []Backend
		for b := range uint16(11) {
			bs = append(bs, Backend{Node: tn.nodes[int(b)%2].ID, Port: base + 100*l + b})
		}
		if _, err := reg.PortAdd(ctx, name, PortKey{Proto: UDP, Port: base + l}, bs); err != nil {
			t.Fatalf("%s: add udp/%d: %v", name, base+l, err)
		}
	}
}

// TestDigestRepairAtLargestLimits: two replicas filled differently up to
// raised limits repair to the same state. crdt.Limits and vip.Limits have
// no upper bound of their own, so "largest" is what can be set and filled
// here: the control frame at the largest tsng's control channel carries
// (2^24-1 bytes with its header), one service on each side at its field
// limit, so that the merged service sits near its hard cap (362 of 384
// fields, 60 KiB); then, under a small frame so that both sides' digests
// go in parts, deletions and services on each side that fill limits
// raised to 600 tombstones and 128 services once merged.
func TestDigestRepairAtLargestLimits(t *testing.T) {
	for _, c := range []struct {
		name      string
		frame     int // MaxSnapshotBytes
		big       bool
		del, keep int // on each side
	}{
		// The registry decodes every service on each merge, the big one
		// too, so this case keeps fewer services to stay short.
		{"frame-16MiB", 1<<24 - 1 - frameHeader, true, 100, 20},
		{"frame-2KiB", 2048, false, 300, 63},
	} {
		t.Run(c.name, func(t *testing.T) {
			tn := newTestNet(t, 2, testenv.Seed(t, 41))
			cl := crdt.Limits{MaxServices: 128, MaxTombstones: 600, MaxSnapshotBytes: c.frame}
			vl := Limits{ActiveServices: 128, Tombstones: 600}
			a, b := openLimited(t, tn, 0, cl, vl), openLimited(t, tn, 1, cl, vl)
			if c.big {
				if _, err := a.Create(context.Background(), "big"); err != nil {
					t.Fatal(err)
				}
				copyAll(t, a, b)
				b.Refresh()
				fillBig(t, tn, a, "big", 1000)
				fillBig(t, tn, b, "big", 3000)
			}
			// Each side deletes and keeps services of its own: in the
			// second case, up to the tombstone limit and near the services
			// limit once merged.
			createDelete(t, a, "a", c.del, c.keep)
			createDelete(t, b, "b", c.del, c.keep)
			periods, ra, rb := repairUntilEqual(t, tn, a, b, 10)
			if periods < 0 {
				t.Fatalf("after 10 rotations: a holds %d services, b %d", len(a.Replica().Services()), len(b.Replica().Services()))
			}
			held := a.Replica().Services()
			if want := 2 * (c.del + c.keep); len(held) != want+btoi(c.big) {
				t.Errorf("%d services held, want %d", len(held), want+btoi(c.big))
			}
			if c.big {
				v, _ := a.Get("big")
				if n := len(a.Replica().Fields(crdt.ServiceID(v.ID))); n != 362 {
					t.Errorf("big holds %d fields, want 362", n)
				}
			}
			if r := ra.Stats().Rejected + rb.Stats().Rejected; r != 0 {
				t.Errorf("%d frames rejected, want none", r)
			}
			t.Logf("repaired after %d rotations; a's digest in %d parts", periods, len(ra.digestParts()))
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
