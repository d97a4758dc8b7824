package vip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Replication defaults, and why:
//
//   - DefaultRotation (2 s): every period each node sends a digest to
//     DefaultFanout random peers and the two sides exchange whatever differs
//     (push-pull anti-entropy). Push-pull spreads one change to N nodes in
//     about log3(N) + ln ln N periods, so a 200-node mesh with 5% loss
//     converges in well under 10 periods (20 s) even with publish-on-change
//     off, while an idle network sends one small digest per peer per period.
//   - DefaultFanout (3): enough that a lost digest or a down peer delays a
//     repair by one period at worst, few enough that idle traffic stays
//     O(fanout × services × 24 bytes) per period per node.
//   - The control frame limit is crdt's MaxSnapshotBytes (64 KiB by
//     default) plus the 3-byte frame header: one whole service snapshot (at
//     most 192 signed fields) fits, and a digest of 64 active services and
//     1024 tombstones (24 bytes each) fits too.
const (
	DefaultRotation = 2 * time.Second
	DefaultFanout   = 3
)

// Frame types of the control channel.
const (
	frameMagic    = 0x56 // 'V'
	frameVersion  = 1
	frameSnapshot = 1 // a crdt snapshot encoding
	frameDigest   = 2 // uvarint n, n × (service id [16], revision u64 big endian)
	frameRequest  = 3 // uvarint n, n × service id [16]
	frameHeader   = 3
)

// Replication errors.
var (
	// ErrFrame means a control frame is malformed (bad magic, version, type or
	// length); it is dropped and counted.
	ErrFrame = errors.New("vip: malformed control frame")
	// ErrFrameTooLarge means a control frame exceeds the control frame limit.
	ErrFrameTooLarge = errors.New("vip: control frame exceeds the limit")
)

// Carrier delivers control frames to authenticated peers over the overlay.
// The agent supplies it. Send must not block for long (queue or drop): it
// is called from the replicator's timer and from frame handlers.
type Carrier interface {
	Send(ctx context.Context, to NodeID, frame []byte) error
}

// ReplicatorOptions configures a Replicator.
type ReplicatorOptions struct {
	Registry *Registry
	Carrier  Carrier
	// Peers returns the network's other members that frames may be sent to.
	// It is called with no Replicator lock held.
	Peers func() []NodeID
	Clock transport.Clock // nil means the real clock
	// Rotation is the anti-entropy period; 0 means DefaultRotation.
	Rotation time.Duration
	// Fanout is how many random peers get a digest each period; 0 means
	// DefaultFanout.
	Fanout int
	// NoPublishOnChange turns off sending a changed service's snapshot to
	// every peer at once (tests of the rotation alone use it).
	NoPublishOnChange bool
	// Seed seeds the choice of peers (deterministic tests).
	Seed uint64
}

// ReplicationStats counts a replicator's traffic.
type ReplicationStats struct {
	FramesSent, BytesSent         uint64
	FramesReceived, BytesReceived uint64
	SnapshotsMerged               uint64 // snapshot frames that changed the state
	Rejected                      uint64 // frames or snapshots refused (malformed, too large, bad fields)
	Rotations                     uint64 // periods run
}

// Replicator publishes a network's services to its peers and merges what
// they publish: whole snapshots on every local change, and a periodic
// push-pull digest exchange that repairs lost frames and returning replicas
// without the creator online. Receivers verify and persist a snapshot (in
// crdt) before it is exposed.
//
// It is safe for concurrent use.
type Replicator struct {
	o     ReplicatorOptions
	clock transport.Clock // +checklocksignore: immutable after NewReplicator
	limit int

	mu syncx.Mutex
	// +checklocks:mu
	rng *rand.Rand
	// +checklocks:mu
	timer transport.Timer
	// +checklocks:mu
	stopped bool

	framesSent, bytesSent, framesRecv, bytesRecv, merged, rejected, rotations atomic.Uint64
}

// NewReplicator returns a stopped replicator; call Start.
func NewReplicator(o ReplicatorOptions) (*Replicator, error) {
	if o.Registry == nil || o.Carrier == nil || o.Peers == nil {
		return nil, fmt.Errorf("%w: ReplicatorOptions needs Registry, Carrier and Peers", ErrInvalidOptions)
	}
	if o.Rotation <= 0 {
		o.Rotation = DefaultRotation
	}
	if o.Fanout <= 0 {
		o.Fanout = DefaultFanout
	}
	return &Replicator{
		o:     o,
		clock: transport.Or(o.Clock),
		limit: o.Registry.Replica().Limits().MaxSnapshotBytes + frameHeader,
		rng:   rand.New(rand.NewPCG(o.Seed, o.Seed^0x5eed)),
	}, nil
}

// FrameLimit is the control frame limit in bytes.
func (p *Replicator) FrameLimit() int { return p.limit }

// Start begins the periodic rotation. The first one runs after a random
// fraction of a period, so that nodes started together do not tick in step.
func (p *Replicator) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil || p.stopped {
		return
	}
	first := time.Duration(p.rng.Int64N(int64(p.o.Rotation))) + 1
	p.timer = p.clock.AfterFunc(first, p.rotate)
}

// Stop ends the rotation. It is idempotent.
func (p *Replicator) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.timer != nil {
		p.timer.Stop()
	}
}

// Stats returns the traffic counters.
func (p *Replicator) Stats() ReplicationStats {
	return ReplicationStats{
		FramesSent: p.framesSent.Load(), BytesSent: p.bytesSent.Load(),
		FramesReceived: p.framesRecv.Load(), BytesReceived: p.bytesRecv.Load(),
		SnapshotsMerged: p.merged.Load(), Rejected: p.rejected.Load(), Rotations: p.rotations.Load(),
	}
}

func (p *Replicator) send(ctx context.Context, to NodeID, frame []byte) {
	if len(frame) > p.limit {
		p.rejected.Add(1)
		return
	}
	if err := p.o.Carrier.Send(ctx, to, frame); err == nil {
		p.framesSent.Add(1)
		p.bytesSent.Add(uint64(len(frame)))
	}
}

func snapshotFrame(snap []byte) []byte {
	f := make([]byte, 0, frameHeader+len(snap))
	f = append(f, frameMagic, frameVersion, frameSnapshot)
	return append(f, snap...)
}

// Publish sends the current snapshots of ids to every peer. The Registry's
// OnChange calls it for local changes unless NoPublishOnChange is set.
func (p *Replicator) Publish(ctx context.Context, ids []ServiceID) {
	if p.o.NoPublishOnChange {
		return
	}
	peers := p.o.Peers()
	for _, id := range ids {
		snap, ok := p.o.Registry.Replica().EncodedSnapshot(crdt.ServiceID(id))
		if !ok {
			continue
		}
		f := snapshotFrame(snap)
		for _, peer := range peers {
			p.send(ctx, peer, f)
		}
	}
}

func (p *Replicator) rotate() {
	// Peers is the agent's: asked with no lock held, so that it may call
	// the Replicator (Stop, Publish). A Stop it makes is seen below.
	peers := p.o.Peers()
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	k := min(p.o.Fanout, len(peers))
	chosen := make([]NodeID, 0, k)
	// Partial Fisher-Yates over a copy: k distinct random peers.
	pool := append([]NodeID(nil), peers...)
	for i := 0; i < k; i++ {
		j := i + p.rng.IntN(len(pool)-i)
		pool[i], pool[j] = pool[j], pool[i]
		chosen = append(chosen, pool[i])
	}
	p.timer = p.clock.AfterFunc(p.o.Rotation, p.rotate)
	p.mu.Unlock()
	p.rotations.Add(1)
	digest := p.digest()
	for _, peer := range chosen {
		p.send(context.Background(), peer, digest)
	}
}

// digest lists every held service (deleted ones too) with its revision.
func (p *Replicator) digest() []byte {
	infos := p.o.Registry.Replica().Services()
	f := []byte{frameMagic, frameVersion, frameDigest}
	f = binary.AppendUvarint(f, uint64(len(infos)))
	for _, in := range infos {
		f = append(f, in.ID[:]...)
		f = binary.BigEndian.AppendUint64(f, uint64(in.Revision))
	}
	return f
}

// HandleFrame processes one control frame from an authenticated peer:
// snapshots are verified, persisted and merged; digests are answered with
// the snapshots that differ and a request for what the peer has that this
// node lacks; requests are answered with snapshots. A malformed or
// oversized frame, or a snapshot with bad fields, is refused with an error
// and changes nothing.
func (p *Replicator) HandleFrame(ctx context.Context, from NodeID, frame []byte) error {
	p.framesRecv.Add(1)
	p.bytesRecv.Add(uint64(len(frame)))
	if len(frame) > p.limit {
		p.rejected.Add(1)
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(frame), p.limit)
	}
	if len(frame) < frameHeader || frame[0] != frameMagic || frame[1] != frameVersion {
		p.rejected.Add(1)
		return fmt.Errorf("%w: bad header", ErrFrame)
	}
	body := frame[frameHeader:]
	switch frame[2] {
	case frameSnapshot:
		res, err := p.o.Registry.Replica().MergeSnapshot(ctx, body)
		if len(res.Changed) > 0 {
			p.merged.Add(1)
			ids := make([]ServiceID, len(res.Changed))
			for i, id := range res.Changed {
				ids[i] = ServiceID(id)
			}
			p.o.Registry.Merged(ids)
		}
		if err != nil {
			p.rejected.Add(1)
			return fmt.Errorf("vip: snapshot from %s: %w", from.String()[:12], err)
		}
		return nil
	case frameDigest:
		return p.handleDigest(ctx, from, body)
	case frameRequest:
		ids, _, err := parseEntries(body, 16)
		if err != nil {
			p.rejected.Add(1)
			return err
		}
		for _, id := range ids {
			if snap, ok := p.o.Registry.Replica().EncodedSnapshot(crdt.ServiceID(id)); ok {
				p.send(ctx, from, snapshotFrame(snap))
			}
		}
		return nil
	}
	p.rejected.Add(1)
	return fmt.Errorf("%w: unknown type %d", ErrFrame, frame[2])
}

// parseEntries reads a uvarint count and that many fixed-size entries, each
// starting with a 16-byte service id; it returns the ids and the entries.
func parseEntries(b []byte, size int) ([][16]byte, [][]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, nil, fmt.Errorf("%w: bad count", ErrFrame)
	}
	b = b[k:]
	if n > uint64(len(b)/size) || uint64(len(b)) != n*uint64(size) {
		return nil, nil, fmt.Errorf("%w: %d entries in %d bytes", ErrFrame, n, len(b))
	}
	ids := make([][16]byte, n)
	entries := make([][]byte, n)
	for i := range ids {
		e := b[i*size : (i+1)*size]
		copy(ids[i][:], e)
		entries[i] = e
	}
	return ids, entries, nil
}

func (p *Replicator) handleDigest(ctx context.Context, from NodeID, body []byte) error {
	ids, entries, err := parseEntries(body, 24)
	if err != nil {
		p.rejected.Add(1)
		return err
	}
	theirs := make(map[[16]byte]crdt.Revision, len(ids))
	for i, id := range ids {
		theirs[id] = crdt.Revision(binary.BigEndian.Uint64(entries[i][16:]))
	}
	replica := p.o.Registry.Replica()
	mine := make(map[[16]byte]crdt.Revision)
	for _, in := range replica.Services() {
		mine[in.ID] = in.Revision
		if rev, ok := theirs[in.ID]; ok && rev == in.Revision {
			continue
		}
		if snap, ok := replica.EncodedSnapshot(in.ID); ok {
			p.send(ctx, from, snapshotFrame(snap)) // push what differs or they lack
		}
	}
	req := []byte{frameMagic, frameVersion, frameRequest, 0}
	var want []byte
	count := 0
	for _, id := range ids {
		if rev, ok := mine[id]; !ok || rev != theirs[id] {
			want = append(want, id[:]...)
			count++
		}
	}
	if count > 0 {
		req = binary.AppendUvarint(req[:frameHeader], uint64(count))
		p.send(ctx, from, append(req, want...))
	}
	return nil
}
