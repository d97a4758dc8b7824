package flow

import (
	"encoding/binary"
	"time"

	"github.com/vipkit/vipkit/packet"
)

// Refusals. A VIP port without a listener, or a listener without
// backends, cannot accept traffic; instead of a silent drop, which leaves
// the client to time out, the NAT answers from the VIP the way a host
// answers for a closed port:
//
//   - TCP (RFC 9293 §3.10.7.1): to a segment with ACK, <SEQ=SEG.ACK><CTL=RST>;
//     otherwise <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>, where SEG.LEN
//     counts the SYN and FIN flags. A RST is never answered.
//   - UDP (RFC 792, RFC 1812 §4.3.2.3): ICMP destination unreachable, port
//     unreachable, quoting the datagram's IP header and first 8 bytes of
//     data.
//
// Nothing is sent for a packet whose source or destination is not a
// unicast address (RFC 1812 §4.3.2.7), for a fragment other than the first
// (a fragmented datagram is answered once, when reassembled) or for ICMP
// (the NAT never translates an ICMP query to a VIP, and an ICMP error is
// never answered). A listener whose backends are all ineligible is not
// empty: its packets are dropped silently with ReasonNoBackend, so a
// retransmitted SYN can reach a backend that recovers.
//
// Replies go toward the host through Options.Emit and are bounded by a
// token bucket on the NAT's clock (Options.ReplyRate, ReplyBurst), so a
// VIP is no reflector: past it the packet is dropped with its cause.

// unicast4 reports whether an IPv4 address may be the source or
// destination of a reply: not 0/8, loopback, multicast, class E or the
// limited broadcast.
func unicast4(a uint32) bool {
	top := a >> 24
	return top != 0 && top != 127 && top < 224
}

// initReplies fills the token bucket.
// +checklocks:n.mu
func (n *NAT) initReplies() {
	if n.o.ReplyRate > 0 {
		n.replyCost = int64(time.Second) / int64(n.o.ReplyRate)
		n.replyMax = n.replyCost * int64(n.o.ReplyBurst)
		n.replyCredit = n.replyMax
	}
}

// replyTokenLocked takes one reply's token at now, if there is one.
// +checklocks:n.mu
func (n *NAT) replyTokenLocked(now int64) bool {
	if n.o.ReplyRate < 0 {
		return false
	}
	if d := now - n.replyAt; d > 0 {
		n.replyAt = now
		if d >= n.replyMax-n.replyCredit {
			n.replyCredit = n.replyMax
		} else {
			n.replyCredit += d
		}
	}
	if n.replyCredit < n.replyCost {
		return false
	}
	n.replyCredit -= n.replyCost
	return true
}

// refuseLocked answers a packet to a VIP port that cannot accept traffic
// (cause is ReasonNoListener, ReasonNoBackend or, for a TCP segment other
// than a SYN to a listener without backends, ReasonNoFlow) with a RST or
// an ICMP port unreachable, counted as ReasonRefused or
// ReasonPortUnreachable; a packet that gets no answer is dropped with
// cause. pkt is a validated, whole IPv4 TCP or UDP packet with a
// validated L4 header.
// +checklocks:n.mu
func (n *NAT) refuseLocked(pkt []byte, hl int, ls *listenerState, cause DropReason, now int64) Result {
	ip := packet.IPv4(pkt)
	src, dst := binary.BigEndian.Uint32(pkt[packet.IPv4SrcOff:]), binary.BigEndian.Uint32(pkt[packet.IPv4DstOff:])
	if n.o.Emit == nil || ip.FragOffset() != 0 || !unicast4(src) || !unicast4(dst) {
		return n.dropOnListener(ls, cause)
	}
	hdr := packet.IPv4Fields{Src: ip.Dst(), Dst: ip.Src()}
	var (
		out    []byte
		err    error
		reason DropReason
	)
	switch Proto(pkt[packet.IPv4ProtoOff]) {
	case ProtoTCP:
		t := packet.TCP(pkt[hl:])
		fl := t.Flags()
		if fl&packet.TCPFlagRST != 0 || !n.replyTokenLocked(now) {
			return n.dropOnListener(ls, cause)
		}
		rst := packet.TCPFields{SrcPort: t.DstPort(), DstPort: t.SrcPort(), Flags: packet.TCPFlagRST}
		if fl&packet.TCPFlagACK != 0 {
			rst.Seq = t.Ack()
		} else {
			l := uint32(len(t) - t.HeaderLen())
			if fl&packet.TCPFlagSYN != 0 {
				l++
			}
			if fl&packet.TCPFlagFIN != 0 {
				l++
			}
			rst.Ack, rst.Flags = t.Seq()+l, packet.TCPFlagRST|packet.TCPFlagACK
		}
		out, err = packet.AppendTCP(n.reply[:0], hdr, rst, nil)
		reason = ReasonRefused
	case ProtoUDP:
		if !n.replyTokenLocked(now) {
			return n.dropOnListener(ls, cause)
		}
		// pkt may be the reassembly buffer; quote from a copy.
		var q [packet.IPv4MaxHeaderLen + packet.ICMPv4MinQuoted]byte
		ql := copy(q[:], pkt[:min(len(pkt), hl+packet.ICMPv4MinQuoted)])
		out, err = packet.AppendICMPv4(n.reply[:0], hdr,
			packet.ICMPv4Fields{Type: packet.ICMPDestUnreachable, Code: packet.ICMPCodePortUnreach}, q[:ql])
		reason = ReasonPortUnreachable
	default:
		return n.dropOnListener(ls, cause)
	}
	if err != nil {
		return n.dropOnListener(ls, cause)
	}
	n.reply = out[:0]
	if reason == ReasonPortUnreachable {
		n.icmpSent++
	}
	n.o.Emit(ToHost, out)
	return n.dropOnListener(ls, reason)
}
