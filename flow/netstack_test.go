package flow

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
)

// hostReserver reserves shadow ports in a gVisor netstack host's own port
// manager, so none of its sockets can take one.
func hostReserver(h *netstack.Host, addr netip.Addr) PortReserver {
	return FuncReserver{
		ReserveFunc: func(p Proto, _ netip.AddrPort) (uint16, error) {
			port, err := h.ReservePort(p.String(), addr, 0)
			if errors.Is(err, syscall.EAGAIN) {
				return 0, errors.Join(ErrPortsExhausted, err)
			}
			return port, err
		},
		ReleaseFunc: func(p Proto, _ netip.AddrPort, port uint16) { _ = h.ReleasePort(p.String(), addr, port) },
	}
}

// router moves packets between a client host and a backend host through a
// NAT, the way the vip engine does between the host's TUN and the overlay:
// everything the client sends goes through FromHostBatch, everything the
// backend sends through FromPeerBatch (as peer backendPeer).
type router struct {
	nat             *NAT
	client, backend *netstack.Host
	wg              sync.WaitGroup
}

const routerOffset = 16

func (r *router) start() {
	r.wg.Add(2)
	go r.loop(r.client, true)
	go r.loop(r.backend, false)
}

func (r *router) loop(from *netstack.Host, fromClient bool) {
	defer r.wg.Done()
	batch := from.BatchSize()
	bufs := make([][]byte, batch)
	sizes := make([]int, batch)
	pkts := make([][]byte, batch)
	res := make([]Result, batch)
	for i := range bufs {
		bufs[i] = make([]byte, routerOffset+from.MTU())
	}
	var toClient, toBackend [][]byte
	for {
		n, err := from.Read(bufs, sizes, routerOffset)
		if err != nil {
			return
		}
		for i := range n {
			pkts[i] = bufs[i][routerOffset : routerOffset+sizes[i]]
		}
		if fromClient {
			r.nat.FromHostBatch(pkts[:n], time.Now(), res)
		} else {
			r.nat.FromPeerBatch(pkts[:n], be1.Peer, time.Now(), res)
		}
		toClient, toBackend = toClient[:0], toBackend[:0]
		for i := range n {
			switch res[i].Verdict {
			case Forward, Pass:
				if fromClient {
					toBackend = append(toBackend, pkts[i])
				} else {
					toClient = append(toClient, pkts[i])
				}
			case Reflect:
				toClient = append(toClient, pkts[i])
			}
		}
		if len(toClient) > 0 {
			r.client.Write(toClient, 0)
		}
		if len(toBackend) > 0 {
			r.backend.Write(toBackend, 0)
		}
	}
}

type netstackEnv struct {
	nat             *NAT
	client, backend *netstack.Host
	unreach         chan report
}

func newNetstackEnv(t *testing.T) *netstackEnv {
	client, err := netstack.New(netstack.Options{Addrs: []netip.Addr{localAddr}, MTU: 1420})
	if err != nil {
		t.Fatalf("%v", err)
	}
	backend, err := netstack.New(netstack.Options{Addrs: []netip.Addr{be1.Addr}, MTU: 1420})
	if err != nil {
		t.Fatalf("%v", err)
	}
	env := &netstackEnv{client: client, backend: backend, unreach: make(chan report, 16)}
	r := &router{client: client, backend: backend}
	n, err := New(Options{
		LocalAddr: localAddr,
		Selector:  &testSel{},
		Reserver:  hostReserver(client, localAddr),
		MTU:       1420,
		Emit: func(d Direction, p []byte) {
			if d == ToHost {
				client.Write([][]byte{p}, 0)
			} else {
				backend.Write([][]byte{p}, 0)
			}
		},
		OnPortUnreachable: func(l Listener, b Backend) { env.unreach <- report{l, b} },
	})
	if err != nil {
		t.Fatalf("%v", err)
	}
	r.nat, env.nat = n, n
	r.start()
	t.Cleanup(func() {
		n.Close()
		client.Close()
		backend.Close()
		r.wg.Wait()
	})
	return env
}

func TestNetstackTCPThroughNAT(t *testing.T) {
	env := newNetstackEnv(t)
	if err := env.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}); err != nil {
		t.Fatalf("env.nat.SetListener(lTCP, ListenerConfig{Backends: []Backend{be1}}): %v", err)
	}
	ln, err := env.backend.ListenTCP(be1.AddrPort())
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer ln.Close()
	seen := make(chan net.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		seen <- c.RemoteAddr()
		io.Copy(c, c) // echo
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := env.client.DialTCP(ctx, netip.AddrPortFrom(vipAddr, 443))
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer c.Close()
	if want, got := netip.AddrPortFrom(vipAddr, 443).String(), c.RemoteAddr().String(); got != want {
		t.Fatalf("c.RemoteAddr().String() = %v, want %v", got, want)
	}

	data := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	go func() { c.Write(data) }()
	got := make([]byte, len(data))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.ReadFull(c, got)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if want, gotV := sha256.Sum256(data), sha256.Sum256(got); gotV != want {
		t.Fatalf("sha256.Sum256(got) = %v, want %v", gotV, want)
	}

	remote := <-seen
	bs := env.nat.Bindings()
	if len(bs) != 1 {
		t.Fatalf("len(bs) = %d, want %d: %v", len(bs), 1, bs)
	}
	if want, got := bs[0].Shadow.String(), remote.String(); got != want {
		t.Fatalf("the backend sees the client's overlay address and shadow port: remote.String() = %v, want %v", got, want)
	}
	if got := bs[0].Shadow.Addr(); got != localAddr {
		t.Fatalf("bs[0].Shadow.Addr() = %v, want %v", got, localAddr)
	}
	if bs[0].BytesIn <= uint64(1<<20) {
		t.Fatalf("bs[0].BytesIn = %v, want > %v", bs[0].BytesIn, uint64(1<<20))
	}
	if bs[0].BytesOut <= uint64(1<<20) {
		t.Fatalf("bs[0].BytesOut = %v, want > %v", bs[0].BytesOut, uint64(1<<20))
	}
	// The shadow port is held in the client's own stack.
	_, err = env.client.ReservePort("tcp", localAddr, bs[0].Shadow.Port())
	if err == nil {
		t.Fatal("err is nil, want an error")
	}
}

func TestNetstackUDPAndFragments(t *testing.T) {
	env := newNetstackEnv(t)
	if err := env.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{{Peer: be1.Peer, Addr: be1.Addr, Port: 5353}}}); err != nil {
		t.Fatalf("env.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{{Peer: be1.Peer, Addr: be1.Addr, Port: 5353}}}): %v", err)
	}
	pc, err := env.backend.ListenUDP(netip.AddrPortFrom(be1.Addr, 5353))
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			// Echo, reversed, so the reply differs from the request.
			out := bytes.Clone(buf[:n])
			for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
				out[i], out[j] = out[j], out[i]
			}
			pc.WriteTo(out, from)
		}
	}()
	c, err := env.client.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(vipAddr, 53))
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer c.Close()
	for _, size := range []int{5, 1392, 1393, 8000, 30000} {
		msg := make([]byte, size)
		for i := range msg {
			msg[i] = byte(i * 13)
		}
		want := bytes.Clone(msg)
		for i, j := 0, len(want)-1; i < j; i, j = i+1, j-1 {
			want[i], want[j] = want[j], want[i]
		}
		got := make([]byte, 65536)
		var n int
		// UDP may lose a fragment to a full queue; retry a few times.
		for try := 0; ; try++ {
			_, err = c.Write(msg)
			if err != nil {
				t.Fatalf("%v", err)
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, err = c.Read(got)
			if err == nil || try == 3 {
				break
			}
		}
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if gotV := got[:n]; !bytes.Equal(gotV, want) {
			t.Fatalf("size %d: got[:n] = %v, want %v", size, gotV, want)
		}
	}
	st := env.nat.Stats()
	if st.Reassembled <= 0 {
		t.Fatalf("large datagrams were reassembled: st.Reassembled = %v, want > 0", st.Reassembled)
	}
	if st.Fragmented <= 0 {
		t.Fatalf("and fragmented again to the MTU: st.Fragmented = %v, want > 0", st.Fragmented)
	}
	if st.FragPending != 0 {
		t.Fatalf("st.FragPending = %v, want %v", st.FragPending, 0)
	}
}

func TestNetstackLocalBackend(t *testing.T) {
	env := newNetstackEnv(t)
	hl := Listener{VIP: vip2Addr, Proto: ProtoTCP, Port: 80}
	if err := env.nat.SetListener(hl, ListenerConfig{Backends: []Backend{beLocal}}); err != nil {
		t.Fatalf("env.nat.SetListener(hl, ListenerConfig{Backends: []Backend{beLocal}}): %v", err)
	}
	ln, err := env.client.ListenTCP(beLocal.AddrPort())
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer ln.Close()
	seen := make(chan net.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		seen <- c.RemoteAddr()
		io.Copy(c, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := env.client.DialTCP(ctx, netip.AddrPortFrom(vip2Addr, 80))
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("hairpin "), 20000)
	go func() { c.Write(msg) }()
	got := make([]byte, len(msg))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.ReadFull(c, got)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got = %v, want %v", got, msg)
	}
	remote := (<-seen).(*net.TCPAddr)
	if got := remote.AddrPort().Addr(); got != vip2Addr {
		t.Fatalf("the local backend sees the VIP as source: remote.AddrPort().Addr() = %v, want %v", got, vip2Addr)
	}
	bs := env.nat.Bindings()
	if len(bs) != 1 {
		t.Fatalf("len(bs) = %d, want %d: %v", len(bs), 1, bs)
	}
	if !bs[0].Hairpin {
		t.Fatal("bs[0].Hairpin is false")
	}
	if got := bs[0].Shadow.Port(); got != uint16(remote.Port) {
		t.Fatalf("bs[0].Shadow.Port() = %v, want %v", got, uint16(remote.Port))
	}
}

func TestNetstackPortUnreachable(t *testing.T) {
	env := newNetstackEnv(t)
	dead := Backend{Peer: be1.Peer, Addr: be1.Addr, Port: 9999} // nothing listens there
	if err := env.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{dead}}); err != nil {
		t.Fatalf("env.nat.SetListener(lUDP, ListenerConfig{Backends: []Backend{dead}}): %v", err)
	}
	c, err := env.client.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(vipAddr, 53))
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer c.Close()
	_, err = c.Write([]byte("anyone?"))
	if err != nil {
		t.Fatalf("%v", err)
	}
	select {
	case r := <-env.unreach:
		if want := (report{lUDP, dead}); r != want {
			t.Fatalf("r = %v, want %v", r, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no port unreachable reported")
	}
	// The client's stack got the translated error for its own VIP flow: its
	// connected socket reports the refusal.
	// (The error may land while a read is already waiting, which gVisor
	// reports on the next read: poll with a deadline.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err = c.Read(make([]byte, 10))
		if err != nil && strings.Contains(err.Error(), "refused") { // gVisor's tcpip.ErrConnectionRefused
			break
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("no refusal seen by the client socket: %v: time.Now().Before(deadline) is false", err)
		}
	}
	ls, _ := env.nat.ListenerStats(lUDP)
	if ls.PacketsIn != uint64(1) {
		t.Fatalf("the ICMP error was translated and counted: ls.PacketsIn = %v, want %v", ls.PacketsIn, uint64(1))
	}
}

var _ transport.PacketIO = (*netstack.Host)(nil)
