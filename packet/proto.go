package packet

import "strconv"

// Proto is an IP protocol number.
type Proto uint8

// The protocols vipkit's packet path understands.
const (
	ProtoICMP Proto = 1
	ProtoTCP  Proto = 6
	ProtoUDP  Proto = 17
)

// String returns "tcp", "udp", "icmp" or "proto(N)".
func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMP:
		return "icmp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// Version returns the IP version nibble of pkt (4 or 6 for IP packets), or
// 0 for an empty pkt.
func Version(pkt []byte) uint8 {
	if len(pkt) == 0 {
		return 0
	}
	return pkt[0] >> 4
}
