// Package transporttest provides importable fakes for the transport seams:
//
//   - ManualClock, a transport.Clock that moves only when told to and fires
//     due callbacks deterministically, in deadline order;
//   - NewChanPair, two connected in-memory PacketIOs;
//   - Network, a simulated datagram network whose links have latency, jitter,
//     loss, duplication, reordering and partitions, on any Clock, with a
//     seeded random source.
//
// Tests of vipkit's own state machines run on a ManualClock over a Network
// and are reproducible from their seed. Tests that run wireguard-go or gVisor
// use the same Network on the real clock (see transport/wg's Bind over it).
package transporttest
