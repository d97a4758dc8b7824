package tsng

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/socks5"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/vip"
)

// floodFor is how long the local user floods a peer's probe port: 20
// probes of the client's at ProbeFast's 250 ms.
const floodFor = 5 * time.Second

// TestLocalUserProbeFlood: a local user on the client (another uid) sends
// probe requests to server1's probe port through every proxy mode, as
// fast as it can for 5 s. Peers take what arrives on that port from the
// client's overlay address as the client's probes, so before, server1's
// reply budget for the client went to the flood and the client's own
// probes expired. Now the proxies refuse the port (SOCKS5 reply 2, HTTP
// 403): server1 refuses nothing, no client probe expires, and server1's
// backends stay eligible at the client throughout.
func TestLocalUserProbeFlood(t *testing.T) {
	switch testenv.OtherUserRole() {
	case "probe-flood":
		probeFlooder(t)
		return
	case "udp-flood":
		udpFlooder(t)
		return
	}
	h := newHostApps(t)
	s1 := h.daemons[0].Runtime("home").Engine()
	cl := h.client.Runtime("home").Engine()
	target := netip.AddrPortFrom(s1.LocalAddr(), s1.ProbePort())
	before1, beforeCl := s1.Status().Probe, cl.Status().Probe

	cmd := testenv.AsOtherUser(t, "TestLocalUserProbeFlood", "probe-flood",
		"FLOOD_SOCKS="+h.socks, "FLOOD_HTTP="+h.httpProx, "FLOOD_TARGET="+target.String())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	samples, ineligible := 0, 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var werr error
wait:
	for {
		select {
		case werr = <-done:
			break wait
		case <-tick.C:
			samples++
			if eligibleOf(cl, "server1") != 2 {
				ineligible++
			}
		}
	}
	t.Logf("attacker (uid %d):\n%s", testenv.OtherUID, out.String())
	if werr != nil {
		t.Fatalf("attacker: %v", werr)
	}
	after1, afterCl := s1.Status().Probe, cl.Status().Probe
	if n := after1.Rejected - before1.Rejected; n != 0 {
		t.Errorf("server1 refused %d probe packets from the client's address during the flood, want 0", n)
	}
	if n := afterCl.Expired - beforeCl.Expired; n != 0 {
		t.Errorf("%d of the client's probes expired during the flood, want 0", n)
	}
	if ineligible != 0 {
		t.Errorf("server1's backends were ineligible at the client in %d of %d samples, want none", ineligible, samples)
	}
	// vip forward refuses a listener on the probe port.
	reg := h.client.Runtime("home").Registry()
	if _, err := reg.Create(h.ctx, "probes"); err != nil {
		t.Fatal(err)
	}
	be, err := reg.ResolveBackend(fmt.Sprintf("server1:%d", probe.DefaultPort))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []vip.PortKey{{Proto: vip.UDP, Port: probe.DefaultPort}, {Proto: vip.TCP, Port: probe.DefaultPort}} {
		if _, err := reg.PortAdd(h.ctx, "probes", k, []vip.Backend{be}); err != nil {
			t.Fatal(err)
		}
		_, _, err := h.client.Forward(h.ctx, "home", ForwardRequest{VIP: "probes", Listener: k.String()})
		if !errors.Is(err, vip.ErrInvalid) || !strings.Contains(err.Error(), "probe port") {
			t.Errorf("forward to %s: %v, want the probe port refused", k, err)
		}
	}
	for _, want := range []string{"socks5 connect: refused 2", "http connect: 403", "http get: 403", "socks5 udp: sent"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("attacker's report lacks %q", want)
		}
	}
}

// eligibleOf counts the eligible backends on node at e.
func eligibleOf(e *vip.Engine, node string) int {
	n := 0
	for _, s := range e.Status().Services {
		for _, l := range s.Listeners {
			for _, b := range l.Backends {
				if b.NodeName == node && b.Eligible {
					n++
				}
			}
		}
	}
	return n
}

// probeFlooder is the local user's side: CONNECT through SOCKS5 and the
// HTTP proxy, an absolute-form GET, then probe requests through UDP
// ASSOCIATE for floodFor. It reports each outcome on stdout.
func probeFlooder(t *testing.T) {
	socks, httpProx := os.Getenv("FLOOD_SOCKS"), os.Getenv("FLOOD_HTTP")
	target := netip.MustParseAddrPort(os.Getenv("FLOOD_TARGET"))
	fmt.Printf("uid %d floods %v\n", os.Getuid(), target)

	// SOCKS5 CONNECT.
	if c, err := net.DialTimeout("tcp", socks, 3*time.Second); err == nil {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write([]byte{5, 1, 0})
		var m [2]byte
		io.ReadFull(c, m[:])
		c.Write(socks5.AppendAddr([]byte{5, 1, 0}, socks5.Addr{IP: target.Addr(), Port: target.Port()}))
		var rep [2]byte
		_, err := io.ReadFull(c, rep[:])
		fmt.Printf("socks5 connect: refused %d %v\n", rep[1], err)
		c.Close()
	}
	// HTTP CONNECT and an absolute-form GET.
	if c, err := net.DialTimeout("tcp", httpProx, 3*time.Second); err == nil {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err == nil {
			fmt.Printf("http connect: %d\n", resp.StatusCode)
		} else {
			fmt.Printf("http connect: %v\n", err)
		}
		c.Close()
	}
	if c, err := net.DialTimeout("tcp", httpProx, 3*time.Second); err == nil {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			fmt.Printf("http get: %d\n", resp.StatusCode)
		} else {
			fmt.Printf("http get: %v\n", err)
		}
		c.Close()
	}

	// UDP ASSOCIATE: probe requests, as fast as the relay takes them.
	c, err := net.DialTimeout("tcp", socks, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	c.Write([]byte{5, 1, 0})
	br := bufio.NewReader(c)
	var m [2]byte
	io.ReadFull(br, m[:])
	c.Write(socks5.AppendAddr([]byte{5, 3, 0}, socks5.Addr{IP: netip.IPv4Unspecified()}))
	var rep [3]byte
	if _, err := io.ReadFull(br, rep[:]); err != nil || rep[1] != 0 {
		t.Fatalf("UDP ASSOCIATE: % x %v", rep, err)
	}
	var bnd [7]byte
	if _, err := io.ReadFull(br, bnd[:]); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Time{})
	relay := netip.AddrPortFrom(netip.AddrFrom4([4]byte(bnd[1:5])), uint16(bnd[5])<<8|uint16(bnd[6]))
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	var msg []byte
	sent := floodProbes(func(req []byte) error {
		msg = socks5.AppendDatagram(msg[:0], socks5.Addr{IP: target.Addr(), Port: target.Port()}, req)
		_, err := u.WriteToUDPAddrPort(msg, relay)
		return err
	})
	fmt.Printf("socks5 udp: sent %d datagrams\n", sent)
}

// floodProbes sends probe requests with send for floodFor, as fast as a
// socket buffer takes them, and returns how many were sent.
func floodProbes(send func(req []byte) error) int {
	ctx, cancel := context.WithTimeout(context.Background(), floodFor)
	defer cancel()
	sent := 0
	for seq := uint64(1); ctx.Err() == nil; seq++ {
		req := probe.Message{Type: probe.TypeRequest, Session: 7, Sequence: seq, Nonce: seq * 7919}.Bytes()
		if send(req[:]) == nil {
			sent++
		}
		if seq%64 == 0 {
			time.Sleep(time.Millisecond) // a socket buffer's room, not a drop test
		}
	}
	return sent
}

// udpFlooder is the local user's side in tun mode: probe requests straight
// from a UDP socket of the host's stack to FLOOD_TARGET (a peer's probe
// port), which the kernel routes into the TUN, for floodFor.
func udpFlooder(t *testing.T) {
	target := netip.MustParseAddrPort(os.Getenv("FLOOD_TARGET"))
	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(target))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	sent := floodProbes(func(req []byte) error { _, err := u.Write(req); return err })
	fmt.Printf("uid %d: udp: sent %d datagrams to %v\n", os.Getuid(), sent, target)
}
