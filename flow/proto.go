package flow

import "github.com/vipkit/vipkit/packet"

// Proto is an IP protocol number (packet.Proto).
type Proto = packet.Proto

// The protocols the packet path understands.
const (
	ProtoICMP = packet.ProtoICMP
	ProtoTCP  = packet.ProtoTCP
	ProtoUDP  = packet.ProtoUDP
)
