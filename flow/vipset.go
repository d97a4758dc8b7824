package flow

// The kinds of address a vipSet holds.
const (
	vipNone     uint8 = iota // not a VIP
	vipRouted                // a VIP with listeners, or claimed: all its traffic is the NAT's
	vipDraining              // only bindings that drain: only their flows are the NAT's
)

// vipSet is an immutable open-addressing set of IPv4 addresses, each with
// its kind (vipRouted or vipDraining).
type vipSet struct {
	entries  []uint32
	kinds    []uint8
	mask     uint32
	draining int // entries of kind vipDraining
}

// vipEntry is one address of a vipSet and its kind.
type vipEntry struct {
	addr uint32
	kind uint8
}

func newVIPSet(addrs []vipEntry) *vipSet {
	if len(addrs) == 0 {
		return nil
	}
	size := 8
	for size < 4*len(addrs) {
		size <<= 1
	}
	s := &vipSet{entries: make([]uint32, size), kinds: make([]uint8, size), mask: uint32(size - 1)}
	for _, a := range addrs {
		i := vipHash(a.addr) & s.mask
		for s.entries[i] != 0 {
			i = (i + 1) & s.mask
		}
		s.entries[i] = a.addr
		s.kinds[i] = a.kind
		if a.kind == vipDraining {
			s.draining++
		}
	}
	return s
}

func vipHash(a uint32) uint32 { return (a * 0x9e3779b1) ^ (a >> 16) }

// kind returns a's kind: vipNone when a is not in the set.
func (s *vipSet) kind(a uint32) uint8 {
	if s == nil || a == 0 {
		return vipNone
	}
	i := vipHash(a) & s.mask
	for {
		e := s.entries[i]
		if e == a {
			return s.kinds[i]
		}
		if e == 0 {
			return vipNone
		}
		i = (i + 1) & s.mask
	}
}

func (s *vipSet) has(a uint32) bool { return s.kind(a) != vipNone }

// anyDraining reports whether the set holds an address that only drains.
func (s *vipSet) anyDraining() bool { return s != nil && s.draining > 0 }
