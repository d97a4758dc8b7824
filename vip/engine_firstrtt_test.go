package vip

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/probe"
)

// WireGuard's message types (the first little-endian 32-bit word of every
// message): handshake initiation and handshake response.
const (
	wgHandshakeInitiation = 1
	wgHandshakeResponse   = 2
)

// delayBind is a conn.Bind that sends WireGuard handshake messages
// (initiations and responses) delay late, as a path on which handshakes are
// slow or need a retry would; cookie replies and data pass at once. It
// counts the messages it held.
type delayBind struct {
	conn.Bind
	delay time.Duration // +checklocksignore: set before use
	held  atomic.Int64

	mu sync.Mutex
	// +checklocks:mu
	timers []*time.Timer
}

var _ conn.Bind = (*delayBind)(nil)

func (b *delayBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	now := bufs[:0:0]
	for _, buf := range bufs {
		if len(buf) >= 4 {
			if t := binary.LittleEndian.Uint32(buf); t == wgHandshakeInitiation || t == wgHandshakeResponse {
				msg := bytes.Clone(buf)
				b.held.Add(1)
				b.mu.Lock()
				b.timers = append(b.timers, time.AfterFunc(b.delay, func() { _ = b.Bind.Send([][]byte{msg}, ep) }))
				b.mu.Unlock()
				continue
			}
		}
		now = append(now, buf)
	}
	if len(now) == 0 {
		return nil
	}
	return b.Bind.Send(now, ep)
}

// Close stops the messages still held, then closes the Bind.
func (b *delayBind) Close() error {
	b.mu.Lock()
	for _, t := range b.timers {
		t.Stop()
	}
	b.timers = nil
	b.mu.Unlock()
	return b.Bind.Close()
}

// TestEngineFirstRTTAfterSlowHandshake: on a path of 1 ms RTT whose
// WireGuard handshake messages (types 1 and 2) each arrive 1 s late, the
// first RTT the engine reports for a backend measures the path, not the
// handshake. The first probe waits for the handshake (its reply comes some
// 2 s after it was sent); it is no sample.
func TestEngineFirstRTTAfterSlowHandshake(t *testing.T) {
	const (
		oneWay  = 500 * time.Microsecond
		pathRTT = 2 * oneWay
		slack   = 20 * time.Millisecond
	)
	var binds []*delayBind
	c := newCluster(t, clusterOptions{
		n:         2,
		coldStart: true,
		latency:   map[[2]int]time.Duration{{0, 1}: oneWay},
		bind: func(_ int, b conn.Bind) conn.Bind {
			d := &delayBind{Bind: b, delay: time.Second}
			binds = append(binds, d)
			return d
		},
	})
	client, server := c.nodes[0], c.nodes[1]
	ctx := context.Background()
	if _, err := client.reg.Create(ctx, "dns"); err != nil {
		t.Fatal(err)
	}
	// A UDP listener: no connect check, only the path probe.
	if _, err := client.reg.PortAdd(ctx, "dns", PortKey{UDP, 53}, []Backend{{server.info.ID, 5353}}); err != nil {
		t.Fatal(err)
	}
	c.spread()
	start := time.Now()
	var b BackendStatus
	pollUntil(t, 20*time.Second, "the backend's first RTT", func() bool {
		l, ok := listenerOf(client, "dns", "udp/53")
		if !ok || len(l.Backends) != 1 {
			return false
		}
		b = l.Backends[0]
		return b.RTTKnown
	})
	t.Logf("first RTT %.3f ms, known %v after the service was applied", b.RTTMillis, time.Since(start).Round(time.Millisecond))
	if binds[0].held.Load() == 0 || binds[1].held.Load() == 0 {
		t.Fatalf("no handshake message was delayed (client %d, server %d)", binds[0].held.Load(), binds[1].held.Load())
	}
	if limit := pathRTT + slack; b.RTTMillis >= float64(limit)/float64(time.Millisecond) {
		t.Fatalf("first RTT %.3f ms on a %v path, want below %v", b.RTTMillis, pathRTT, limit)
	}
	e, id := client.engine(), probe.NodeID(server.info.ID)
	h := e.Prober().Health(id, e.clock.Now())
	if st := e.Prober().Stats(); st.Unsampled == 0 || h.Replies < 2 {
		t.Fatalf("the reply that waited for the handshake: %d unsampled replies, %d replies", st.Unsampled, h.Replies)
	}
	// The probes sent while the handshake was pending came back right
	// after the first reply; none of them may weigh on the average later.
	replies := h.Replies
	pollUntil(t, 10*time.Second, "two more samples", func() bool {
		h = e.Prober().Health(id, e.clock.Now())
		return h.Replies >= replies+2
	})
	if limit := pathRTT + slack; h.RTT >= limit {
		t.Fatalf("smoothed RTT %v two samples later on a %v path, want below %v", h.RTT, pathRTT, limit)
	}
}
