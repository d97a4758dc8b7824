// Package transport holds vipkit's two lowest seams: PacketIO, batched IP
// packet I/O in the shape of wireguard-go's tun.Device, and Clock, the source
// of time that every state machine in vipkit takes instead of calling the
// time package directly.
//
// A kernel TUN, a gVisor netstack NIC (package transport/netstack) and a
// channel pair (package transport/transporttest) all satisfy PacketIO, and a
// wireguard-go device runs on top of any of them (package transport/wg). The
// vip engine is itself a PacketIO wrapper placed between the host's stack and
// the wireguard-go device:
//
//	host stack ⇄ vip engine ⇄ wireguard-go ⇄ Bind ⇄ network
//
// A PacketIO that can wake its own blocked Read (ReadInterrupter: a kernel
// TUN, a netstack host, a channel pair) lets a wrapper read it straight into
// its caller's buffers and still send packets of its own while it is idle.
//
// RealClock reads the system clock; transporttest.ManualClock makes time a
// test input. Per-packet and table code does not take a Clock at all: it is
// handed now as an argument.
//
// transport imports nothing else of vipkit's.
package transport

import (
	"errors"
	"fmt"
	"net"
)

// PacketIO moves whole IP packets in batches. Its methods mirror
// wireguard-go's tun.Device so that an adapter between the two is a thin
// shim.
//
// Buffers: every packet lives in bufs[i][offset:]. The offset bytes in front
// of each packet are headroom that the implementation may use (wireguard-go
// writes its message header there); callers must leave at least the offset
// they were asked for. A PacketIO never retains a buffer after Read or Write
// returns.
//
// Concurrency: Read may be called from one goroutine while Write is called
// from another; each of Read and Write is called by at most one goroutine at a
// time unless an implementation documents otherwise. (wireguard-go writes to
// its TUN from one goroutine per peer; transport/wg's adapter serializes
// those calls, so a PacketIO under a wg.Device keeps this contract.) Close may be called from
// any goroutine, at any time, any number of times.
type PacketIO interface {
	// Read blocks until at least one packet is available, then fills up to
	// len(bufs) packets into bufs[i][offset:], sets sizes[i] to each packet's
	// length, and returns how many it filled. len(sizes) ≥ len(bufs). A packet
	// larger than its buffer is dropped, never truncated. After Close, Read
	// returns an error that matches ErrClosed.
	Read(bufs [][]byte, sizes []int, offset int) (n int, err error)

	// Write sends the packets bufs[i][offset:] and returns how many it
	// accepted. A packet the implementation cannot deliver (bad version, no
	// route, full queue) is dropped and counted by the implementation, not
	// reported as an error; an error means the PacketIO itself failed, and
	// after Close it matches ErrClosed.
	Write(bufs [][]byte, offset int) (int, error)

	// BatchSize is the largest number of packets that Read may return and
	// that Write is asked to take at once. It is at least 1 and constant for
	// the life of the PacketIO.
	BatchSize() int

	// MTU is the largest IP packet, in bytes, that the PacketIO carries.
	MTU() int

	// Close releases the PacketIO's resources and unblocks a pending Read.
	// It is idempotent.
	Close() error
}

// ReadInterrupter is implemented by a PacketIO whose blocked Read can be
// woken from another goroutine. A wrapper that reads its host directly into
// its caller's buffers (the vip engine under wireguard-go) uses it to send
// packets of its own while the host is idle, without a goroutine that reads
// ahead into buffers of its own and copies every packet once more.
//
// The contract is that of a sticky wake-up flag. InterruptRead sets it; the
// Read in progress, or else the next Read, returns promptly: with 0 and an
// error matching ErrInterrupted, which clears the flag, or with packets it
// already had, which leaves the flag for a later Read. Interrupts made
// before the flag is cleared coalesce into one, and a Read may return
// ErrInterrupted when nothing new is pending, so a caller publishes its own
// state before calling InterruptRead and re-checks it after every Read.
// InterruptRead may be called from any goroutine, at any time, including
// after Close.
type ReadInterrupter interface {
	// InterruptRead wakes the Read in progress, or the next Read, with
	// ErrInterrupted.
	InterruptRead()
}

// ErrInterrupted is returned by the Read of a ReadInterrupter that
// InterruptRead woke. No packet was lost: a Read that returns it returns
// n = 0.
var ErrInterrupted = errors.New("transport: read interrupted")

// ErrClosed is returned by operations on a closed PacketIO or other closed
// transport object. It also matches net.ErrClosed with errors.Is.
var ErrClosed = fmt.Errorf("transport: %w", net.ErrClosed)

// ErrPacketTooBig reports a packet larger than an MTU or a buffer.
var ErrPacketTooBig = errors.New("transport: packet too big")
