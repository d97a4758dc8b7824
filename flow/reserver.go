package flow

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/netip"

	"github.com/vipkit/vipkit/internal/syncx"
)

// MemReserverOptions configures NewMemReserver.
type MemReserverOptions struct {
	// Min and Max bound the ports handed out (inclusive). Zero values mean
	// 32768 and 60999, Linux's default ephemeral range.
	Min, Max uint16
	// PerBackend keys uniqueness per (protocol, backend address, backend
	// port) instead of per protocol. A reply tuple stays unambiguous (it
	// includes the backend), and tables can exceed the ~28k ports of one
	// range: use it for capacities beyond 64k flows.
	PerBackend bool
	// Seed makes port choice reproducible; 0 means random.
	Seed uint64
}

// MemReserver is an in-memory PortReserver: a bitmap of ports per protocol
// (or per protocol and backend), handing out a random free port (RFC 6056
// style). It holds no OS resource, so it suits tests, userspace stacks and
// large tables; on a real host prefer OSReserver, which also keeps local
// sockets off the shadow ports. It is safe for concurrent use; the zero
// value is not usable.
type MemReserver struct {
	lo  int  // +checklocksignore: immutable after NewMemReserver
	hi  int  // +checklocksignore: immutable after NewMemReserver
	per bool // +checklocksignore: immutable after NewMemReserver

	mu syncx.Mutex
	// +checklocks:mu
	rng *rand.Rand
	// +checklocks:mu
	sets map[memKey]*portSet
	// +checklocks:mu
	inUse int
}

type memKey struct {
	proto   Proto
	backend netip.AddrPort
}

type portSet struct {
	bits [1024]uint64
	n    int
}

var _ PortReserver = (*MemReserver)(nil)

// NewMemReserver returns a MemReserver.
func NewMemReserver(o MemReserverOptions) *MemReserver {
	if o.Min == 0 {
		o.Min = 32768
	}
	if o.Max == 0 {
		o.Max = 60999
	}
	if o.Max < o.Min {
		o.Min, o.Max = o.Max, o.Min
	}
	seed := o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &MemReserver{
		lo: int(o.Min), hi: int(o.Max), per: o.PerBackend,
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		sets: make(map[memKey]*portSet),
	}
}

// Reserve implements PortReserver.
func (r *MemReserver) Reserve(proto Proto, backend netip.AddrPort) (uint16, error) {
	k := memKey{proto: proto}
	if r.per {
		k.backend = backend
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sets[k]
	if s == nil {
		s = new(portSet)
		r.sets[k] = s
	}
	span := r.hi - r.lo + 1
	if s.n >= span {
		return 0, fmt.Errorf("%w: %v toward %v (%d ports in use)", ErrPortsExhausted, proto, backend, s.n)
	}
	start := r.lo + r.rng.IntN(span)
	p := s.findFree(start, r.lo, r.hi)
	s.bits[p>>6] |= 1 << (p & 63)
	s.n++
	r.inUse++
	return uint16(p), nil
}

// findFree returns the first free port at or after start, wrapping to lo
// after hi. The set must have one.
func (s *portSet) findFree(start, lo, hi int) int {
	p := start
	for {
		w := s.bits[p>>6] | (1<<(p&63) - 1) // ignore ports below p in this word
		if w != ^uint64(0) {
			if c := p&^63 + bits.TrailingZeros64(^w); c <= hi {
				return c
			}
		}
		if p = (p | 63) + 1; p > hi {
			p = lo
		}
	}
}

// Release implements PortReserver. Releasing a port that is not reserved
// does nothing.
func (r *MemReserver) Release(proto Proto, backend netip.AddrPort, port uint16) {
	k := memKey{proto: proto}
	if r.per {
		k.backend = backend
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sets[k]
	if s == nil || s.bits[port>>6]&(1<<(port&63)) == 0 {
		return
	}
	s.bits[port>>6] &^= 1 << (port & 63)
	s.n--
	r.inUse--
	if s.n == 0 {
		delete(r.sets, k)
	}
}

// InUse returns the number of ports reserved.
func (r *MemReserver) InUse() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inUse
}

// FuncReserver adapts two functions to a PortReserver: for example the port
// manager of a gVisor netstack host (transport/netstack's Host.ReservePort
// and ReleasePort on the client's address), so that shadow ports are
// reserved in the userspace stack that owns the address. Reserve should
// return an error matching ErrPortsExhausted when no port is free. Both
// functions must be safe for concurrent use, and are called with the NAT's
// lock held: they must be quick, must not block and must not call back
// into the NAT (see PortReserver).
type FuncReserver struct {
	ReserveFunc func(proto Proto, backend netip.AddrPort) (uint16, error)
	ReleaseFunc func(proto Proto, backend netip.AddrPort, port uint16)
}

var _ PortReserver = FuncReserver{}

// Reserve calls ReserveFunc.
func (f FuncReserver) Reserve(proto Proto, backend netip.AddrPort) (uint16, error) {
	return f.ReserveFunc(proto, backend)
}

// Release calls ReleaseFunc.
func (f FuncReserver) Release(proto Proto, backend netip.AddrPort, port uint16) {
	f.ReleaseFunc(proto, backend, port)
}
