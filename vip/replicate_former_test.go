package vip

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// formerFrame encodes a former-member frame by hand: n as given, then the
// entries as given (unchecked, so tests can build bad ones).
func formerFrame(n uint64, entries ...crdt.FormerMember) []byte {
	f := []byte{frameMagic, frameVersion, frameFormer}
	f = binary.AppendUvarint(f, n)
	for _, e := range entries {
		f = append(f, e.Author[:]...)
		f = binary.AppendUvarint(f, e.LastCounter)
	}
	return f
}

func author(b byte) crdt.AuthorID {
	var a crdt.AuthorID
	a[0] = b
	return a
}

// TestFormerFrameRejectsBadInput: malformed former-member frames are
// ErrFrame, counted in Rejected, and change nothing.
func TestFormerFrameRejectsBadInput(t *testing.T) {
	m := newSimMesh(t, 2, 5, 0, false)
	ctx := context.Background()
	r := m.reps[0]
	from := m.tn.nodes[1].ID
	a, b := crdt.FormerMember{Author: author(1), LastCounter: 7}, crdt.FormerMember{Author: author(2), LastCounter: 9}
	overlongCount := []byte{frameMagic, frameVersion, frameFormer, 0x81, 0x00} // 1, in two bytes
	overlongCount = append(overlongCount, formerFrame(0, a)[4:]...)
	overlongCounter := formerFrame(1, a)
	overlongCounter = append(overlongCounter[:len(overlongCounter)-1], 0x87, 0x00) // 7, in two bytes
	cases := map[string][]byte{
		"empty body":         {frameMagic, frameVersion, frameFormer},
		"overlong count":     overlongCount,
		"overlong counter":   overlongCounter,
		"varint past end":    {frameMagic, frameVersion, frameFormer, 0xff},
		"huge count":         {frameMagic, frameVersion, frameFormer, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"count past frame":   formerFrame(2, a),
		"entry truncated":    formerFrame(1, a)[:3+1+20],
		"counter truncated":  append(formerFrame(1, crdt.FormerMember{Author: author(1), LastCounter: 300})[:3+1+32], 0x80),
		"out of order":       formerFrame(2, b, a),
		"duplicate author":   formerFrame(2, a, a),
		"trailing bytes":     append(formerFrame(1, a), 0),
		"trailing entry":     formerFrame(1, a, b),
		"counter past clock": formerFrame(1, crdt.FormerMember{Author: author(1), LastCounter: crdt.MaxClock + 1}),
	}
	for name, f := range cases {
		err := r.HandleFrame(ctx, from, f)
		if name == "counter past clock" {
			// Well formed, refused by crdt (MaxClock).
			if err == nil || errors.Is(err, ErrFrame) {
				t.Errorf("%s: %v, want a crdt refusal", name, err)
			}
			continue
		}
		if !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", name, err)
		}
	}
	st := r.Stats()
	if st.Rejected != uint64(len(cases)) {
		t.Fatalf("rejected %d, want %d", st.Rejected, len(cases))
	}
	if st.FormerReceived != 1 || st.FormerMerged != 0 {
		t.Fatalf("received %d merged %d, want 1 and 0", st.FormerReceived, st.FormerMerged)
	}
	if got := m.tn.regs[0].Replica().Former(); len(got) != 0 {
		t.Fatalf("bad frames changed the list: %v", got)
	}
	// The same entries well formed are merged; MaxClock is the highest
	// last counter taken.
	b.LastCounter = crdt.MaxClock
	if err := r.HandleFrame(ctx, from, formerFrame(2, a, b)); err != nil {
		t.Fatal(err)
	}
	if got := m.tn.regs[0].Replica().Former(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("list %v, want [%v %v]", got, a, b)
	}
	if st := r.Stats(); st.FormerMerged != 1 {
		t.Fatalf("merged %d, want 1", st.FormerMerged)
	}
}

// TestFormerListSplitAcrossFrames: a list larger than one frame is sent
// in several and arrives whole.
func TestFormerListSplitAcrossFrames(t *testing.T) {
	m := newSimMesh(t, 2, 6, 0, false)
	ctx := context.Background()
	src := m.tn.regs[0].Replica()
	// The default limit (64 KiB) holds the whole default list (1024
	// entries of at most 42 bytes); a smaller limit, set before the first
	// rotation, needs several frames for 1000 entries.
	for _, r := range m.reps {
		r.limit = 4096
	}
	var in []crdt.FormerMember
	for i := range 1000 {
		var a crdt.AuthorID
		binary.BigEndian.PutUint32(a[:], uint32(i+1))
		in = append(in, crdt.FormerMember{Author: a, LastCounter: uint64(i) << (i % 40)})
	}
	if _, err := src.MergeFormer(ctx, in); err != nil {
		t.Fatal(err)
	}
	frames := m.reps[0].formerFrames()
	if len(frames) < 2 {
		t.Fatalf("%d frames, want several", len(frames))
	}
	for i, f := range frames {
		if len(f) > m.reps[0].FrameLimit() {
			t.Fatalf("frame %d: %d bytes over the limit %d", i, len(f), m.reps[0].FrameLimit())
		}
	}
	for i := 0; i < 4 && !slicesEqualFormer(m.tn.regs[1].Replica().Former(), src.Former()); i++ {
		m.clock.Advance(DefaultRotation)
	}
	if !slicesEqualFormer(m.tn.regs[1].Replica().Former(), src.Former()) {
		t.Fatalf("receiver holds %d of %d entries", len(m.tn.regs[1].Replica().Former()), len(src.Former()))
	}
	if st := m.reps[1].Stats(); st.FormerReceived < uint64(len(frames)) {
		t.Fatalf("received %d former frames, want at least %d", st.FormerReceived, len(frames))
	}
	// The exchange ends: a rotation sends each part once, and the parts
	// answered (none, once the lists are equal) stay under one list.
	for i, r := range m.reps {
		st := r.Stats()
		if st.FormerSent > (st.Rotations+1)*uint64(len(frames)) {
			t.Fatalf("node %d sent %d former frames in %d rotations of %d frames each", i, st.FormerSent, st.Rotations, len(frames))
		}
	}
	t.Logf("%d entries in %d frames; sent %d and %d former frames", len(in), len(frames), m.reps[0].Stats().FormerSent, m.reps[1].Stats().FormerSent)
}

func slicesEqualFormer(a, b []crdt.FormerMember) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFormerMemberTrap: D creates service S, A adds a port, D deletes S
// and leaves. N joins afterwards and also gets a replay of S's old
// snapshot. S never appears at N, and every replica converges.
func TestFormerMemberTrap(t *testing.T) {
	seed := testenv.Seed(t, 29)
	ctx := context.Background()
	const A, B, D, N = 0, 1, 2, 3
	tn := newTestNet(t, 4, seed)
	ids := func(is ...int) []crdt.AuthorID {
		var out []crdt.AuthorID
		for _, i := range is {
			out = append(out, crdt.AuthorID(tn.nodes[i].ID))
		}
		return out
	}
	tn.members = ids(A, B, D)
	for _, i := range []int{A, B, D} {
		tn.regs[i] = tn.open(i, crdt.NewMemStore(), Limits{})
	}
	clock := transporttest.NewManualClock()
	net := transporttest.NewNetwork(clock, seed)
	t.Cleanup(func() { net.Close() })
	if err := net.SetDefault(transporttest.LinkConfig{Latency: 20 * time.Millisecond, Jitter: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		peerSet  = map[int][]int{A: {B, D}, B: {A, D}, D: {A, B}}
		reps     = make([]*Replicator, 4)
		addr     = map[NodeID]netip.AddrPort{}
		byAdr    = map[netip.AddrPort]NodeID{}
		sims     = make([]*transporttest.Node, 4)
		sid      ServiceID
		appeared string
		nFrames  int
	)
	checkN := func(what string) {
		if reps[N] == nil || appeared != "" {
			return
		}
		if v, ok := tn.regs[N].ByID(sid); ok {
			appeared = fmt.Sprintf("after %s (frame %d at N): S is back at N as %q with %d listeners", what, nFrames, v.Name, len(v.Listeners))
		}
	}
	for i := range 4 {
		i := i
		sims[i] = net.MustAddNode(tn.nodes[i].Name, transporttest.NodeOptions{Handler: func(p transporttest.Packet) {
			mu.Lock()
			rep := reps[i]
			mu.Unlock()
			if rep == nil {
				return
			}
			_ = rep.HandleFrame(ctx, byAdr[p.From], p.Data)
			if i == N {
				mu.Lock()
				nFrames++
				checkN(fmt.Sprintf("type %d frame", p.Data[2]))
				mu.Unlock()
			}
		}})
		addr[tn.nodes[i].ID] = sims[i].Addr()
		byAdr[sims[i].Addr()] = tn.nodes[i].ID
	}
	start := func(i int) {
		rep, err := NewReplicator(ReplicatorOptions{Registry: tn.regs[i], Carrier: simCarrier2{sims[i], addr}, Clock: clock, Seed: seed + uint64(i),
			// The trap is about the former-member list alone: with
			// compaction the deleted service's marker would go, and the
			// replay is refused as compacted instead.
			NoCompaction: true,
			Peers: func() []NodeID {
				mu.Lock()
				defer mu.Unlock()
				var out []NodeID
				for _, j := range peerSet[i] {
					out = append(out, tn.nodes[j].ID)
				}
				return out
			}})
		if err != nil {
			t.Fatal(err)
		}
		tn.regs[i].o.OnChange = func(ids []ServiceID, local bool) {
			if local {
				rep.Publish(ctx, ids)
			}
		}
		mu.Lock()
		reps[i] = rep
		mu.Unlock()
		rep.Start()
		t.Cleanup(rep.Stop)
	}
	for _, i := range []int{A, B, D} {
		start(i)
	}
	v, err := tn.regs[D].Create(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	sid = v.ID
	clock.Advance(time.Second)
	if v, err = tn.regs[A].PortAdd(ctx, "s", PortKey{TCP, 443}, []Backend{{tn.nodes[B].ID, 6443}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	old, ok := tn.regs[D].Replica().EncodedSnapshot(crdt.ServiceID(sid))
	if !ok {
		t.Fatal("D lacks S")
	}
	if err := tn.regs[D].Remove(ctx, "s", ""); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * DefaultRotation)
	for _, i := range []int{A, B, D} {
		if _, ok := tn.regs[i].ByID(sid); ok {
			t.Fatalf("node %d still shows S after the delete", i)
		}
	}
	// D leaves.
	reps[D].Stop()
	mu.Lock()
	reps[D] = nil
	peerSet = map[int][]int{A: {B}, B: {A}}
	mu.Unlock()
	for _, i := range []int{A, B} {
		if err := tn.regs[i].Replica().SetMembers(ctx, ids(A, B)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(DefaultRotation)
	// N joins with members {A, B, N}; A and B add it.
	tn.members = ids(A, B, N)
	tn.regs[N] = tn.open(N, crdt.NewMemStore(), Limits{})
	for _, i := range []int{A, B} {
		if err := tn.regs[i].Replica().SetMembers(ctx, ids(A, B, N)); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	peerSet = map[int][]int{A: {B, N}, B: {A, N}, N: {A, B}}
	mu.Unlock()
	start(N)
	for range 3 {
		clock.Advance(DefaultRotation)
	}
	// A replay of S's old snapshot, before the delete, reaches N.
	reps[A].send(ctx, tn.nodes[N].ID, snapshotFrame(old))
	for range 5 {
		clock.Advance(DefaultRotation)
	}
	if err := reps[N].HandleFrame(ctx, tn.nodes[B].ID, snapshotFrame(old)); err != nil {
		t.Logf("replay at N: %v", err)
	}
	mu.Lock()
	nFrames++
	checkN("a direct replay of the old snapshot")
	mu.Unlock()
	clock.Advance(2 * DefaultRotation)
	mu.Lock()
	defer mu.Unlock()
	if appeared != "" {
		t.Fatal(appeared)
	}
	if nFrames == 0 {
		t.Fatal("N received no frame")
	}
	// Convergence: A, B and N hold the same revision of S, a tombstone.
	want, _ := serviceInfo(tn.regs[A].Replica(), crdt.ServiceID(sid))
	for _, i := range []int{A, B, N} {
		got, ok := serviceInfo(tn.regs[i].Replica(), crdt.ServiceID(sid))
		if !ok || !got.Deleted || got.Revision != want.Revision {
			t.Fatalf("node %d: %+v (held %v), want the tombstone %+v", i, got, ok, want)
		}
		if !bytes.Equal(formerBytes(tn.regs[i].Replica().Former()), formerBytes(tn.regs[A].Replica().Former())) {
			t.Fatalf("node %d former list %v, A's %v", i, tn.regs[i].Replica().Former(), tn.regs[A].Replica().Former())
		}
	}
	if len(tn.regs[N].Replica().Former()) != 1 {
		t.Fatalf("N's former list %v, want D alone", tn.regs[N].Replica().Former())
	}
	t.Logf("N received %d frames; N's replicator %+v", nFrames, reps[N].Stats())
}

func formerBytes(l []crdt.FormerMember) []byte { return formerFrame(uint64(len(l)), l...) }

type simCarrier2 struct {
	nd   *transporttest.Node
	addr map[NodeID]netip.AddrPort
}

func (c simCarrier2) Send(_ context.Context, to NodeID, frame []byte) error {
	return c.nd.Send(c.addr[to], frame)
}

func serviceInfo(r *crdt.Replica, id crdt.ServiceID) (crdt.ServiceInfo, bool) {
	for _, in := range r.Services() {
		if in.ID == id {
			return in, true
		}
	}
	return crdt.ServiceInfo{}, false
}
