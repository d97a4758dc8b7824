package wg

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// udp4 builds an IPv4/UDP packet (checksums set, UDP checksum 0).
func udp4(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8] = 64
	p[9] = 17
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dport)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// rawNode is a Device on one end of a channel pair; the test holds the
// other end (host) and plays the host's IP stack with raw packets. What
// comes out of the tunnel is collected in rx.
type rawNode struct {
	key  Key
	addr netip.Addr // overlay address
	bind *wgtest.SimBind
	dev  *Device
	host *transporttest.ChanIO
	io   *transporttest.ChanIO
	rx   chan []byte
	dups sync.Map // string(packet) → true: repeats of pingUntil, skipped by quiet
}

func newRawNode(t *testing.T, n *transporttest.Network, name string, addr string) *rawNode {
	t.Helper()
	io, host := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	r := &rawNode{key: GeneratePrivateKey(), addr: netip.MustParseAddr(addr), bind: wgtest.NewSimBind(n, name), host: host, io: io, rx: make(chan []byte, 4096)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		bufs := make([][]byte, 16)
		for i := range bufs {
			bufs[i] = make([]byte, 2048)
		}
		sizes := make([]int, len(bufs))
		for {
			n, err := host.Read(bufs, sizes, 0)
			for i := range n {
				select {
				case r.rx <- bytes.Clone(bufs[i][:sizes[i]]):
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { host.Close(); io.Close(); <-done })
	return r
}

func (r *rawNode) peer(withIPs ...string) PeerConfig {
	p := PeerConfig{PublicKey: r.key.PublicKey(), Endpoint: r.bind.Addr()}
	for _, s := range withIPs {
		p.AllowedIPs = append(p.AllowedIPs, netip.MustParsePrefix(s))
	}
	return p
}

func (r *rawNode) start(t *testing.T, peers ...PeerConfig) {
	t.Helper()
	d, err := NewDevice(r.io, Config{PrivateKey: r.key, Peers: peers}, Options{Bind: r.bind})
	if err != nil {
		t.Fatalf("NewDevice: %v", err)
	}
	r.dev = d
	t.Cleanup(func() { d.Close() })
}

// send writes one packet into the node's host side (towards the tunnel).
func (r *rawNode) send(t *testing.T, pkt []byte) {
	t.Helper()
	if _, err := r.host.Write([][]byte{pkt}, 0); err != nil {
		t.Fatalf("host write: %v", err)
	}
}

// waitFor returns the first packet out of the tunnel that equals want,
// skipping others, or fails after timeout.
func (r *rawNode) waitFor(t *testing.T, want []byte, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case b := <-r.rx:
			if bytes.Equal(b, want) {
				return
			}
		case <-deadline.C:
			t.Fatalf("packet did not come out of the tunnel within %v", timeout)
		}
	}
}

// pingUntil sends pkt from src every 50 ms until it comes out at dst (the
// first packets may wait for the handshake).
func pingUntil(t *testing.T, src, dst *rawNode, pkt []byte, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	dst.dups.Store(string(pkt), true)
	src.send(t, pkt)
	for {
		select {
		case b := <-dst.rx:
			if bytes.Equal(b, pkt) {
				return
			}
		case <-tick.C:
			src.send(t, pkt)
		case <-deadline.C:
			t.Fatalf("packet did not arrive within %v", timeout)
		}
	}
}

// quiet fails if any packet comes out of r's tunnel within d.
func (r *rawNode) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case b := <-r.rx:
			if _, dup := r.dups.Load(string(b)); !dup {
				t.Fatalf("unexpected packet %x", b)
			}
		case <-deadline:
			return
		}
	}
}
