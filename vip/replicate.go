package vip

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
//     1024 tombstones (24 bytes each) fits too. A larger digest (raised
//     limits, or what merges hold past them) goes in parts, each a digest
//     frame within the limit (replicate_digest.go), so anti-entropy never
//     stops at a limit.
//   - DefaultReplyRate (1 MiB/s) and DefaultReplyBurst (4 MiB): the
//     snapshots a node sends in answer to one member's digests and
//     requests. The burst holds the whole routed state at the default
//     limits (64 services of at most 64 KiB each, 4 MiB), so a member that
//     joins or returns gets it from one exchange; the rate brings it the
//     rest of what a replica may hold (up to 128 services of 64 KiB and
//     2048 small tombstones, about 8.3 MiB) within about 5 s, less as it
//     asks several peers at once, each with its own budget. A member that
//     asks for everything again and again gets no more than 1 MiB a second
//     from each node.
const (
	DefaultRotation   = 2 * time.Second
	DefaultFanout     = 3
	DefaultReplyRate  = 1 << 20
	DefaultReplyBurst = 4 << 20
)

// maxReplyBudgets bounds the members whose reply budget is tracked at
// once. A budget that has refilled is forgotten (a new one starts full,
// the same), so only members answered within the last ReplyBurst/ReplyRate
// seconds (4 s by default) are tracked; past the bound the fullest budget
// is forgotten, which gives its member the least credit, and counted
// (ReplicationStats.BudgetsDropped).
const maxReplyBudgets = 4096

// Frame types of the control channel.
const (
	frameMagic    = 0x56 // 'V'
	frameVersion  = 1
	frameSnapshot = 1 // a crdt snapshot encoding
	frameDigest   = 2 // uvarint n, n × (service id [16], revision u64 big endian)
	frameRequest  = 3 // uvarint n, n × service id [16]
	frameFormer   = 4 // uvarint n, n × (author [32], last counter uvarint), authors in strict order
	frameCert     = 5 // a crdt.Certificate encoding, its acknowledgements split between frames (replicate_compact.go)
	frameHeader   = 3
)

// formerEntryMin is the smallest encoded former-member entry: a key and a
// one-byte counter. It bounds the count a frame may claim.
const formerEntryMin = 32 + 1

// Replication errors.
var (
	// ErrFrame means a control frame is malformed (bad magic, version, type or
	// length); it is dropped and counted.
	ErrFrame = errors.New("vip: malformed control frame")
	// ErrFrameTooLarge means a control frame exceeds the control frame limit.
	ErrFrameTooLarge = errors.New("vip: control frame exceeds the limit")
	// ErrReplyBudget means a digest or request was answered only in part,
	// or not at all, because the asking member's reply budget
	// (ReplicatorOptions.ReplyRate, ReplyBurst) was spent; the message
	// says how much was left out. It is counted
	// (ReplicationStats.BudgetRefused).
	ErrReplyBudget = errors.New("vip: reply budget spent")
)

// Carrier delivers control frames to authenticated peers over the overlay.
// The agent supplies it. Send must not block for long (queue or drop): it
// is called from the replicator's timer and from frame handlers.
type Carrier interface {
	Send(ctx context.Context, to NodeID, frame []byte) error
}

// ReplicatorOptions configures a Replicator. Registry, Carrier and Peers
// are required.
type ReplicatorOptions struct {
	// Registry is the network's registry: its replica is what is published
	// and what merges go into.
	Registry *Registry
	// Carrier sends frames to peers.
	Carrier Carrier
	// Peers returns the network's other members that frames may be sent to.
	// It is called with no Replicator lock held.
	Peers func() []NodeID
	// Clock times the rotation and refills the reply budgets; nil means
	// the real clock.
	Clock transport.Clock
	// Rotation is the anti-entropy period; 0 means DefaultRotation.
	Rotation time.Duration
	// Fanout is how many random peers get a digest each period; 0 means
	// DefaultFanout.
	Fanout int
	// NoPublishOnChange turns off sending a changed service's snapshot to
	// every peer at once (tests of the rotation alone use it).
	NoPublishOnChange bool
	// NoCompaction turns off this node's part in compacting deletion
	// markers: it neither proposes nor acknowledges compactions nor sends
	// its certificate (certificates it receives complete are still
	// applied). Tests of the digest and of the former-member list alone
	// use it; an agent that sets it stalls compaction for the whole
	// network, named in the full history's error.
	NoCompaction bool
	// Seed seeds the choice of peers (deterministic tests).
	Seed uint64
	// ReplyRate is each member's budget of reply bytes per second: the
	// snapshot frames sent in answer to that member's digests and
	// requests (the request that answers a digest is never larger than
	// the digest, and is not counted). Past the budget the rest of an
	// answer is not sent, HandleFrame returns ErrReplyBudget, and the
	// member gets it from a later exchange. 0 means DefaultReplyRate;
	// negative is invalid.
	ReplyRate int
	// ReplyBurst is the most reply bytes a member may take at once, after
	// asking for nothing for ReplyBurst/ReplyRate seconds. 0 means
	// DefaultReplyBurst, or FrameLimit if that is larger; a burst below
	// FrameLimit is invalid, since the largest snapshot could never be
	// sent.
	ReplyBurst int
}

// ReplicationStats counts a replicator's traffic and refusals. The
// counters are cumulative from NewReplicator.
type ReplicationStats struct {
	FramesSent, BytesSent         uint64
	FramesReceived, BytesReceived uint64
	SnapshotsMerged               uint64 // snapshot frames that changed the state
	Rejected                      uint64 // frames or snapshots refused (malformed, too large, bad fields)
	Rotations                     uint64 // periods run
	// BudgetRefused counts digests and requests answered only in part, or
	// not at all, because the asking member's reply budget was spent
	// (ErrReplyBudget); BudgetRefusedBytes the snapshot frame bytes they
	// were not sent.
	BudgetRefused, BudgetRefusedBytes uint64
	// BudgetsDropped counts reply budgets forgotten before they refilled,
	// to track no more than 4096 members at once.
	BudgetsDropped uint64
	// FormerSent counts former-member frames sent (in rotations and in
	// answers); FormerReceived those received well formed; FormerMerged
	// those that changed the replica's former-member list.
	FormerSent, FormerReceived, FormerMerged uint64
	// CertSent counts certificate frames sent (proposals, gathered and
	// held certificates, acknowledgements); CertReceived those received
	// well formed; CertApplied the certificates applied; AcksSent the
	// acknowledgements this node made and sent; CertRefused the
	// compactions this node could not propose or acknowledge (its state
	// differs, or a bound) and certificates too large for a frame.
	CertSent, CertReceived, CertApplied, AcksSent, CertRefused uint64
}

// Replicator publishes a network's services to its peers and merges what
// they publish: whole snapshots on every local change, and a periodic
// push-pull digest exchange that repairs lost frames and returning replicas
// without the creator online. Receivers verify and persist a snapshot (in
// crdt) before it is exposed. Each rotation also sends the replica's
// former-member list (crdt.Replica.Former) ahead of the digest, so that a
// node that joined after a member left accepts what that member signed
// while it was one, and nothing it signs later.
//
// It is safe for concurrent use.
type Replicator struct {
	o     ReplicatorOptions
	clock transport.Clock // +checklocksignore: immutable after NewReplicator
	limit int
	rate  float64 // +checklocksignore: reply bytes per second, immutable after NewReplicator
	burst float64 // +checklocksignore: reply bytes, immutable after NewReplicator
	// maxBudgets is maxReplyBudgets; tests lower it before the
	// Replicator is used.
	maxBudgets int // +checklocksignore: immutable once the Replicator is shared

	mu syncx.Mutex
	// +checklocks:mu
	rng *rand.Rand
	// +checklocks:mu
	timer transport.Timer
	// +checklocks:mu
	stopped bool
	// budgets are the reply budgets of the members answered lately (at
	// most maxReplyBudgets); a member without one has a full budget.
	// +checklocks:mu
	budgets map[NodeID]replyBudget

	framesSent, bytesSent, framesRecv, bytesRecv, merged, rejected, rotations atomic.Uint64
	budgetRefused, budgetRefusedBytes, budgetsDropped                         atomic.Uint64
	formerSent, formerRecv, formerMerged                                      atomic.Uint64
	certSent, certRecv, certApplied, acksSent, certRefused                    atomic.Uint64
}

// replyBudget is a token bucket of reply bytes: tokens at time at.
type replyBudget struct {
	tokens float64
	at     time.Time
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
	limit := o.Registry.Replica().Limits().MaxSnapshotBytes + frameHeader
	if err := checkDigestLimit(limit); err != nil {
		return nil, err
	}
	switch {
	case o.ReplyRate < 0:
		return nil, fmt.Errorf("%w: ReplicatorOptions.ReplyRate is negative (%d)", ErrInvalidOptions, o.ReplyRate)
	case o.ReplyRate == 0:
		o.ReplyRate = DefaultReplyRate
	}
	switch {
	case o.ReplyBurst == 0:
		o.ReplyBurst = max(DefaultReplyBurst, limit)
	case o.ReplyBurst < limit:
		return nil, fmt.Errorf("%w: ReplicatorOptions.ReplyBurst %d is below the control frame limit %d", ErrInvalidOptions, o.ReplyBurst, limit)
	}
	return &Replicator{
		o:          o,
		clock:      transport.Or(o.Clock),
		limit:      limit,
		rate:       float64(o.ReplyRate),
		burst:      float64(o.ReplyBurst),
		rng:        rand.New(rand.NewPCG(o.Seed, o.Seed^0x5eed)),
		budgets:    map[NodeID]replyBudget{},
		maxBudgets: maxReplyBudgets,
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
		BudgetRefused: p.budgetRefused.Load(), BudgetRefusedBytes: p.budgetRefusedBytes.Load(),
		BudgetsDropped: p.budgetsDropped.Load(),
		FormerSent:     p.formerSent.Load(), FormerReceived: p.formerRecv.Load(), FormerMerged: p.formerMerged.Load(),
		CertSent: p.certSent.Load(), CertReceived: p.certRecv.Load(), CertApplied: p.certApplied.Load(),
		AcksSent: p.acksSent.Load(), CertRefused: p.certRefused.Load(),
	}
}

// level is b's tokens at now.
func (p *Replicator) level(b replyBudget, now time.Time) float64 {
	if d := now.Sub(b.at); d > 0 {
		return min(p.burst, b.tokens+d.Seconds()*p.rate)
	}
	return b.tokens
}

// budgetLocked returns from's budget refilled to now. A new one starts
// full; making room for it first forgets the budgets that have refilled,
// then, at the bound, the fullest.
// +checklocks:p.mu
func (p *Replicator) budgetLocked(from NodeID, now time.Time) replyBudget {
	if b, ok := p.budgets[from]; ok {
		if now.After(b.at) { // callers read the clock before the lock
			b = replyBudget{tokens: p.level(b, now), at: now}
		}
		return b
	}
	if len(p.budgets) >= p.maxBudgets {
		p.pruneLocked(now)
	}
	if len(p.budgets) >= p.maxBudgets {
		var fullest NodeID
		most := -1.0
		for id, b := range p.budgets {
			if l := p.level(b, now); l > most {
				fullest, most = id, l
			}
		}
		delete(p.budgets, fullest)
		p.budgetsDropped.Add(1)
	}
	return replyBudget{tokens: p.burst, at: now}
}

// pruneLocked forgets the budgets that have refilled by now: a member
// without one has a full budget, so nothing changes but memory.
// +checklocks:p.mu
func (p *Replicator) pruneLocked(now time.Time) {
	for id, b := range p.budgets {
		if p.level(b, now) >= p.burst {
			delete(p.budgets, id)
		}
	}
}

// answer sends from the snapshots of services, in order, as far as from's
// reply budget goes: each costs its frame's size when it is asked for,
// taken before the frame is built. What does not fit is left out,
// counted, and reported with ErrReplyBudget.
func (p *Replicator) answer(ctx context.Context, from NodeID, services []crdt.ServiceInfo) error {
	if len(services) == 0 {
		return nil
	}
	now := p.clock.Now()
	send := make([]crdt.ServiceID, 0, len(services))
	refused, refusedBytes := 0, 0
	p.mu.Lock()
	b := p.budgetLocked(from, now)
	for _, in := range services {
		cost := in.SnapshotBytes + frameHeader
		if b.tokens < float64(cost) {
			refused++
			refusedBytes += cost
			continue
		}
		b.tokens -= float64(cost)
		send = append(send, in.ID)
	}
	p.budgets[from] = b
	p.mu.Unlock()
	replica := p.o.Registry.Replica()
	for _, id := range send {
		if snap, ok := replica.EncodedSnapshot(id); ok {
			p.send(ctx, from, snapshotFrame(snap))
		}
	}
	if refused == 0 {
		return nil
	}
	p.budgetRefused.Add(1)
	p.budgetRefusedBytes.Add(uint64(refusedBytes))
	return fmt.Errorf("%w: %d of %d snapshots (%d bytes) to %s not sent, over its %d bytes/s (burst %d)",
		ErrReplyBudget, refused, len(services), refusedBytes, from.String()[:12], p.o.ReplyRate, p.o.ReplyBurst)
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
	now := p.clock.Now()
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
	p.pruneLocked(now)
	p.mu.Unlock()
	p.rotations.Add(1)
	former := p.formerFrames()
	certs := p.compactRound(context.Background(), peers)
	parts := p.digestParts()
	for _, peer := range chosen {
		// The list goes first: a peer that joined after a member left
		// then accepts that member's fields (its tombstones above all)
		// when the digest exchange brings them. The certificate follows,
		// so that the digest exchange brings nothing it deleted.
		for _, f := range former {
			p.sendFormer(context.Background(), peer, f)
		}
		for _, f := range certs {
			p.sendCert(context.Background(), peer, f)
		}
		for _, part := range parts {
			p.send(context.Background(), peer, part)
		}
	}
}

func (p *Replicator) sendFormer(ctx context.Context, to NodeID, frame []byte) {
	if err := p.o.Carrier.Send(ctx, to, frame); err == nil {
		p.framesSent.Add(1)
		p.bytesSent.Add(uint64(len(frame)))
		p.formerSent.Add(1)
	}
}

// formerFrames encodes the replica's former-member list in as many
// frames as the control frame limit needs (none for an empty list), each
// a run of the list in author order.
func (p *Replicator) formerFrames() [][]byte {
	list := p.o.Registry.Replica().Former()
	if len(list) == 0 {
		return nil
	}
	// Room for the entries: the header and the count's varint (a frame
	// holds fewer than 2^21 entries, so 3 bytes) aside.
	room := p.limit - frameHeader - 3
	var frames [][]byte
	for len(list) > 0 {
		n, size := 0, 0
		for n < len(list) {
			es := 32 + uvarintLen(list[n].LastCounter)
			if size+es > room {
				break
			}
			size += es
			n++
		}
		if n == 0 { // a frame limit below one entry: nothing can be sent
			break
		}
		f := make([]byte, 0, frameHeader+3+size)
		f = append(f, frameMagic, frameVersion, frameFormer)
		f = binary.AppendUvarint(f, uint64(n))
		for _, e := range list[:n] {
			f = append(f, e.Author[:]...)
			f = binary.AppendUvarint(f, e.LastCounter)
		}
		frames = append(frames, f)
		list = list[n:]
	}
	return frames
}

// readUvarint reads a varint in its shortest form only.
func readUvarint(b []byte) (uint64, int, error) {
	v, k := binary.Uvarint(b)
	if k <= 0 || k != uvarintLen(v) {
		return 0, 0, fmt.Errorf("%w: bad or overlong varint", ErrFrame)
	}
	return v, k, nil
}

// parseFormer decodes a former-member frame's body strictly: shortest
// varints, a count that the body can hold, authors in strict order, no
// trailing bytes.
func parseFormer(b []byte) ([]crdt.FormerMember, error) {
	n, k, err := readUvarint(b)
	if err != nil {
		return nil, err
	}
	b = b[k:]
	if n > uint64(len(b)/formerEntryMin) {
		return nil, fmt.Errorf("%w: %d former members in %d bytes", ErrFrame, n, len(b))
	}
	out := make([]crdt.FormerMember, n)
	for i := range out {
		if len(b) < formerEntryMin {
			return nil, fmt.Errorf("%w: former member %d truncated", ErrFrame, i)
		}
		copy(out[i].Author[:], b)
		if i > 0 && bytes.Compare(out[i-1].Author[:], out[i].Author[:]) >= 0 {
			return nil, fmt.Errorf("%w: former members out of order at %d", ErrFrame, i)
		}
		if out[i].LastCounter, k, err = readUvarint(b[32:]); err != nil {
			return nil, fmt.Errorf("former member %d: %w", i, err)
		}
		b = b[32+k:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after %d former members", ErrFrame, len(b), n)
	}
	return out, nil
}

// handleFormer merges a former-member list and, when this node holds
// higher entries for the frame's authors, or authors the frame lacks
// within its span, answers with its own list, charged to the sender's
// reply budget. Once both lists are equal nothing is answered, so the
// exchange ends whether a list takes one frame or several.
func (p *Replicator) handleFormer(ctx context.Context, from NodeID, body []byte) error {
	theirs, err := parseFormer(body)
	if err != nil {
		p.rejected.Add(1)
		return err
	}
	p.formerRecv.Add(1)
	replica := p.o.Registry.Replica()
	changed, err := replica.MergeFormer(ctx, theirs)
	if err != nil {
		p.rejected.Add(1)
		return fmt.Errorf("vip: former members from %s: %w", from.String()[:12], err)
	}
	if changed {
		p.formerMerged.Add(1)
	}
	had := make(map[crdt.AuthorID]uint64, len(theirs))
	for _, e := range theirs {
		had[e.Author] = e.LastCounter
	}
	if len(theirs) == 0 {
		return nil
	}
	// Only what the frame speaks for counts: an author it holds at a
	// lower counter, or one missing within its span of authors. A list
	// sent in several frames is a run per frame, and an entry outside
	// this frame's run reaches the sender with this node's own rotation;
	// counting it here would answer every part of a long list, and the
	// answer's parts in turn, until the budget ran dry.
	first, last := theirs[0].Author, theirs[len(theirs)-1].Author
	ahead := false
	for _, e := range replica.Former() {
		held, ok := had[e.Author]
		if ok && e.LastCounter > held ||
			!ok && bytes.Compare(e.Author[:], first[:]) > 0 && bytes.Compare(e.Author[:], last[:]) < 0 {
			ahead = true
			break
		}
	}
	if !ahead {
		return nil
	}
	return p.answerFrames(ctx, from, p.formerFrames(), "former-member frames", p.sendFormer)
}

// answerFrames sends frames to from as far as its reply budget goes,
// each costing its size; what does not fit is left out, counted and
// reported with ErrReplyBudget.
func (p *Replicator) answerFrames(ctx context.Context, from NodeID, frames [][]byte, what string, send func(context.Context, NodeID, []byte)) error {
	now := p.clock.Now()
	var out [][]byte
	refused, refusedBytes := 0, 0
	p.mu.Lock()
	b := p.budgetLocked(from, now)
	for _, f := range frames {
		if b.tokens < float64(len(f)) {
			refused++
			refusedBytes += len(f)
			continue
		}
		b.tokens -= float64(len(f))
		out = append(out, f)
	}
	p.budgets[from] = b
	p.mu.Unlock()
	for _, f := range out {
		send(ctx, from, f)
	}
	if refused == 0 {
		return nil
	}
	p.budgetRefused.Add(1)
	p.budgetRefusedBytes.Add(uint64(refusedBytes))
	return fmt.Errorf("%w: %d of %d %s (%d bytes) to %s not sent, over its %d bytes/s (burst %d)",
		ErrReplyBudget, refused, len(frames), what, refusedBytes, from.String()[:12], p.o.ReplyRate, p.o.ReplyBurst)
}

// HandleFrame processes one control frame from an authenticated peer:
// snapshots are verified, persisted and merged; digests are answered with
// the snapshots that differ and a request for what the peer has that this
// node lacks; requests are answered with the snapshots of the services
// they name that this node holds. An id named twice is answered (or asked
// for) once. A former-member list is merged into the replica
// (crdt.Replica.MergeFormer) and answered with this node's list when it
// holds entries the frame lacks or higher ones. The snapshots sent in answer to one member are bounded by its
// reply budget (ReplicatorOptions.ReplyRate, ReplyBurst): what does not
// fit is left out, counted, and reported with ErrReplyBudget. A malformed
// or oversized frame, or a snapshot with bad fields, is refused with an
// error and changes nothing.
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
		return p.handleRequest(ctx, from, body)
	case frameFormer:
		return p.handleFormer(ctx, from, body)
	case frameCert:
		return p.handleCert(ctx, from, body)
	}
	p.rejected.Add(1)
	return fmt.Errorf("%w: unknown type %d", ErrFrame, frame[2])
}

// parseEntries reads a uvarint count and that many entries of size bytes,
// each starting with a 16-byte service id; it returns the count and the
// entries, back to back.
func parseEntries(b []byte, size int) (int, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, fmt.Errorf("%w: bad count", ErrFrame)
	}
	b = b[k:]
	if n > uint64(len(b)/size) || uint64(len(b)) != n*uint64(size) {
		return 0, nil, fmt.Errorf("%w: %d entries in %d bytes", ErrFrame, n, len(b))
	}
	return int(n), b, nil
}

// handleRequest answers a request with the snapshots it names that this
// node holds, each once, within from's reply budget. The ids are sorted
// and their repeats dropped before anything is looked up or built.
func (p *Replicator) handleRequest(ctx context.Context, from NodeID, body []byte) error {
	n, entries, err := parseEntries(body, 16)
	if err != nil {
		p.rejected.Add(1)
		return err
	}
	ids := make([]crdt.ServiceID, n)
	for i := range ids {
		copy(ids[i][:], entries[i*16:])
	}
	slices.SortFunc(ids, func(a, b crdt.ServiceID) int { return bytes.Compare(a[:], b[:]) })
	ids = slices.Compact(ids)
	replica := p.o.Registry.Replica()
	var held []crdt.ServiceInfo
	for _, id := range ids {
		if in, ok := replica.Service(id); ok {
			held = append(held, in)
		}
	}
	return p.answer(ctx, from, held)
}

func (p *Replicator) handleDigest(ctx context.Context, from NodeID, body []byte) error {
	n, entries, err := parseEntries(body, 24)
	if err != nil {
		p.rejected.Add(1)
		return err
	}
	theirs := make(map[crdt.ServiceID]crdt.Revision, n)
	for i := range n {
		e := entries[i*24 : (i+1)*24]
		theirs[crdt.ServiceID(e[:16])] = crdt.Revision(binary.BigEndian.Uint64(e[16:]))
	}
	covers := digestRange(entries, n)
	mine := make(map[crdt.ServiceID]crdt.Revision)
	var push []crdt.ServiceInfo // what differs or they lack, within the part's range
	for _, in := range p.o.Registry.Replica().Services() {
		mine[in.ID] = in.Revision
		if rev, ok := theirs[in.ID]; (!ok || rev != in.Revision) && covers(in.ID) {
			push = append(push, in)
		}
	}
	budgetErr := p.answer(ctx, from, push)
	req := []byte{frameMagic, frameVersion, frameRequest, 0}
	var want []byte
	count := 0
	for i := range n {
		id := crdt.ServiceID(entries[i*24 : i*24+16])
		rev, ok := theirs[id]
		if !ok {
			continue // a repeat, decided at its first entry
		}
		delete(theirs, id)
		if rev == crdt.NoRevision {
			continue // a bound of a digest part, not a service (digestParts)
		}
		if have, held := mine[id]; !held || have != rev {
			want = append(want, id[:]...)
			count++
		}
	}
	if count > 0 {
		req = binary.AppendUvarint(req[:frameHeader], uint64(count))
		p.send(ctx, from, append(req, want...))
	}
	return budgetErr
}
