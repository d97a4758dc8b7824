package probe

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Defaults of ProberConfig (docs/defaults.md gives their reasons).
const (
	DefaultProbeInterval = time.Second      // one probe exchange per second per peer
	DefaultProbeTimeout  = 3 * time.Second  // a probe expires after three seconds
	DefaultMissLimit     = 2                // consecutive missing responses that exclude a peer
	DefaultStaleAfter    = 10 * time.Second // measurements expire after ten seconds
	DefaultMaxPeers      = 1024             // peers probed at once

	// MaxOutstanding bounds the probes outstanding to one peer: Timeout
	// must be less than MaxOutstanding-2 Intervals.
	MaxOutstanding = 64
)

// ProberConfig tunes a Prober. Zero fields take the defaults above;
// negative values are invalid.
type ProberConfig struct {
	Interval   time.Duration // between probes to one peer; default 1 s
	Timeout    time.Duration // a probe unanswered this long is missing; default 3 s
	MissLimit  int           // consecutive missing probes that exclude the peer; default 2
	StaleAfter time.Duration // an RTT sample this old no longer counts; default 10 s
	MaxPeers   int           // limit on tracked peers; default 1024

	// Seed seeds the generator of the session id and the per-probe nonces.
	// The zero value draws a seed from crypto/rand; tests set it to make a
	// run reproducible.
	Seed [32]byte
}

func (c ProberConfig) withDefaults() (ProberConfig, error) {
	def := func(d *time.Duration, v time.Duration, name string) error {
		switch {
		case *d < 0:
			return invalid("prober %s %v is negative", name, *d)
		case *d == 0:
			*d = v
		}
		return nil
	}
	for _, f := range []struct {
		d    *time.Duration
		v    time.Duration
		name string
	}{{&c.Interval, DefaultProbeInterval, "interval"}, {&c.Timeout, DefaultProbeTimeout, "timeout"}, {&c.StaleAfter, DefaultStaleAfter, "stale-after"}} {
		if err := def(f.d, f.v, f.name); err != nil {
			return c, err
		}
	}
	if c.MissLimit < 0 || c.MaxPeers < 0 {
		return c, invalid("prober miss limit %d / max peers %d is negative", c.MissLimit, c.MaxPeers)
	}
	if c.MissLimit == 0 {
		c.MissLimit = DefaultMissLimit
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.window() > MaxOutstanding {
		return c, invalid("prober timeout %v spans more than %d probes at interval %v", c.Timeout, MaxOutstanding-2, c.Interval)
	}
	return c, nil
}

// window is the number of probes that can be outstanding to one peer: one
// per Interval within Timeout, one more at the edge, and the probe sent at
// once after a silence.
func (c ProberConfig) window() int64 {
	return int64((c.Timeout+c.Interval-1)/c.Interval) + 2
}

// Probe is one probe the engine must send to Peer through the tunnel: the
// UDP payload Message to the probe port on the peer's overlay address
// (AppendIPv4 builds the whole packet).
type Probe struct {
	Peer     NodeID
	Sequence uint64
	Message  [MessageLen]byte
}

// AppendIPv4 appends the probe as an IPv4/UDP packet from src to dst, both
// on port (the probe port, DefaultPort unless configured), to b. It
// allocates only when b lacks PacketLen bytes of capacity.
func (pr *Probe) AppendIPv4(b []byte, src, dst netip.Addr, port uint16) ([]byte, error) {
	return AppendIPv4UDP(b, netip.AddrPortFrom(src, port), netip.AddrPortFrom(dst, port), uint16(pr.Sequence), pr.Message[:])
}

// PeerHealth is the prober's view of one peer at a time now.
type PeerHealth struct {
	Tracked bool // the prober tracks the peer (AddPeer)
	PathUp  bool // the engine's data-path input (SetPath); true until told otherwise

	// Reason is ReasonOK, ReasonRTTUnknown or ReasonRTTStale for an eligible
	// peer, ReasonNoPath or ReasonProbeTimeout for an excluded one.
	Reason Reason
	Misses int // consecutive missing probes

	// RTT is the smoothed round-trip time (EWMA, 7/8 old + 1/8 new); it
	// counts only when RTTKnown, that is a sample younger than StaleAfter
	// exists. It is never zero for a known remote RTT: a sample is at least
	// 1 ns.
	RTT       time.Duration
	RTTKnown  bool
	LastRTT   time.Duration // the newest raw sample
	SampleAge time.Duration // now minus the newest sample's arrival; -1 without a sample

	Sent, Replies, Expired uint64 // probes sent, answered in time, expired unanswered
}

// Eligible reports whether the peer's path may carry new flows.
func (h PeerHealth) Eligible() bool { return h.Reason.Eligible() }

// ProberStats are the prober's counters. Probe bytes are IP packet bytes
// (PacketLen per probe or reply) and are never part of user traffic
// counters.
type ProberStats struct {
	Peers      int
	Sent       uint64 // probes emitted by Poll
	SentBytes  uint64
	Replies    uint64 // replies accepted: answered in time
	ReplyBytes uint64
	// Unsampled counts accepted replies that were not RTT samples: the
	// first after a silence, and those to probes sent during one.
	Unsampled uint64
	Expired   uint64 // probes that expired unanswered
	Rejected  uint64 // replies refused by HandleReply (malformed, foreign, late, replayed)
}

type outstanding struct {
	seq, nonce uint64
	sent       time.Time
	done       bool
}

type peer struct {
	id       NodeID
	nextSend time.Time
	nextSeq  uint64
	ring     []outstanding // probes in sequence order, oldest at head
	head, n  int
	answered uint64 // highest answered sequence + 1; 0: none
	misses   int
	pathUp   bool

	rtt, lastRTT time.Duration
	hasRTT       bool
	lastSample   time.Time
	lastReply    time.Time // arrival of the newest accepted reply; zero: none
	sampleFrom   time.Time // replies to probes sent before it are not samples

	sent, replies, expired uint64
}

// Prober is the RTT prober's state machine: it decides when to probe each
// tracked peer, matches replies to probes, keeps a smoothed RTT per peer and
// decides which peers are excluded. It does no I/O and reads no clock: Poll
// returns the probes to send and the time it wants to be polled again, and
// every method takes now. Drive runs it on a transport.Clock.
//
// Timing (defaults in docs/defaults.md, all configurable): each peer is probed
// every Interval, starting at the first Poll at or after AddPeer. A probe
// unanswered Timeout after it was sent is missing (a reply arriving at
// exactly Timeout is too late). MissLimit consecutive missing probes, or
// SetPath(false), exclude the peer; one answered probe ends a run of
// misses. Probing never stops while a peer is tracked, so recovery is
// automatic. An RTT sample counts for StaleAfter.
//
// A Prober is safe for concurrent use. Poll, HandleReply and Health do not
// allocate, apart from Poll growing out.
type Prober struct {
	cfg ProberConfig

	// session is set by NewProber and read-only after.
	session uint32

	// mu guards every field below and the peers' state.
	mu syncx.Mutex
	// +checklocks:mu
	rng *rand.ChaCha8
	// +checklocks:mu
	peers map[NodeID]*peer
	// order holds the peers in AddPeer order, so that Poll's order is
	// deterministic.
	// +checklocks:mu
	order []*peer
	// +checklocks:mu
	stats ProberStats
	// wake is set by Drive.
	// +checklocks:mu
	wake func()
}

// NewProber returns a prober with no peers.
func NewProber(cfg ProberConfig) (*Prober, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	seed := cfg.Seed
	if seed == ([32]byte{}) {
		if _, err := crand.Read(seed[:]); err != nil {
			return nil, fmt.Errorf("probe: seeding prober: %w", err)
		}
	}
	p := &Prober{cfg: cfg, rng: rand.NewChaCha8(seed), peers: make(map[NodeID]*peer)}
	p.session = uint32(p.rng.Uint64())
	return p, nil
}

// Config returns the configuration in force, defaults filled in.
func (p *Prober) Config() ProberConfig { return p.cfg }

// Session returns the prober's session id, carried by its probes.
func (p *Prober) Session() uint32 { return p.session }

// AddPeer starts probing id (a peer that backends in use live on). The first
// probe goes out at the first Poll at or after now. Adding a tracked peer
// changes nothing. It fails with ErrPeerLimit when MaxPeers are tracked.
func (p *Prober) AddPeer(id NodeID, now time.Time) error {
	p.mu.Lock()
	if _, ok := p.peers[id]; ok {
		p.mu.Unlock()
		return nil
	}
	if len(p.peers) >= p.cfg.MaxPeers {
		p.mu.Unlock()
		return fmt.Errorf("%w: limit %d peers", ErrPeerLimit, p.cfg.MaxPeers)
	}
	pe := &peer{id: id, nextSend: now, ring: make([]outstanding, p.cfg.window()), pathUp: true}
	p.peers[id] = pe
	p.order = append(p.order, pe)
	p.stats.Peers = len(p.order)
	wake := p.wake
	p.mu.Unlock()
	if wake != nil {
		wake()
	}
	return nil
}

// RemovePeer stops probing id and forgets its measurements. Replies to its
// outstanding probes are then rejected with ErrUnknownPeer.
func (p *Prober) RemovePeer(id NodeID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pe, ok := p.peers[id]
	if !ok {
		return
	}
	delete(p.peers, id)
	if i := slices.Index(p.order, pe); i >= 0 {
		p.order = slices.Delete(p.order, i, i+1)
	}
	p.stats.Peers = len(p.order)
}

// SetPath is the engine's data-path input: up is false while the engine has
// no data path to the peer (no WireGuard handshake, no route). A peer
// without a path is excluded at once (ReasonNoPath) and is probed all the
// same, so that its RTT is known again as soon as the path returns. It fails
// with ErrUnknownPeer for an untracked peer.
func (p *Prober) SetPath(id NodeID, up bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	pe, ok := p.peers[id]
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownPeer, id)
	}
	pe.pathUp = up
	return nil
}

// Poll expires the probes due to expire at now, appends the probes due at
// now to out, and returns out and the time Poll next has work to do (the
// zero Time when no peer is tracked). Call it at that time, or earlier: an
// early call is harmless, and a late one sends the overdue probe once
// (probes are not sent in bursts to catch up) and expires what is due.
func (p *Prober) Poll(now time.Time, out []Probe) ([]Probe, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var next time.Time
	for _, pe := range p.order {
		p.expire(pe, now)
		if !now.Before(pe.nextSend) {
			out = append(out, p.send(pe, now))
		}
		next = earliest(next, pe.nextSend)
		if at, ok := p.nextExpiry(pe); ok {
			next = earliest(next, at)
		}
	}
	return out, next
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// +checklocks:p.mu
func (p *Prober) send(pe *peer, now time.Time) Probe {
	if pe.n == len(pe.ring) { // cannot happen with sends ≥ Interval apart; stay bounded anyway
		p.expireOldest(pe)
	}
	o := outstanding{seq: pe.nextSeq, nonce: p.rng.Uint64(), sent: now}
	pe.ring[(pe.head+pe.n)%len(pe.ring)] = o
	pe.n++
	pe.nextSeq++
	pe.sent++
	pe.nextSend = pe.nextSend.Add(p.cfg.Interval)
	if !pe.nextSend.After(now) {
		pe.nextSend = now.Add(p.cfg.Interval)
	}
	p.stats.Sent++
	p.stats.SentBytes += PacketLen
	return Probe{Peer: pe.id, Sequence: o.seq, Message: Message{Type: TypeRequest, Session: p.session, Sequence: o.seq, Nonce: o.nonce}.Bytes()}
}

// expire drops every outstanding probe whose Timeout has passed at now.
//
// +checklocks:p.mu
func (p *Prober) expire(pe *peer, now time.Time) {
	for pe.n > 0 && !now.Before(pe.ring[pe.head].sent.Add(p.cfg.Timeout)) {
		p.expireOldest(pe)
	}
}

// +checklocks:p.mu
func (p *Prober) expireOldest(pe *peer) {
	o := &pe.ring[pe.head]
	if !o.done {
		pe.expired++
		p.stats.Expired++
		if o.seq >= pe.answered { // newer than every answered probe: a consecutive miss
			pe.misses++
		}
	}
	*o = outstanding{}
	pe.head = (pe.head + 1) % len(pe.ring)
	pe.n--
}

// +checklocks:p.mu
func (p *Prober) nextExpiry(pe *peer) (time.Time, bool) {
	for i := 0; i < pe.n; i++ {
		if o := &pe.ring[(pe.head+i)%len(pe.ring)]; !o.done {
			return o.sent.Add(p.cfg.Timeout), true
		}
	}
	return time.Time{}, false
}

// HandleReply takes the UDP payload of a probe reply that arrived from peer
// id through the tunnel at now. A reply that matches an outstanding probe
// (same session, sequence and nonce, before the probe expired) is accepted:
// the peer's run of misses ends, and the reply becomes an RTT sample unless
// it ends a silence. The first sample sets the RTT, later ones move it by
// 1/8 (EWMA 7/8 old + 1/8 new). A sample that follows an expired one (older
// than StaleAfter) counts as a first sample: an expired measurement does
// not weigh on the new one.
//
// A sample is a round trip on an established path. The first reply after a
// silence (no reply accepted yet, or none for longer than Timeout) is not a
// sample, and neither is a reply to a probe sent before it: while a tunnel
// has no session, its first packets wait for the handshake (a WireGuard
// handshake, or its retries after a loss), and their round trips measure
// that wait rather than the path. Such a reply makes the peer due for a
// probe at once, whose reply is the first sample. Anything else is
// counted as rejected, changes nothing and returns an error: ErrMalformed,
// ErrVersion, ErrMessageType, ErrSession, ErrUnknownPeer or
// ErrUnmatchedReply (late, duplicate, replayed, never sent, wrong nonce).
func (p *Prober) HandleReply(id NodeID, payload []byte, now time.Time) error {
	m, err := ParseMessage(payload)
	if err == nil && m.Type != TypeReply {
		err = fmt.Errorf("%w: %v where a reply is expected", ErrMessageType, m.Type)
	}
	p.mu.Lock()
	wake, err := p.handleReplyLocked(id, m, err, now)
	p.mu.Unlock()
	if wake != nil {
		wake()
	}
	return err
}

// handleReplyLocked is HandleReply past parsing: err is the parse error, if
// any. It returns the function to call once p.mu is released, if any.
//
// +checklocks:p.mu
func (p *Prober) handleReplyLocked(id NodeID, m Message, err error, now time.Time) (wake func(), _ error) {
	if err == nil && m.Session != p.session {
		err = fmt.Errorf("%w: session %#x, ours is %#x", ErrSession, m.Session, p.session)
	}
	var pe *peer
	if err == nil {
		var ok bool
		if pe, ok = p.peers[id]; !ok {
			err = fmt.Errorf("%w: %v", ErrUnknownPeer, id)
		}
	}
	if err != nil {
		p.stats.Rejected++
		return nil, err
	}
	p.expire(pe, now)
	for i := 0; i < pe.n; i++ {
		o := &pe.ring[(pe.head+i)%len(pe.ring)]
		if o.seq != m.Sequence {
			continue
		}
		if o.done || o.nonce != m.Nonce {
			break
		}
		o.done = true
		switch {
		case pe.lastReply.IsZero() || now.Sub(pe.lastReply) > p.cfg.Timeout:
			// The end of a silence: measure again at once.
			pe.sampleFrom = now
			pe.nextSend = now
			wake = p.wake
			p.stats.Unsampled++
		case o.sent.Before(pe.sampleFrom):
			p.stats.Unsampled++
		default:
			p.sample(pe, now.Sub(o.sent), now)
		}
		pe.lastReply = now
		pe.answered = max(pe.answered, o.seq+1)
		pe.misses = 0
		pe.replies++
		p.stats.Replies++
		p.stats.ReplyBytes += PacketLen
		return wake, nil
	}
	p.stats.Rejected++
	return nil, fmt.Errorf("%w: peer %v sequence %d", ErrUnmatchedReply, id, m.Sequence)
}

// +checklocks:p.mu
func (p *Prober) sample(pe *peer, rtt time.Duration, now time.Time) {
	if rtt < 1 {
		rtt = 1 // never zero: zero is the local backends' RTT
	}
	fresh := pe.hasRTT && now.Sub(pe.lastSample) < p.cfg.StaleAfter
	pe.lastRTT = rtt
	pe.lastSample = now
	if !fresh { // the first sample, or the first after the old one expired, sets the RTT
		pe.rtt, pe.hasRTT = rtt, true
		return
	}
	pe.rtt = (7*pe.rtt + rtt) / 8
	if pe.rtt < 1 {
		pe.rtt = 1
	}
}

// Health returns the peer's state at now, first expiring the probes due to
// expire, so that it is exact whenever it is called. An untracked peer has
// Tracked false and ReasonNoPath.
func (p *Prober) Health(id NodeID, now time.Time) PeerHealth {
	p.mu.Lock()
	defer p.mu.Unlock()
	pe, ok := p.peers[id]
	if !ok {
		return PeerHealth{Reason: ReasonNoPath, SampleAge: -1}
	}
	p.expire(pe, now)
	h := PeerHealth{
		Tracked: true, PathUp: pe.pathUp, Misses: pe.misses,
		RTT: pe.rtt, LastRTT: pe.lastRTT, SampleAge: -1,
		Sent: pe.sent, Replies: pe.replies, Expired: pe.expired,
	}
	if pe.hasRTT {
		h.SampleAge = max(now.Sub(pe.lastSample), 0)
		h.RTTKnown = h.SampleAge < p.cfg.StaleAfter
	}
	switch {
	case !pe.pathUp:
		h.Reason = ReasonNoPath
	case pe.misses >= p.cfg.MissLimit:
		h.Reason = ReasonProbeTimeout
	case !pe.hasRTT:
		h.Reason = ReasonRTTUnknown
	case !h.RTTKnown:
		h.Reason = ReasonRTTStale
	default:
		h.Reason = ReasonOK
	}
	return h
}

// Stats returns the prober's counters.
func (p *Prober) Stats() ProberStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// SeedFrom expands v into a ProberConfig seed, for tests and examples that
// take their seeds from testenv.Seed. It never returns the zero seed.
func SeedFrom(v uint64) [32]byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], v)
	s[31] = 1 // never the zero seed, which means "random"
	return s
}
