package vip

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/transport/wg/wgtest"
)

// cluster is n nodes on a simulated network (real clock), each a gVisor
// netstack host ⇄ Engine ⇄ wireguard-go device over a SimBind, with its own
// crdt replica and Registry. Configuration spreads by copying snapshots
// (spread), which calls Registry.Merged and so OnChange → Engine.Apply.
type cluster struct {
	t      testing.TB
	net    *transporttest.Network
	prefix netip.Prefix
	infos  []NodeInfo
	nodes  []*cnode
}

type cnode struct {
	i      int
	name   string
	info   NodeInfo
	key    ed25519.PrivateKey
	wgKey  wg.Key
	bind   *wgtest.SimBind
	dbind  conn.Bind // what the device runs on: bind, or clusterOptions.bind's wrapper
	host   *netstack.Host
	reg    *Registry
	eng    atomic.Pointer[Engine]
	dev    *wg.Device
	closed atomic.Bool
}

type clusterOptions struct {
	n       int
	prober  probe.ProberConfig
	latency map[[2]int]time.Duration // one-way latency per pair (both directions)
	engine  func(*EngineOptions)
	// readAhead runs every engine with EngineOptions.ReadAhead: the pump
	// instead of direct reads of the (interruptible) netstack host.
	readAhead bool
	limits    Limits
	// coldStart skips warm: the nodes' first packets to each other start
	// their WireGuard handshakes, as on a fresh start.
	coldStart bool
	// bind, when set, wraps node i's SimBind (for example to delay
	// handshake messages); the device runs on what it returns.
	bind func(i int, b conn.Bind) conn.Bind
}

func newCluster(t testing.TB, o clusterOptions) *cluster {
	t.Helper()
	if o.n == 0 {
		o.n = 3
	}
	c := &cluster{t: t, net: transporttest.NewNetwork(nil, 7), prefix: netip.MustParsePrefix("100.80.0.0/16")}
	t.Cleanup(func() { c.net.Close() })
	var netID crdt.NetworkID
	copy(netID[:], "engine-test-net!")
	rng := rand.New(rand.NewPCG(11, 12))
	var members []crdt.AuthorID
	for i := range o.n {
		var s [32]byte
		for j := range s {
			s[j] = byte(rng.Uint32())
		}
		k := ed25519.NewKeyFromSeed(s[:])
		var id NodeID
		copy(id[:], k.Public().(ed25519.PublicKey))
		name := string(rune('a' + i))
		info := NodeInfo{ID: id, Name: "node-" + name, Addr: netip.AddrFrom4([4]byte{100, 80, 0, byte(i + 1)})}
		c.infos = append(c.infos, info)
		c.nodes = append(c.nodes, &cnode{i: i, name: name, info: info, key: k, wgKey: wg.GeneratePrivateKey()})
		members = append(members, crdt.AuthorID(id))
	}
	for _, nd := range c.nodes {
		nd.bind = wgtest.NewSimBind(c.net, nd.name)
		nd.dbind = nd.bind
		if o.bind != nil {
			nd.dbind = o.bind(nd.i, nd.bind)
		}
	}
	for pair, d := range o.latency {
		if err := c.net.SetLinkBoth(c.nodes[pair[0]].bind.Node(), c.nodes[pair[1]].bind.Node(), transporttest.LinkConfig{Latency: d}); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range c.nodes {
		rep, err := crdt.Open(context.Background(), crdt.Config{Network: netID, Signer: nd.key, Members: members, Store: crdt.NewMemStore(), Obsolete: Obsolete, Check: CheckField, Rank: Rank})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rep.Close() })
		nd := nd
		nd.reg, err = NewRegistry(RegistryOptions{
			Network: "home", Prefix: c.prefix, Replica: rep, Nodes: c.nodeList, Limits: o.limits,
			Rand: rand.NewChaCha8([32]byte{byte(nd.i), 42}),
			OnChange: func([]ServiceID, bool) {
				if e := nd.eng.Load(); e != nil {
					if err := e.Apply(); err != nil && !strings.Contains(err.Error(), "closed") {
						t.Errorf("%s: Apply: %v", nd.name, err)
					}
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.start(nd, o)
	}
	if !o.coldStart {
		c.warm()
	}
	return c
}

// warm brings up the WireGuard sessions between all nodes before any
// service exists, so that tests start on established paths (the prober
// takes no sample from a reply that ends a silence, so the first RTT
// measures the path either way; clusterOptions.coldStart tests that). Each pair is started from one side only (a datagram
// from the lower to the higher node), retried until its handshake is seen:
// simultaneous initiations from both sides were seen to stall a session
// for over 20 s on the simulated network.
func (c *cluster) warm() {
	c.t.Helper()
	for i, nd := range c.nodes {
		for _, p := range c.nodes[i+1:] {
			c.handshake(nd, p)
		}
	}
}

func (c *cluster) handshake(nd, p *cnode) {
	c.t.Helper()
	conn, err := nd.host.DialUDP(netip.AddrPortFrom(nd.info.Addr, 0), netip.AddrPortFrom(p.info.Addr, 9))
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	for try := range 8 {
		_, _ = conn.Write([]byte("warm"))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = nd.dev.WaitHandshake(ctx, p.wgKey.PublicKey())
		cancel()
		if err == nil {
			return
		}
		c.t.Logf("handshake %s→%s, try %d: %v", nd.name, p.name, try+1, err)
	}
	c.t.Fatalf("no handshake %s→%s: %v", nd.name, p.name, err)
}

func (c *cluster) nodeList() []NodeInfo { return append([]NodeInfo(nil), c.infos...) }

// start builds node nd's host, engine and device and peers it with all.
func (c *cluster) start(nd *cnode, o clusterOptions) {
	t := c.t
	t.Helper()
	h, err := netstack.New(netstack.Options{Addrs: []netip.Addr{nd.info.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	nd.host = h
	peerKey := map[NodeID]wg.Key{}
	var peers []wg.PeerConfig
	for _, p := range c.nodes {
		if p == nd {
			continue
		}
		peerKey[p.info.ID] = p.wgKey.PublicKey()
		peers = append(peers, wg.PeerConfig{PublicKey: p.wgKey.PublicKey(), Endpoint: p.bind.Addr(),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(p.info.Addr, 32)}})
	}
	var devp atomic.Pointer[wg.Device]
	eo := EngineOptions{
		Registry: nd.reg, Self: nd.info.ID, Host: h, Dialer: h, Prober: o.prober,
		// The data path is up while the WireGuard peer had a handshake
		// within the last 180 s (REJECT_AFTER_TIME), or before the first
		// one (the probes bring the handshake about).
		PathUp: func(id NodeID) bool {
			d := devp.Load()
			if d == nil {
				return true
			}
			st, err := d.PeerStats(peerKey[id])
			return err == nil && (st.LastHandshake.IsZero() || time.Since(st.LastHandshake) < 180*time.Second)
		},
	}
	eo.ReadAhead = o.readAhead
	if o.engine != nil {
		o.engine(&eo)
	}
	e, err := NewEngine(eo)
	if err != nil {
		h.Close()
		t.Fatal(err)
	}
	nd.eng.Store(e)
	d, err := wg.NewDevice(e, wg.Config{PrivateKey: nd.wgKey, Peers: peers}, wg.Options{Bind: nd.dbind})
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	devp.Store(d)
	nd.dev = d
	t.Cleanup(func() { nd.stop() })
}

// stop closes the node's device (which closes the engine and the host).
func (nd *cnode) stop() {
	if nd.closed.Swap(true) {
		return
	}
	nd.dev.Close()
	nd.eng.Load().Close()
}

func (nd *cnode) engine() *Engine { return nd.eng.Load() }

// spread copies every snapshot between the nodes of each group (all nodes
// when no group is given), both ways, until nothing changes.
func (c *cluster) spread(groups ...[]int) {
	c.t.Helper()
	if len(groups) == 0 {
		all := make([]int, len(c.nodes))
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	}
	for _, g := range groups {
		for range 2 {
			for _, from := range g {
				for _, to := range g {
					if from != to {
						c.copySnapshots(from, to)
					}
				}
			}
		}
	}
}

func (c *cluster) copySnapshots(from, to int) {
	src, dst := c.nodes[from].reg.Replica(), c.nodes[to].reg.Replica()
	var changed []ServiceID
	for _, in := range src.Services() {
		snap, ok := src.EncodedSnapshot(in.ID)
		if !ok {
			continue
		}
		res, err := dst.MergeSnapshot(context.Background(), snap)
		if err != nil {
			c.t.Fatalf("merge %d→%d: %v", from, to, err)
		}
		for _, id := range res.Changed {
			changed = append(changed, ServiceID(id))
		}
	}
	if len(changed) > 0 {
		c.nodes[to].reg.Merged(changed)
	}
}

// resolve asks node nd's DNS responder (built from the engine's
// DNSOptions) for name's A record.
func (c *cluster) resolve(nd *cnode, name string) (netip.Addr, error) {
	srv, err := NewDNSServer(nd.engine().DNSOptions())
	if err != nil {
		return netip.Addr{}, err
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		return netip.Addr{}, err
	}
	ans, err := srv.Answer(wire)
	if err != nil {
		return netip.Addr{}, err
	}
	m := new(dns.Msg)
	if err := m.Unpack(ans); err != nil {
		return netip.Addr{}, err
	}
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		return netip.Addr{}, fmt.Errorf("%s: rcode %s, %d answers", name, dns.RcodeToString[m.Rcode], len(m.Answer))
	}
	a, _ := netip.AddrFromSlice(m.Answer[0].(*dns.A).A)
	return a.Unmap(), nil
}

// serveTCP accepts connections on nd's port and runs handle on each in its
// own goroutine; the listener, the connections and the goroutines end with
// the test.
func serveTCP(t testing.TB, nd *cnode, port uint16, handle func(net.Conn)) {
	t.Helper()
	ln, err := nd.host.ListenTCP(netip.AddrPortFrom(nd.info.Addr, port))
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				handle(conn)
			}()
		}
	}()
}

// serveName runs a TCP server on nd's port that writes "<node name>
// <remote addr>\n" to every connection and keeps it open until the client
// closes it.
func serveName(t testing.TB, nd *cnode, port uint16) {
	t.Helper()
	serveTCP(t, nd, port, func(conn net.Conn) {
		fmt.Fprintf(conn, "%s %s\n", nd.name, conn.RemoteAddr())
		_, _ = io.Copy(io.Discard, conn)
	})
}

// whoAt dials addr from nd and returns the server's greeting line and the
// open connection (closed at the end of the test).
func whoAt(t testing.TB, nd *cnode, addr netip.AddrPort, timeout time.Duration) (string, net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := nd.host.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return "", nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 128)
	var line []byte
	for !strings.Contains(string(line), "\n") {
		n, err := conn.Read(buf)
		line = append(line, buf[:n]...)
		if err != nil {
			conn.Close()
			return "", nil, err
		}
	}
	_ = conn.SetReadDeadline(time.Time{})
	t.Cleanup(func() { conn.Close() })
	return strings.TrimSpace(string(line)), conn, nil
}

// pollUntil polls cond every 10 ms until it holds or timeout passes.
func pollUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listenerOf returns the status of listener key of service name on nd.
func listenerOf(nd *cnode, name, key string) (ListenerStatus, bool) {
	for _, s := range nd.engine().Status().Services {
		if s.Name != name {
			continue
		}
		for _, l := range s.Listeners {
			if l.Listener == key {
				return l, true
			}
		}
	}
	return ListenerStatus{}, false
}

// next returns the name of the node a new flow of the listener would go to
// ("" when none is eligible).
func (c *cluster) next(nd *cnode, name, key string) string {
	l, ok := listenerOf(nd, name, key)
	if !ok || l.Next == nil {
		return ""
	}
	for _, n := range c.nodes {
		if n.info.ID == l.Next.Node {
			return n.name
		}
	}
	return "?"
}

// rttsKnown reports whether every backend of the listener has a fresh RTT.
func rttsKnown(nd *cnode, name, key string) bool {
	l, ok := listenerOf(nd, name, key)
	if !ok || len(l.Backends) == 0 {
		return false
	}
	for _, b := range l.Backends {
		if !b.RTTKnown || !b.Eligible {
			return false
		}
	}
	return true
}
