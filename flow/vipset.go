package flow

// vipSet is an immutable open-addressing set of IPv4 addresses.
type vipSet struct {
	entries []uint32
	mask    uint32
}

func newVIPSet(addrs []uint32) *vipSet {
	if len(addrs) == 0 {
		return nil
	}
	size := 8
	for size < 4*len(addrs) {
		size <<= 1
	}
	s := &vipSet{entries: make([]uint32, size), mask: uint32(size - 1)}
	for _, a := range addrs {
		i := vipHash(a) & s.mask
		for s.entries[i] != 0 {
			i = (i + 1) & s.mask
		}
		s.entries[i] = a
	}
	return s
}

func vipHash(a uint32) uint32 { return (a * 0x9e3779b1) ^ (a >> 16) }

func (s *vipSet) has(a uint32) bool {
	if s == nil || a == 0 {
		return false
	}
	i := vipHash(a) & s.mask
	for {
		e := s.entries[i]
		if e == a {
			return true
		}
		if e == 0 {
			return false
		}
		i = (i + 1) & s.mask
	}
}
