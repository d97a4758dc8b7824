package socks5

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server starts a Server on loopback that resolves "backend.test" to
// 127.0.0.1 and dials and listens with the kernel's stack.
func server(t *testing.T) (*Server, string) {
	t.Helper()
	s := &Server{
		Dial: func(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to.String())
		},
		ListenPacket: func(context.Context) (net.PacketConn, error) { return net.ListenPacket("udp", "127.0.0.1:0") },
		Resolve: func(_ context.Context, name string) (netip.Addr, error) {
			if name == "backend.test" {
				return netip.MustParseAddr("127.0.0.1"), nil
			}
			return netip.Addr{}, fmt.Errorf("%w: %s", ErrHostUnreachable, name)
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

func TestConnectByName(t *testing.T) {
	_, addr := server(t)
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello "+r.Host) })}
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bl)
	defer backend.Close()
	d, err := proxy.SOCKS5("tcp", addr, nil, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.(proxy.ContextDialer).DialContext}}
	defer hc.CloseIdleConnections()
	_, port, _ := net.SplitHostPort(bl.Addr().String())
	resp, err := hc.Get("http://backend.test:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello backend.test:"+port {
		t.Fatalf("got %q", b)
	}
	// An unknown name: host unreachable.
	if _, err := d.Dial("tcp", "nosuch.test:80"); err == nil || !strings.Contains(err.Error(), "host unreachable") {
		t.Fatalf("unknown name: %v", err)
	}
}

// handshake opens a raw client connection and sends a request.
func handshake(t *testing.T, addr string, cmd byte, dst Addr) (net.Conn, byte, netip.AddrPort) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte{5, 1, 0})
	var m [2]byte
	if _, err := io.ReadFull(c, m[:]); err != nil || m != [2]byte{5, 0} {
		t.Fatalf("method: % x %v", m, err)
	}
	c.Write(AppendAddr([]byte{5, cmd, 0}, dst))
	r := bufio.NewReader(c)
	var hdr [3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatal(err)
	}
	bound, err := readAddr(r)
	if err != nil {
		t.Fatal(err)
	}
	return c, hdr[1], netip.AddrPortFrom(bound.IP, bound.Port)
}

func TestUDPAssociate(t *testing.T) {
	_, addr := server(t)
	echo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			echo.WriteTo(append([]byte("echo "), buf[:n]...), from)
		}
	}()
	echoPort := uint16(echo.LocalAddr().(*net.UDPAddr).Port)
	ctrl, code, relay := handshake(t, addr, cmdAssociate, Addr{IP: netip.IPv4Unspecified()})
	defer ctrl.Close()
	if code != replySucceeded {
		t.Fatalf("associate: reply %d", code)
	}
	me, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer me.Close()
	me.SetDeadline(time.Now().Add(10 * time.Second))
	ask := func(c *net.UDPConn, msg string) (string, error) {
		c.WriteToUDPAddrPort(AppendDatagram(nil, Addr{Name: "backend.test", Port: echoPort}, []byte(msg)), relay)
		buf := make([]byte, 1500)
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return "", err
		}
		src, payload, err := ParseDatagram(buf[:n])
		if err != nil {
			return "", err
		}
		if src.IP != netip.MustParseAddr("127.0.0.1") || src.Port != echoPort {
			return "", fmt.Errorf("reply from %v", src)
		}
		return string(payload), nil
	}
	if got, err := ask(me, "one"); err != nil || got != "echo one" {
		t.Fatalf("UDP exchange: %q %v", got, err)
	}
	// Another socket, even on the same IP, is not the client's.
	other, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := ask(other, "intruder"); err == nil {
		t.Fatalf("a datagram from another socket was relayed: %q", got)
	}
	// Nor is another IP.
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 9)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	stranger.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := ask(stranger, "intruder"); err == nil {
		t.Fatalf("a datagram from another address was relayed: %q", got)
	}
	if got, err := ask(me, "two"); err != nil || got != "echo two" {
		t.Fatalf("UDP exchange after the refusals: %q %v", got, err)
	}
	// Closing the TCP connection ends the association.
	ctrl.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		me.SetDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := ask(me, "after"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the association outlived its TCP connection")
		}
	}
}

func TestRefusals(t *testing.T) {
	_, addr := server(t)
	c, code, _ := handshake(t, addr, cmdBind, Addr{IP: netip.IPv4Unspecified()})
	c.Close()
	if code != replyCommandUnsupported {
		t.Errorf("BIND: reply %d", code)
	}
	// Only "no authentication" is offered.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	c2.Write([]byte{5, 1, 2})
	var m [2]byte
	if _, err := io.ReadFull(c2, m[:]); err != nil || m != [2]byte{5, 0xff} {
		t.Errorf("user/password only: % x %v", m, err)
	}
}

// TestCloseEndsConnections: Close ends relaying connections and stalled
// handshakes alike, and waits for them (goleak checks nothing is left).
func TestCloseEndsConnections(t *testing.T) {
	s, addr := server(t)
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	port := uint16(bl.Addr().(*net.TCPAddr).Port)
	open, code, _ := handshake(t, addr, cmdConnect, Addr{IP: netip.MustParseAddr("127.0.0.1"), Port: port})
	defer open.Close()
	if code != replySucceeded {
		t.Fatalf("connect: %d", code)
	}
	stalled, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	stalled.Write([]byte{5})
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := open.Read(make([]byte, 1)); err == nil || errors.Is(err, errTimeout(err)) {
		t.Fatalf("a relayed connection survived Close: %v", err)
	}
}

func errTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return errors.New("not a timeout")
}

func FuzzParseDatagram(f *testing.F) {
	f.Add(AppendDatagram(nil, Addr{Name: "api.home", Port: 53}, []byte("q")))
	f.Add(AppendDatagram(nil, Addr{IP: netip.MustParseAddr("100.80.0.9"), Port: 443}, nil))
	f.Add(AppendDatagram(nil, Addr{IP: netip.MustParseAddr("fd00::1"), Port: 1}, []byte{0}))
	f.Add([]byte{0, 0, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, payload, err := ParseDatagram(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		// What parses re-encodes to the same bytes.
		if again := AppendDatagram(nil, a, payload); !bytes.Equal(again, b) {
			t.Fatalf("round trip: % x -> %+v -> % x", b, a, again)
		}
	})
}

// FuzzHandshake feeds arbitrary client bytes to a server: it never
// panics, and every connection ends.
func FuzzHandshake(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 8, 'a', 'p', 'i', '.', 'h', 'o', 'm', 'e', 0, 80})
	f.Add([]byte{5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{5, 2, 1, 2})
	f.Add([]byte{4, 1})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &Server{HandshakeTimeout: time.Second,
			Dial: func(context.Context, netip.AddrPort) (net.Conn, error) { return nil, ErrHostUnreachable },
			Resolve: func(context.Context, string) (netip.Addr, error) {
				return netip.Addr{}, ErrHostUnreachable
			}}
		s.mu.Lock()
		s.init()
		s.mu.Unlock()
		client, srv := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- s.handle(srv); srv.Close() }()
		go func() { client.Write(b); client.Close() }()
		go io.Copy(io.Discard, client)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("handle did not end")
		}
	})
}
