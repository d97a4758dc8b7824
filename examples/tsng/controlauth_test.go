package tsng

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// loopNet is ControlNet over the kernel's loopback: outgoing connections
// bound to self, listeners from net.ListenTCP. It keeps the connections it
// dialed, so a test can tell whether the peer closed them.
type loopNet struct {
	self netip.Addr

	mu sync.Mutex
	// +checklocks:mu
	dialed []net.Conn
}

func (l *loopNet) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: l.self.AsSlice()}}
	c, err := d.DialContext(ctx, network, address)
	if err == nil {
		l.mu.Lock()
		l.dialed = append(l.dialed, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *loopNet) Listen(addr netip.AddrPort) (net.Listener, error) {
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	return ln, nil
}

func (l *loopNet) dials() []net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]net.Conn(nil), l.dialed...)
}

// inboundFrom returns the remote addresses of c's inbound connections
// from member id.
func inboundFrom(c *Control, id vip.NodeID) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, x := range c.inbound[id] {
		out = append(out, x.conn.RemoteAddr().String())
	}
	return out
}

// pendingFrom returns how many of c's inbound connections from member id
// are in the handshake.
func pendingFrom(c *Control, id vip.NodeID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending[id])
}

// testKey returns the identity key and id of a test member, derived from
// its name.
func testKey(name string) (ed25519.PrivateKey, vip.NodeID) {
	seed := sha256.Sum256([]byte("tsng-control-test/" + name))
	k := ed25519.NewKeyFromSeed(seed[:])
	var id vip.NodeID
	copy(id[:], k.Public().(ed25519.PublicKey))
	return k, id
}

// members maps test members to their addresses both ways.
type members map[vip.NodeID]netip.Addr

func (m members) peer(x netip.Addr) (vip.NodeID, bool) {
	for id, a := range m {
		if a == x {
			return id, true
		}
	}
	return vip.NodeID{}, false
}

func (m members) addr(id vip.NodeID) (netip.Addr, bool) { a, ok := m[id]; return a, ok }

// node is one test member's Control on the loopback.
type node struct {
	id  vip.NodeID
	net *loopNet
	log *frameLog
	c   *Control
}

func startNode(t *testing.T, m members, name string, self netip.Addr, port uint16, auth ControlAuth, tweak func(*ControlOptions)) *node {
	t.Helper()
	k, id := testKey(name)
	n := &node{id: id, net: &loopNet{self: self}, log: &frameLog{}}
	o := ControlOptions{Net: n.net, Self: self, Port: port, Key: k, Auth: auth, Peer: m.peer, Addr: m.addr, MaxFrame: 1024, Handle: n.log.handle}
	if tweak != nil {
		tweak(&o)
	}
	c, err := NewControl(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	n.c = c
	t.Cleanup(func() { c.Close() })
	return n
}

// frameLog records the frames a Control's Handle received.
type frameLog struct {
	mu sync.Mutex
	// got holds "<first 2 hex digits of the sender>:<frame>".
	// +checklocks:mu
	got []string
}

func (f *frameLog) handle(_ context.Context, from vip.NodeID, b []byte) error {
	f.mu.Lock()
	f.got = append(f.got, from.String()[:2]+":"+string(b))
	f.mu.Unlock()
	return nil
}

func (f *frameLog) frames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

// otherUser starts the test binary as another uid in role, with env, and
// returns its stdout lines and a function that closes its stdin (the
// signal to finish) and waits for it.
func otherUser(t *testing.T, test, role string, env ...string) (lines <-chan string, finish func()) {
	t.Helper()
	cmd := testenv.AsOtherUser(t, test, role, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if l, ok := strings.CutPrefix(s.Text(), "ATTACKER "); ok {
				ch <- l
			}
		}
	}()
	var once sync.Once
	finish = func() {
		once.Do(func() {
			stdin.Close()
			<-done
			if err := cmd.Wait(); err != nil {
				t.Errorf("the other user's process: %v\n%s", err, stderr.String())
			}
		})
	}
	t.Cleanup(finish)
	return ch, finish
}

// next returns the next line from the other user's process.
func next(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("the other user's process ended early")
		}
		return l
	case <-time.After(90 * time.Second):
		t.Fatal("no word from the other user's process within 90s")
	}
	return ""
}

// tell writes a line for the parent test (attacker side).
func tell(format string, a ...any) { fmt.Printf("ATTACKER "+format+"\n", a...) }

// waitStdin blocks until the parent closes the attacker's stdin.
func waitStdin() { io.Copy(io.Discard, os.Stdin) }

func legacyFrame(payload string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	return append(b, payload...)
}

// TestControlLocalImpersonation is issue #28's finding 1b: a local user
// on member A (another uid) binds A's overlay address and connects to B's
// control port. A and B run over the kernel's loopback (A 127.0.0.2, B
// 127.0.0.3), and A has reached B with the key handshake (which pins A
// at B under preferred). The user's 5 connections each send a frame, 5
// more answer B's handshake with what they have, and 8 more stall in the
// handshake. B takes no frame of theirs, and A's own connection stays
// open and keeps carrying frames.
func TestControlLocalImpersonation(t *testing.T) {
	const port = 51951
	a, b := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	if testenv.OtherUserRole() == "impersonate" {
		impersonate(t, a, netip.AddrPortFrom(b, port))
		return
	}
	for _, auth := range []ControlAuth{ControlAuthPreferred, ControlAuthRequired} {
		t.Run(auth.String(), func(t *testing.T) {
			_, ida := testKey("A")
			_, idb := testKey("B")
			m := members{ida: a, idb: b}
			long := func(o *ControlOptions) { o.HandshakeTimeout = time.Minute }
			na := startNode(t, m, "A", a, port, auth, long)
			nb := startNode(t, m, "B", b, port, auth, long)

			na.c.Send(context.Background(), idb, []byte("own-1"))
			waitFor(t, func() bool { return len(nb.log.frames()) == 1 })
			own := na.net.dials()
			if len(own) != 1 {
				t.Fatalf("A dialed %d connections, want 1", len(own))
			}
			ownAddr := own[0].LocalAddr().String()

			lines, finish := otherUser(t, "TestControlLocalImpersonation", "impersonate")
			if l := next(t, lines); l != "done legacy-closed=5 hello-answered=5 hello-closed=5 stalled=8" {
				t.Errorf("attacker: %s", l)
			}
			// Each of the attacker's 18 connections is refused once: 14
			// at once, and the 4 newest stalled ones stay pending.
			waitFor(t, func() bool { return nb.c.Stats().AuthRefused == 14 && pendingFrom(nb.c, ida) == 4 })
			if got := nb.log.frames(); len(got) != 1 {
				t.Errorf("B took %d frames, want only A's own: %q", len(got), got)
			}
			if in := inboundFrom(nb.c, ida); len(in) != 1 || in[0] != ownAddr {
				t.Errorf("B holds %v for A, want only A's own connection from %s (stats %+v)", in, ownAddr, nb.c.Stats())
			}
			finish()
			waitFor(t, func() bool { return nb.c.Stats().AuthRefused == 18 && pendingFrom(nb.c, ida) == 0 })
			na.c.Send(context.Background(), idb, []byte("own-2"))
			waitFor(t, func() bool { return len(nb.log.frames()) >= 2 })
			if got := nb.log.frames(); len(got) != 2 || got[1] != ida.String()[:2]+":own-2" {
				t.Errorf("B's frames %q", got)
			}
			if n := len(na.net.dials()); n != 1 {
				t.Errorf("A dialed %d connections, want its first only", n)
			}
			if s := nb.c.Stats(); s.Authenticated != 1 || s.Legacy != 0 || s.Received != 2 {
				t.Errorf("B's stats %+v, want 1 authenticated, 0 legacy, 2 received", s)
			}
		})
	}
}

// impersonate is the local user: from A's address, 5 connections to B's
// control port with a legacy frame each; 5 that send a hello, answer B's
// reply with B's own signature and send a frame; 8 that send nothing. It
// reports how B treated them, and keeps the stalled ones open until the
// test ends.
func impersonate(t *testing.T, from netip.Addr, to netip.AddrPort) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}}
	closed := func(x net.Conn) bool {
		x.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := x.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	var legacyClosed, answered, helloClosed int
	for i := range 5 {
		x, err := d.Dial("tcp", to.String())
		if err != nil {
			tell("dial %d: %v", i, err)
			return
		}
		x.Write(legacyFrame(fmt.Sprintf("evil-%d", i)))
		if closed(x) {
			legacyClosed++
		}
		x.Close()
	}
	for i := range 5 {
		x, err := d.Dial("tcp", to.String())
		if err != nil {
			tell("dial %d: %v", i, err)
			return
		}
		var nonce [authNonce]byte
		nonce[0] = byte(i)
		x.Write(appendHello(nil, &nonce))
		x.SetReadDeadline(time.Now().Add(10 * time.Second))
		var reply [replyLen]byte
		if _, err := io.ReadFull(x, reply[:]); err == nil {
			if _, _, _, err := parseReply(reply[:]); err == nil {
				answered++
			}
		}
		x.Write(append(reply[replyLen-finishLen:], legacyFrame("evil-hello")...))
		if closed(x) {
			helloClosed++
		}
		x.Close()
	}
	var stalled []net.Conn
	for i := range 8 {
		x, err := d.Dial("tcp", to.String())
		if err != nil {
			tell("dial stalled %d: %v", i, err)
			return
		}
		stalled = append(stalled, x)
	}
	tell("done legacy-closed=%d hello-answered=%d hello-closed=%d stalled=%d", legacyClosed, answered, helloClosed, len(stalled))
	waitStdin()
	for _, x := range stalled {
		x.Close()
	}
}

// TestControlPortSquatter: while A's agent is down, a local user on A
// (another uid) listens on A's control address and port. B dials it to
// send A frames, and the squatter answers as it can: B's own reply
// reflected from a connection it opens to B as A, a reply with a forged
// signature and a frame, or closing the connection as an agent without
// the handshake would. B sends it no frame and does not fall back to
// legacy frames for A: A is pinned (preferred), or B requires the
// handshake. B takes no frame from it either.
func TestControlPortSquatter(t *testing.T) {
	const port = 51952
	a, b := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	if testenv.OtherUserRole() == "squat" {
		squat(t, netip.AddrPortFrom(a, port), netip.AddrPortFrom(b, port), strings.Split(os.Getenv("SQUAT_ACTIONS"), ","))
		return
	}
	for _, c := range []struct {
		name    string
		auth    ControlAuth
		seenA   bool
		actions []string
	}{
		{"pinned", ControlAuthPreferred, true, []string{"reflect", "forge", "close"}},
		{"required", ControlAuthRequired, false, []string{"close", "forge", "reflect"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ida := testKey("A")
			_, idb := testKey("B")
			m := members{ida: a, idb: b}
			nb := startNode(t, m, "B", b, port, c.auth, nil)
			if c.seenA {
				// A reaches B once, with the handshake, then goes down.
				na := startNode(t, m, "A", a, port, c.auth, nil)
				na.c.Send(context.Background(), idb, []byte("hello from A"))
				waitFor(t, func() bool { return len(nb.log.frames()) == 1 })
				na.c.Close()
			}
			frames := len(nb.log.frames())
			lines, finish := otherUser(t, "TestControlPortSquatter", "squat", "SQUAT_ACTIONS="+strings.Join(c.actions, ","))
			if l := next(t, lines); l != "listening" {
				t.Fatalf("squatter: %s", l)
			}
			var want uint64
			for i, act := range c.actions {
				nb.c.Send(context.Background(), ida, fmt.Appendf(nil, "secret-%d", i))
				if l := next(t, lines); l != act+" refused" {
					t.Errorf("squatter, %s: %s", act, l)
				}
				want++
				// The reflection costs B two refusals: its dial, and the
				// squatter's connection to B, which cannot finish.
				if act == "reflect" {
					want++
				}
				waitFor(t, func() bool { s := nb.c.Stats(); return s.AuthRefused >= want || s.Legacy > 0 })
				if s := nb.c.Stats(); s.AuthRefused != want || s.Legacy != 0 || s.Dropped != uint64(i+1) {
					t.Errorf("after %s: B's stats %+v, want %d refused for want of authentication, no legacy connection, %d dropped", act, s, want, i+1)
				}
			}
			finish()
			if got := nb.log.frames(); len(got) != frames {
				t.Errorf("B took frames from the squatter: %q", got[frames:])
			}
		})
	}
}

// squat is the local user who listens on A's control port while A is
// down. For each of B's connections in turn it plays the next action and
// tells what B did; a legacy frame from B is reported as such.
func squat(t *testing.T, at, b netip.AddrPort, actions []string) {
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(at))
	if err != nil {
		tell("listen: %v", err)
		return
	}
	defer ln.Close()
	tell("listening")
	go func() {
		waitStdin()
		ln.Close()
	}()
	closed := func(x net.Conn) bool {
		x.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := x.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	for i := 0; ; i++ {
		x, err := ln.Accept()
		if err != nil {
			return
		}
		x.SetDeadline(time.Now().Add(10 * time.Second))
		var hello [helloLen]byte
		if _, err := io.ReadFull(x, hello[:4]); err != nil {
			tell("nothing: %v", err)
			x.Close()
			continue
		}
		if string(hello[:4]) != authMagic {
			body := make([]byte, min(binary.BigEndian.Uint32(hello[:4]), 1<<16))
			io.ReadFull(x, body)
			tell("legacy frame %q", body)
			x.Close()
			continue
		}
		if _, err := io.ReadFull(x, hello[4:]); err != nil {
			tell("short hello: %v", err)
			x.Close()
			continue
		}
		act := "close"
		if i < len(actions) {
			act = actions[i]
		}
		ok := true
		switch act {
		case "close":
			x.Close()
			tell("close refused")
			continue
		case "forge":
			var nonce [authNonce]byte
			x.Write(append(appendReply(nil, authVersion, &nonce, make([]byte, ed25519.SignatureSize)), legacyFrame("evil")...))
		case "reflect":
			// Hand B's hello to B from A's address and B's answer back.
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: at.Addr().AsSlice()}}
			y, err := d.Dial("tcp", b.String())
			if err != nil {
				tell("reflect dial: %v", err)
				x.Close()
				continue
			}
			y.SetDeadline(time.Now().Add(10 * time.Second))
			y.Write(hello[:])
			var reply [replyLen]byte
			if _, err := io.ReadFull(y, reply[:]); err != nil {
				ok = false
			}
			x.Write(reply[:])
			// B answers a valid reply with its signature: it must not.
			if !closed(x) {
				ok = false
			}
			y.Close()
		}
		if ok && closed(x) {
			tell("%s refused", act)
		} else {
			tell("%s answered", act)
		}
		x.Close()
	}
}

// TestControlMixedVersions: agents without the handshake (played by the
// channel off), and agents with it under preferred and required, in every
// pairing of dialer and listener. Frames flow where both sides allow the
// connection (preferred falls back to legacy frames for an old listener),
// and nowhere else.
func TestControlMixedVersions(t *testing.T) {
	const port = 51953
	modes := []ControlAuth{controlAuthOff, ControlAuthPreferred, ControlAuthRequired}
	name := func(a ControlAuth) string {
		if a == controlAuthOff {
			return "legacy"
		}
		return a.String()
	}
	i := 0
	for _, dm := range modes {
		for _, lm := range modes {
			i++
			da, la := netip.AddrFrom4([4]byte{127, 0, 1, byte(2 * i)}), netip.AddrFrom4([4]byte{127, 0, 1, byte(2*i + 1)})
			t.Run(name(dm)+"-to-"+name(lm), func(t *testing.T) {
				_, idd := testKey("D")
				_, idl := testKey("L")
				m := members{idd: da, idl: la}
				d := startNode(t, m, "D", da, port, dm, nil)
				l := startNode(t, m, "L", la, port, lm, nil)
				authed := dm != controlAuthOff && lm != controlAuthOff
				flows := authed || (dm != ControlAuthRequired && lm != ControlAuthRequired)
				// An old dialer learns of a refusal only when a write fails,
				// and drops that frame: it gets one frame.
				sends := 2
				if dm == controlAuthOff && !flows {
					sends = 1
				}
				for j := range sends {
					d.c.Send(context.Background(), idl, fmt.Appendf(nil, "f%d", j))
					switch {
					case flows:
						waitFor(t, func() bool { return len(l.log.frames()) == j+1 })
					case dm == ControlAuthRequired:
						waitFor(t, func() bool { return d.c.Stats().Dropped == uint64(j+1) })
					default: // legacy to required
						waitFor(t, func() bool { return l.c.Stats().AuthRefused == uint64(j+1) })
					}
				}
				ds, ls := d.c.Stats(), l.c.Stats()
				want := func(who string, got, w uint64) {
					t.Helper()
					if got != w {
						t.Errorf("%s: %d, want %d (dialer %+v, listener %+v)", who, got, w, ds, ls)
					}
				}
				if got := l.log.frames(); flows && (len(got) != 2 || got[0] != idd.String()[:2]+":f0" || got[1] != idd.String()[:2]+":f1") || !flows && len(got) != 0 {
					t.Errorf("listener's frames %q, want flowing=%v", got, flows)
				}
				switch {
				case authed:
					want("dialer's authenticated connections", ds.Authenticated, 1)
					want("listener's authenticated connections", ls.Authenticated, 1)
					want("dialer's legacy connections", ds.Legacy, 0)
				case flows:
					// An old agent counts nothing of the kind.
					want("dialer's legacy connections", ds.Legacy, b2u(dm == ControlAuthPreferred))
					want("listener's legacy connections", ls.Legacy, b2u(lm == ControlAuthPreferred))
					want("dialer's authenticated connections", ds.Authenticated, 0)
					want("listener's authenticated connections", ls.Authenticated, 0)
				case dm == ControlAuthRequired: // to legacy
					want("dialer's refused connections", ds.AuthRefused, 2)
					want("dialer's legacy connections", ds.Legacy, 0)
					want("listener's refused (the hellos)", ls.Refused, 2)
				default: // legacy to required
					want("listener's refused connections", ls.AuthRefused, 1)
					want("listener's legacy connections", ls.Legacy, 0)
				}
				if dm == ControlAuthPreferred && lm == controlAuthOff {
					// The fallback costs the old listener one refused hello.
					want("listener's refused (the hello)", ls.Refused, 1)
				}
			})
		}
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestControlPinnedMember: once a member has authenticated by key, a
// preferred channel takes nothing unauthenticated from it and sends it no
// legacy frame, even when it comes back as an agent without the
// handshake; a legacy connection taken from it before is closed.
func TestControlPinnedMember(t *testing.T) {
	const port = 51954
	p, q := netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("127.0.0.5")
	_, idq := testKey("Q")
	_, idp := testKey("P")
	m := members{idp: p, idq: q}
	np := startNode(t, m, "P", p, port, ControlAuthPreferred, nil)

	// Before Q authenticates, P takes its legacy frames.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: q.AsSlice()}}
	old, err := d.Dial("tcp", netip.AddrPortFrom(p, port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	old.Write(legacyFrame("legacy-1"))
	waitFor(t, func() bool { return len(np.log.frames()) == 1 })

	// Q authenticates: it is pinned, and its legacy connection closed.
	nq := startNode(t, m, "Q", q, port, ControlAuthPreferred, nil)
	nq.c.Send(context.Background(), idp, []byte("auth-1"))
	waitFor(t, func() bool { return len(np.log.frames()) == 2 })
	old.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := old.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Q's legacy connection stayed open after Q authenticated: %v", err)
	}
	if s := np.c.Stats(); s.Legacy != 1 || s.Authenticated != 1 || s.AuthRefused != 1 {
		t.Errorf("P's stats %+v, want 1 legacy, 1 authenticated, 1 refused (the legacy connection closed)", s)
	}

	// Q comes back without the handshake: P neither takes its frames nor
	// sends it any.
	nq.c.Close()
	lq := startNode(t, m, "Q", q, port, controlAuthOff, nil)
	lq.c.Send(context.Background(), idp, []byte("legacy-2"))
	waitFor(t, func() bool { return np.c.Stats().AuthRefused == 2 })
	np.c.Send(context.Background(), idq, []byte("to-q"))
	waitFor(t, func() bool { return np.c.Stats().AuthRefused == 3 })
	if got := np.log.frames(); len(got) != 2 {
		t.Errorf("P's frames %q: took Q's legacy frame after Q authenticated", got)
	}
	if got := lq.log.frames(); len(got) != 0 {
		t.Errorf("the legacy Q got %q from P, which had seen Q authenticate", got)
	}
	if s := np.c.Stats(); s.Legacy != 1 {
		t.Errorf("P's stats %+v: a legacy connection after the pin", s)
	}
}

// TestControlAuthSignatureDomains: the handshake's signatures and crdt's
// field signatures are over disjoint messages (neither label is a prefix
// of the other, and each message starts with its label), so a
// handshake signature never verifies as a field's, nor the reverse.
func TestControlAuthSignatureDomains(t *testing.T) {
	k, id := testKey("A")
	_, peer := testKey("B")
	n := min(len(controlAuthLabel), len(crdt.Domain))
	if controlAuthLabel[:n] == crdt.Domain[:n] {
		t.Fatalf("the labels %q and %q share their first %d bytes", controlAuthLabel, crdt.Domain, n)
	}
	tr := authTranscript{version: authVersion, keyD: id, keyL: peer,
		epD: netip.MustParseAddrPort("127.0.0.2:40000"), epL: netip.MustParseAddrPort("127.0.0.3:51830")}
	for _, role := range []byte{roleDialer, roleListener} {
		if msg := tr.message(role); !bytes.HasPrefix(msg, []byte(controlAuthLabel)) || len(msg) != transcriptLen {
			t.Fatalf("role %c: message %x", role, msg)
		}
	}
	var f crdt.Field
	f.Key, f.HasValue, f.Value, f.Lamport, f.Counter = "name", true, []byte("api"), 1, 1
	crdt.Sign(k, &f)
	if err := crdt.VerifySignature(&f); err != nil {
		t.Fatalf("the field's own signature: %v", err)
	}
	if msg := f.AppendSigningMessage(nil); !bytes.HasPrefix(msg, []byte(crdt.Domain)) {
		t.Fatalf("field signing message %x", msg)
	}
	// A field signature as a handshake signature.
	for _, role := range []byte{roleDialer, roleListener} {
		if tr.verify(id, role, f.Signature) {
			t.Errorf("a field signature verified as a handshake signature (role %c)", role)
		}
	}
	// Handshake signatures as a field's: refused, and not even as a
	// signature under another of crdt's domains.
	for _, role := range []byte{roleDialer, roleListener} {
		g := f
		g.Signature = tr.sign(k, role)
		if err := crdt.VerifySignature(&g); !errors.Is(err, crdt.ErrBadSignature) {
			t.Errorf("a handshake signature (role %c) as a field's: %v, want ErrBadSignature", role, err)
		}
	}
	// The roles are distinct: a listener's signature is no dialer's.
	if tr.verify(id, roleDialer, tr.sign(k, roleListener)) {
		t.Error("a listener's signature verified as the dialer's")
	}
}

// TestControlAuthParseAllocs: the handshake's parsers allocate nothing,
// whatever they are given.
func TestControlAuthParseAllocs(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	var nonce [authNonce]byte
	inputs := [][]byte{nil, []byte(authMagic), appendHello(nil, &nonce), appendReply(nil, authVersion, &nonce, make([]byte, 64)), make([]byte, 1<<16)}
	for _, in := range inputs {
		if n := testing.AllocsPerRun(10, func() {
			parseHello(in)
			parseReply(in)
			parseFinish(in)
		}); n != 0 {
			t.Errorf("%d allocations parsing %d bytes", int(n), len(in))
		}
	}
}

// TestControlAuthSetting: control_auth is preferred (the default) or
// required; nothing turns the handshake off.
func TestControlAuthSetting(t *testing.T) {
	for in, want := range map[string]ControlAuth{"": ControlAuthPreferred, "preferred": ControlAuthPreferred, "required": ControlAuthRequired} {
		if got, err := ParseControlAuth(in); err != nil || got != want {
			t.Errorf("ParseControlAuth(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"off", "legacy", "Required", "none"} {
		if _, err := ParseControlAuth(in); err == nil {
			t.Errorf("ParseControlAuth(%q) took it", in)
		}
	}
	seed := make([]byte, 32)
	cfg := Config{DataDir: t.TempDir(), Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24", ControlAuth: "off",
		Node: NodeConfig{Name: "n1", Address: "100.80.0.1", IdentityKey: base64.StdEncoding.EncodeToString(seed), WireGuardKey: wg.GeneratePrivateKey()}}}}
	if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "control_auth") {
		t.Errorf("control_auth off: %v, want ErrConfig naming the field", err)
	}
	cfg.Networks[0].ControlAuth = "required"
	if err := cfg.Validate(); err != nil {
		t.Errorf("control_auth required: %v", err)
	}
	// NewControl refuses a missing key and a frame limit whose lengths
	// could start with a non-zero byte.
	self := netip.MustParseAddr("127.0.0.6")
	k, _ := testKey("A")
	for _, o := range []ControlOptions{
		{Net: KernelNet{Self: self}, Self: self, Port: 51955, MaxFrame: 1024},
		{Net: KernelNet{Self: self}, Self: self, Port: 51955, MaxFrame: 1 << 24, Key: k},
	} {
		if c, err := NewControl(context.Background(), o); err == nil {
			c.Close()
			t.Errorf("NewControl took key %d bytes, MaxFrame %d", len(o.Key), o.MaxFrame)
		}
	}
}
