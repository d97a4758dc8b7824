//go:build linux

package keelvip_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/etcdkv"
	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
	"github.com/vipkit/vipkit/transport/wg"
)

var (
	overlay = netip.MustParsePrefix("fd6b:6565:6c00::/64")
	testVIP = netip.MustParseAddr("fd6b:6565:6c00::1:100")
)

const probePort = 7000

type node struct {
	name     string
	h        *netns.Host
	addr     netip.Addr
	under    netns.Iface
	wgKey    wg.Key
	sign     ed25519.PrivateKey
	dir      string
	meshPath string
	mesh     *keelvip.Mesh
	ctlUID   uint32
	lisUID   uint32
	tend     *netns.Process
	etcd     *netns.Process
	etcdArgs []string // to restart the member (a fault)
	member   bool

	// With startUnits: the controller's and the listener's processes and
	// the cgroups of their units.
	ctl, lis             *netns.Process
	ctlCgroup, lisCgroup string
}

type cluster struct {
	t     *testing.T
	base  string
	exe   string
	sw    *netns.Switch
	nodes []*node
	etcd  bool
	pair  *claim.PairRecord
}

func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}

// newCluster makes one namespace per name on one LAN, writes every mesh
// file (members: the first two names, pair record signed by both), and
// copies the test binary where the unprivileged users can run it.
func newCluster(t *testing.T, seed uint64, withEtcd bool, impair map[string]any, names ...string) *cluster {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedBinary(t, "setpriv")
	base, err := os.MkdirTemp("", "keelvip-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, base: base, etcd: withEtcd, exe: filepath.Join(base, "keel-vip.test")}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.exe, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 2))
	var hosts []*netns.Host
	for i, name := range names {
		n := &node{name: name, h: netns.NewHostT(t, name), wgKey: wg.GeneratePrivateKey(), member: i < 2,
			ctlUID: uint32(64100 + i), lisUID: uint32(64200 + i)}
		var s [32]byte
		for j := range s {
			s[j] = byte(r.Uint32())
		}
		n.sign = ed25519.NewKeyFromSeed(s[:])
		a := overlay.Addr().As16()
		if n.member {
			a[13], a[15] = 1, byte(i+1) // region ::1:0/112, the VIP's
		} else {
			a[13], a[15] = 2, byte(i+1)
		}
		n.addr = netip.AddrFrom16(a)
		n.dir = filepath.Join(base, name)
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, n.h)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		capRTO(t, n)
	}
	var ifs []netns.Iface
	c.sw, ifs = netns.LANT(t, hosts...)
	for i, n := range c.nodes {
		n.under = ifs[i]
	}
	for _, n := range c.nodes {
		n.meshPath = filepath.Join(n.dir, "mesh.json")
		if err := os.WriteFile(n.meshPath, c.meshJSON(n, impair), 0o600); err != nil {
			t.Fatal(err)
		}
		if n.mesh, err = keelvip.LoadMesh(n.meshPath); err != nil {
			t.Fatal(err)
		}
	}
	// The pair record: proposed by the first member, signed by the second,
	// through the CLI.
	a, b := c.nodes[0], c.nodes[1]
	prop := filepath.Join(base, "pair.prop")
	var out, errb bytes.Buffer
	if code := keelvip.Main(context.Background(), []string{"pair", "propose", "--mesh", a.meshPath, "--peer", b.addr.String(), "--out", prop}, &out, &errb); code != 0 {
		t.Fatalf("pair propose: %s", errb.String())
	}
	if code := keelvip.Main(context.Background(), []string{"pair", "sign", "--mesh", b.meshPath, "--in", prop}, &out, &errb); code != 0 {
		t.Fatalf("pair sign: %s", errb.String())
	}
	rec, err := os.ReadFile(b.mesh.PairFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.mesh.PairFile, rec, 0o644); err != nil {
		t.Fatal(err)
	}
	if c.pair, err = keelvip.LoadPair(a.mesh); err != nil {
		t.Fatal(err)
	}
	return c
}

// rtoMaxMs is the cap on TCP's retransmission timeout in every node's
// namespace, as the README asks of etcd hosts: etcd's peer streams keep a
// connection that went silent in a partition (their read timeout is not
// applied), so after the heal they resume only at the connection's next
// retransmission; with Linux's default cap of 120 s that can be a minute
// or more after the network is back, and a member stays without a leader
// that long.
const rtoMaxMs = 1000

// capRTO sets net.ipv4.tcp_rto_max_ms in n's namespace (Linux 6.15 and
// later; on older kernels the test logs that it runs without the cap).
func capRTO(t *testing.T, n *node) {
	t.Helper()
	err := n.h.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_rto_max_ms", []byte(fmt.Sprint(rtoMaxMs)), 0o644)
	})
	switch {
	case errors.Is(err, os.ErrNotExist):
		t.Logf("%s: no net.ipv4.tcp_rto_max_ms (Linux before 6.15): TCP's retransmission backoff is uncapped", n.name)
	case err != nil:
		t.Fatalf("%s: net.ipv4.tcp_rto_max_ms: %v", n.name, err)
	}
}

func (c *cluster) meshJSON(n *node, impair map[string]any) []byte {
	m := map[string]any{
		"mesh": "e2e", "overlay": overlay.String(),
		"node": map[string]any{"id": n.name, "addr": n.addr.String(),
			"wg_private_key":   base64.StdEncoding.EncodeToString(n.wgKey[:]),
			"sign_private_key": base64.StdEncoding.EncodeToString(n.sign.Seed())},
		"run_dir": filepath.Join(n.dir, "run"), "state_dir": filepath.Join(n.dir, "state"),
		"event_log": filepath.Join(c.base, "events-"+n.name+".log"),
		"users":     map[string]any{"controller_uid": n.ctlUID, "controller_gid": n.ctlUID, "listener_uid": n.lisUID, "listener_gid": n.lisUID},
	}
	if impair != nil {
		m["impair"] = impair
	}
	var peers []any
	// The controller talks to its own namespace's etcd member: a member
	// cut off from the majority then fails the controller's calls, and no
	// call waits on an unreachable endpoint.
	eps := []string{fmt.Sprintf("http://[%v]:2379", n.addr)}
	for _, p := range c.nodes {
		if p == n {
			continue
		}
		pub := p.wgKey.PublicKey()
		peers = append(peers, map[string]any{"id": p.name, "addr": p.addr.String(),
			"wg_public_key":   base64.StdEncoding.EncodeToString(pub[:]),
			"sign_public_key": base64.StdEncoding.EncodeToString(n.pubOf(p)),
			"endpoint":        netip.AddrPortFrom(p.under.Addr4(), 51820).String(), "keepalive_s": 5})
	}
	m["peers"] = peers
	if n.member {
		m["appliance"] = map[string]any{"vip": testVIP.String(), "pair_file": filepath.Join(n.dir, "pair.rec")}
	} else {
		m["appliance"] = map[string]any{"observe": testVIP.String()}
	}
	if c.etcd {
		m["etcd"] = map[string]any{"endpoints": eps}
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	return b
}

func (n *node) pubOf(p *node) []byte { return p.sign.Public().(ed25519.PublicKey) }

// start runs tend in every namespace and waits for each helper's admin
// socket and the overlay address.
func (c *cluster) start() {
	c.t.Helper()
	for _, n := range c.nodes {
		n.tend = netns.StartChildT(c.t, n.h, "keel-tend", n.meshPath, c.exe)
	}
	for _, n := range c.nodes {
		waitFor(c.t, 60*time.Second, "helper of "+n.name, func() bool {
			_, err1 := os.Stat(keelvip.AdminSocket(n.mesh))
			_, err2 := os.Stat(filepath.Join(n.mesh.RunDir, "ctl", "control.sock"))
			return err1 == nil && err2 == nil && carriesAddr(n.h, n.addr)
		})
	}
}

// startEtcd runs one etcd member per namespace, on the overlay, and waits
// for one leader.
func (c *cluster) startEtcd(tickMs, electionMs int) {
	c.t.Helper()
	var parts []string
	for _, n := range c.nodes {
		parts = append(parts, fmt.Sprintf("%s=http://[%v]:2380", n.name, n.addr))
	}
	for _, n := range c.nodes {
		n.etcdArgs = []string{n.name, filepath.Join(n.dir, "etcd"), strings.Join(parts, ","),
			fmt.Sprintf("http://[%v]:2380", n.addr), fmt.Sprintf("http://[%v]:2379", n.addr), fmt.Sprint(tickMs), fmt.Sprint(electionMs)}
		n.etcd = netns.StartChildT(c.t, n.h, "etcd", n.etcdArgs...)
	}
	t0 := time.Now()
	waitFor(c.t, 120*time.Second, "etcd leader", func() bool {
		_, err := c.etcdLeader()
		if err != nil && time.Since(t0) > 20*time.Second {
			c.t.Logf("etcd leader: %v", err)
		}
		return err == nil
	})
}

// etcdClient is a client from the observer's namespace to the given
// members (all when none).
func (c *cluster) etcdClient(members ...*node) *clientv3.Client {
	obs := c.nodes[len(c.nodes)-1]
	if len(members) == 0 {
		members = c.nodes
	}
	var eps []string
	for _, m := range members {
		eps = append(eps, fmt.Sprintf("[%v]:2379", m.addr))
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return obs.h.Dial(ctx, "tcp", addr)
		})}})
	if err != nil {
		c.t.Fatal(err)
	}
	return cli
}

// etcdLeader returns the node that every reachable member names leader.
func (c *cluster) etcdLeader() (*node, error) {
	cli := c.etcdClient()
	defer cli.Close()
	ids := map[uint64]*node{}
	var leader uint64
	for _, n := range c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.Status(ctx, fmt.Sprintf("[%v]:2379", n.addr))
		cancel()
		if err != nil {
			return nil, err
		}
		ids[st.Header.MemberId] = n
		if st.Leader == 0 || leader != 0 && st.Leader != leader {
			return nil, errors.New("no single leader")
		}
		leader = st.Leader
	}
	if ids[leader] == nil {
		return nil, errors.New("leader unknown")
	}
	return ids[leader], nil
}

// Timings of the namespace cluster: the controllers' default lease TTL
// and the election timeout startEtcd is given in TestPartitionNetns.
const (
	leaseTTL     = 20 * time.Second
	etcdElection = 5 * time.Second
)

// memberID is n's etcd member id.
func (c *cluster) memberID(n *node) uint64 {
	c.t.Helper()
	cli := c.etcdClient(n)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, fmt.Sprintf("[%v]:2379", n.addr))
	if err != nil {
		c.t.Fatalf("etcd status of %s: %v", n.name, err)
	}
	return st.Header.MemberId
}

// watchMajorityLeader polls the given members every 100 ms until they
// all name one leader other than the member not, and returns a function
// that stops the polling and reports when (CLOCK_BOOTTIME) that was
// first seen.
func (c *cluster) watchMajorityLeader(not uint64, members ...*node) func() (time.Duration, bool) {
	cli := c.etcdClient(members...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var at time.Duration
	var found bool
	go func() {
		defer close(done)
		defer cli.Close()
		for ctx.Err() == nil {
			now := bootNow()
			var leader uint64
			agree := true
			for _, m := range members {
				sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
				st, err := cli.Status(sctx, fmt.Sprintf("[%v]:2379", m.addr))
				scancel()
				if err != nil || st.Leader == 0 || st.Leader == not || leader != 0 && st.Leader != leader {
					agree = false
					break
				}
				leader = st.Leader
			}
			if agree {
				at, found = now, true
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() (time.Duration, bool) {
		cancel()
		<-done
		return at, found
	}
}

// moveLeader makes n etcd's leader (etcdctl move-leader), or makes
// another member leader when away is set.
func (c *cluster) moveLeader(n *node, away bool) {
	c.t.Helper()
	waitFor(c.t, 60*time.Second, "etcd leadership move", func() bool {
		l, err := c.etcdLeader()
		if err != nil {
			return false
		}
		if (l == n) != away {
			return true
		}
		target := n
		if away {
			target = c.nodes[0]
			if target == n {
				target = c.nodes[2]
			}
		}
		cli := c.etcdClient(l)
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := cli.Status(ctx, fmt.Sprintf("[%v]:2379", target.addr))
		if err != nil {
			return false
		}
		_, err = cli.MoveLeader(ctx, st.Header.MemberId)
		if err != nil {
			c.t.Logf("move leader to %s: %v", target.name, err)
		}
		return false
	})
}

func waitFor(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// carriesAddr reads the namespace's wg0 addresses (a fresh netlink handle,
// so that concurrent readers never share one).
func carriesAddr(h *netns.Host, a netip.Addr) bool {
	var found bool
	_ = h.Do(func() error {
		nl, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer nl.Close()
		lk, err := nl.LinkByName("wg0")
		if err != nil {
			return err
		}
		as, err := nl.AddrList(lk, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, x := range as {
			if ip, ok := netip.AddrFromSlice(x.IP); ok && ip == a {
				found = true
			}
		}
		return nil
	})
	return found
}

// holdAtA waits until both members renew an etcd lease, promotes A (the
// operator's first promote, retried until etcd answers) and waits until A
// carries the VIP.
func (c *cluster) holdAtA() {
	c.t.Helper()
	A, B := c.nodes[0], c.nodes[1]
	waitFor(c.t, 60*time.Second, "leases", func() bool {
		for _, n := range []*node{A, B} {
			st, err := c.status(n)
			if err != nil || st.RenewalAgeMs < 0 {
				return false
			}
		}
		return true
	})
	waitFor(c.t, 60*time.Second, "promote A", func() bool {
		out, err := c.promote(A, false)
		if err != nil {
			c.t.Logf("promote a: %v", err)
		}
		return err == nil && strings.Contains(out, "epoch")
	})
	waitFor(c.t, 30*time.Second, "A carries", func() bool { return carriesAddr(A.h, testVIP) })
}

// status runs `keel-vip status --json` for n.
func (c *cluster) status(n *node) (keelvip.Status, error) {
	var out, errb bytes.Buffer
	var s keelvip.Status
	if code := keelvip.Main(context.Background(), []string{"status", "--json", "--mesh", n.meshPath}, &out, &errb); code != 0 {
		return s, errors.New(errb.String())
	}
	err := json.Unmarshal(out.Bytes(), &s)
	return s, err
}

// promote runs `keel-vip promote` on n.
func (c *cluster) promote(n *node, gone bool) (string, error) {
	args := []string{"promote", "--mesh", n.meshPath}
	if gone {
		args = append(args, "--old-primary-gone")
	}
	var out, errb bytes.Buffer
	if code := keelvip.Main(context.Background(), args, &out, &errb); code != 0 {
		return out.String(), errors.New(strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// serveNames answers every TCP connection on [::]:probePort with the
// node's name, in every member's namespace.
func (c *cluster) serveNames() {
	for _, n := range c.nodes[:2] {
		l, err := n.h.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", probePort))
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { l.Close() })
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(conn, n.name)
				conn.Close()
			}
		}()
	}
}

// pinger sends a UDP ping to the VIP every 50 ms from a node and records
// which were answered (by the echo of whichever member carries it).
type pinger struct {
	conn net.PacketConn
	mu   sync.Mutex
	sent []time.Time
	ok   []bool
	quit chan struct{}
	wg   sync.WaitGroup
}

func (c *cluster) startPings(from *node) *pinger {
	for _, n := range c.nodes[:2] {
		pc, err := n.h.ListenPacket(context.Background(), "udp", "[::]:7002")
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				k, a, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:k], a)
			}
		}()
	}
	conn, err := from.h.ListenPacket(context.Background(), "udp", netip.AddrPortFrom(from.addr, 0).String())
	if err != nil {
		c.t.Fatal(err)
	}
	p := &pinger{conn: conn, quit: make(chan struct{})}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 64)
		for {
			k, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if k >= 8 {
				i := binary.BigEndian.Uint64(buf)
				p.mu.Lock()
				if i < uint64(len(p.ok)) {
					p.ok[i] = true
				}
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		defer p.wg.Done()
		dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(testVIP, 7002))
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for i := uint64(0); ; i++ {
			select {
			case <-p.quit:
				return
			case <-tk.C:
			}
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], i)
			p.mu.Lock()
			p.sent = append(p.sent, time.Now())
			p.ok = append(p.ok, false)
			p.mu.Unlock()
			_, _ = conn.WriteTo(b[:], dst)
		}
	}()
	return p
}

// stop ends the pings (answers get 1 s more) and returns the longest gap
// between the send times of two answered pings.
func (p *pinger) stop() time.Duration {
	close(p.quit)
	time.Sleep(time.Second)
	p.conn.Close()
	p.wg.Wait()
	var gap time.Duration
	var last time.Time
	for i, ok := range p.ok {
		if !ok {
			continue
		}
		if !last.IsZero() && p.sent[i].Sub(last) > gap {
			gap = p.sent[i].Sub(last)
		}
		last = p.sent[i]
	}
	return gap
}

// reach connects from n to the VIP and returns the name that answers.
func reach(n *node, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := n.h.Dial(ctx, "tcp", netip.AddrPortFrom(testVIP, probePort).String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(io.LimitReader(conn, 16))
	return string(b), err
}

// sampler reads which members carry the VIP every 200 ms.
type sampler struct {
	// mu guards last and carried while the sampler runs, and samples,
	// maxStep and two, which are read once it stopped.
	mu      sync.Mutex
	samples int
	maxStep time.Duration
	// +checklocks:mu
	last map[string]bool
	two  []string
	// +checklocks:mu
	carried map[string][]time.Duration // boot times at which a node was seen carrying
	stop    chan struct{}
	done    chan struct{}
}

func bootNow() time.Duration { return time.Duration(claim.BootClock{}.Now().UnixNano()) }

func (c *cluster) startSampler() *sampler {
	s := &sampler{last: map[string]bool{}, carried: map[string][]time.Duration{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		var prev time.Duration
		for {
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
			now := bootNow()
			var hs []string
			cur := map[string]bool{}
			for _, n := range c.nodes[:2] {
				if carriesAddr(n.h, testVIP) {
					hs = append(hs, n.name)
					cur[n.name] = true
				}
			}
			s.mu.Lock()
			s.samples++
			if prev != 0 && now-prev > s.maxStep {
				s.maxStep = now - prev
			}
			prev = now
			s.last = cur
			for _, h := range hs {
				s.carried[h] = append(s.carried[h], now)
			}
			if len(hs) > 1 {
				s.two = append(s.two, fmt.Sprintf("%v: %v", now, hs))
			}
			s.mu.Unlock()
		}
	}()
	c.t.Cleanup(s.close)
	return s
}

func (s *sampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

func (s *sampler) carriedSince(name string, since time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.carried[name] {
		if at >= since {
			return true
		}
	}
	return false
}

// events reads and merges every node's add/remove log.
func (c *cluster) events() []keelvip.Event {
	var all []keelvip.Event
	for _, n := range c.nodes {
		f, err := os.Open(filepath.Join(c.base, "events-"+n.name+".log"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			c.t.Fatal(err)
		}
		es, err := keelvip.ReadEvents(f)
		f.Close()
		if err != nil {
			c.t.Fatal(err)
		}
		all = append(all, es...)
	}
	keelvip.SortEvents(all)
	return all
}

// firstEvent returns the time of n's first add (or remove) after since.
func (c *cluster) firstEvent(name string, add bool, since time.Duration) (time.Duration, bool) {
	for _, e := range c.events() {
		if e.Node == name && e.Add == add && e.At >= since && e.VIP == testVIP {
			return e.At, true
		}
	}
	return 0, false
}

// measureLeg sends n UDP probes from a to b over the overlay and returns
// the minimum and mean RTT and the round-trip loss.
func measureLeg(t *testing.T, a, b *node, n, port int) (time.Duration, time.Duration, float64) {
	srv, err := b.h.ListenPacket(context.Background(), "udp", netip.AddrPortFrom(b.addr, uint16(port)).String())
	if err != nil {
		t.Error(err)
		return 0, 0, 1
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			k, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteTo(buf[:k], from)
		}
	}()
	conn, err := a.h.Dial(context.Background(), "udp", netip.AddrPortFrom(b.addr, uint16(port)).String())
	if err != nil {
		t.Error(err)
		return 0, 0, 1
	}
	defer conn.Close()
	sent := make([]time.Time, n)
	rtts := make([]time.Duration, n)
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			if k < 8 {
				continue
			}
			i := binary.BigEndian.Uint64(buf)
			mu.Lock()
			if i < uint64(n) && rtts[i] == 0 {
				rtts[i] = time.Since(sent[i])
			}
			mu.Unlock()
		}
	}()
	for i := 0; i < n; i++ {
		var p [8]byte
		binary.BigEndian.PutUint64(p[:], uint64(i))
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		_, _ = conn.Write(p[:])
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second)
	_ = conn.SetReadDeadline(time.Now())
	<-done
	var got []time.Duration
	for _, r := range rtts {
		if r > 0 {
			got = append(got, r)
		}
	}
	if len(got) == 0 {
		t.Errorf("no probe from %s to %s came back", a.name, b.name)
		return 0, 0, 1
	}
	var sum time.Duration
	for _, r := range got {
		sum += r
	}
	return slices.Min(got), sum / time.Duration(len(got)), 1 - float64(len(got))/float64(n)
}

// staleClaim posts a claim of the first member for epoch to the observer's
// members' channel, from the first member's namespace (so it comes from
// the address it names).
func (c *cluster) postClaim(from, to *node, cl *claim.Claim) error {
	cli := &claim.Client{
		HTTP: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return from.h.Dial(ctx, "tcp", addr)
		}}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cli.Announce(ctx, to.addr, cl)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// TestPartitionNetns is the end-to-end test: three namespaces A, B, C;
// wireguard-go on kernel TUNs; every leg impaired to 250 ms ± 25 ms RTT and
// 2% loss by the UDP Bind; three etcd members (one per namespace, each its
// own process) over the overlay with a 5 s election timeout; the helper,
// controller and listener of keel-vip on every node.
func TestPartitionNetns(t *testing.T) {
	seed := testenv.Seed(t, 49)
	impair := map[string]any{"latency_ms": 125, "jitter_ms": 12.5, "loss": 0.01}
	c := newCluster(t, seed, true, impair, "a", "b", "c")
	A, B, C := c.node("a"), c.node("b"), c.node("c")
	t0 := time.Now()
	c.start()
	t.Logf("helpers up in %v", time.Since(t0).Round(100*time.Millisecond))
	c.startEtcd(500, 5000)
	t.Logf("cluster up in %v (helpers, wireguard, etcd)", time.Since(t0).Round(100*time.Millisecond))

	// The impairment, measured first.
	type leg struct {
		name      string
		min, mean time.Duration
		loss      float64
	}
	var legs []leg
	var lmu sync.Mutex
	var lwg sync.WaitGroup
	for i, p := range [][2]*node{{C, A}, {C, B}, {A, B}} {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			mn, mean, loss := measureLeg(t, p[0], p[1], 300, 7001+i)
			lmu.Lock()
			legs = append(legs, leg{p[0].name + "→" + p[1].name, mn, mean, loss})
			lmu.Unlock()
		}()
	}
	lwg.Wait()
	var table strings.Builder
	fmt.Fprintf(&table, "Link (every leg, by the impairing UDP Bind: 125 ms ± 12.5 ms and 1%% loss each way):\n\n")
	fmt.Fprintf(&table, "| leg | min RTT | mean RTT | round-trip loss |\n| --- | --- | --- | --- |\n")
	slices.SortFunc(legs, func(a, b leg) int { return strings.Compare(a.name, b.name) })
	for _, l := range legs {
		fmt.Fprintf(&table, "| %s | %d ms | %d ms | %.1f%% |\n", l.name, l.min.Milliseconds(), l.mean.Milliseconds(), 100*l.loss)
		// Judged by the minimum RTT, not the mean: the mean
		// also holds the scheduling delays of a loaded machine (userspace
		// WireGuard, the pinger), which are not the link's.
		if l.min < 200*time.Millisecond || l.min > 300*time.Millisecond {
			t.Errorf("leg %s: min RTT %v (mean %v), want about 250 ms ± 25 ms", l.name, l.min, l.mean)
		}
	}

	s := c.startSampler()
	c.serveNames()
	results := map[string]string{}

	// (a) A promotes; C reaches the VIP at A.
	c.holdAtA()
	waitFor(t, 30*time.Second, "C reaches the VIP at A", func() bool { n, err := reach(C, 2*time.Second); return err == nil && n == "a" })
	results["a"] = "C reaches the VIP at A"

	// (b) planned promote to B; downtime seen from C as the longest gap
	// between answered 50 ms UDP pings to the VIP.
	promoteAt := bootNow()
	pings := c.startPings(C)
	time.Sleep(2 * time.Second)
	if out, err := c.promote(B, false); err != nil {
		t.Fatalf("planned promote to B: %v %s", err, out)
	}
	waitFor(t, 30*time.Second, "C reaches the VIP at B", func() bool { n, err := reach(C, 2*time.Second); return err == nil && n == "b" })
	time.Sleep(3 * time.Second)
	gap := pings.stop()
	relA, ok1 := c.firstEvent("a", false, promoteAt)
	addB, ok2 := c.firstEvent("b", true, promoteAt)
	if !ok1 || !ok2 || relA > addB {
		t.Errorf("planned promote: A's release at %v (%v) must come before B's carry at %v (%v)", relA, ok1, addB, ok2)
	}
	results["b"] = fmt.Sprintf("A released first; downtime seen from C (longest gap in 50 ms pings) %s", secs(gap))
	// The bound catches a planned move that waits for the old lease's
	// revoke before it claims (2.6 s to 4.4 s measured that way); the goal
	// is 1.5 s.
	if gap > 3*time.Second {
		t.Errorf("planned promote: downtime seen from C %v, want ≤ 3 s", gap)
	} else if gap > 1500*time.Millisecond {
		t.Logf("goal missed: planned promote downtime %v > 1.5 s", gap)
	}
	t.Logf("planned promote: downtime seen from C %v (bound 3 s)", gap)
	counterAtB := c.counter()

	// (c) B cut off from the majority, twice: as etcd's leader, then as a
	// follower (after a planned promote back to B, which clears its fence).
	type cut struct{ drop, carry, reach, elected time.Duration }
	cutOff := func(label string) cut {
		t.Helper()
		bID := c.memberID(B)
		at := bootNow()
		wall := time.Now()
		if err := c.sw.Cut(B.h); err != nil {
			t.Fatal(err)
		}
		elected := c.watchMajorityLeader(bID, A, C)
		var r cut
		waitFor(t, 25*time.Second, label+": B drops the VIP", func() bool { return !carriesAddr(B.h, testVIP) })
		waitFor(t, 90*time.Second, label+": A carries the VIP", func() bool { return carriesAddr(A.h, testVIP) })
		waitFor(t, 30*time.Second, label+": C reaches the VIP at A", func() bool { n, err := reach(C, 2*time.Second); return err == nil && n == "a" })
		r.reach = time.Since(wall)
		el, ok := elected()
		if !ok {
			t.Fatalf("%s: the majority (A, C) never agreed on a leader other than B", label)
		}
		d, ok1 := c.firstEvent("b", false, at)
		a, ok2 := c.firstEvent("a", true, at)
		if !ok1 || !ok2 {
			t.Fatalf("%s: events missing (drop %v, carry %v)", label, ok1, ok2)
		}
		r.drop, r.carry, r.elected = d-at, a-at, el-at
		if r.drop > 11*time.Second {
			t.Errorf("%s: B dropped the VIP %v after the cut, want ≤ 11 s", label, r.drop)
		}
		// Once the majority has a leader, the lease runs out at most
		// TTL + one election timeout later (etcd's lessor extends every
		// lease by the election timeout when a leader takes office), and
		// A claims on the holder key's deletion: the revoke, the watch and
		// the claim's transaction take a few round trips of 250 ms
		// (2.2 s measured), hence 8 s of slack. How long etcd takes to
		// elect is etcd's: a split vote or a lost vote adds election
		// timeouts (5 to 10 s each), so it is reported, and bounded only
		// loosely.
		if lag := a - max(el, at); lag > leaseTTL+etcdElection+8*time.Second {
			t.Errorf("%s: A carried the VIP %v after the majority had a leader (%v after the cut), want ≤ %v",
				label, lag, r.elected, leaseTTL+etcdElection+8*time.Second)
		}
		if r.elected > 6*etcdElection {
			t.Errorf("%s: the majority took %v to elect a leader, want ≤ %v", label, r.elected, 6*etcdElection)
		}
		return r
	}
	c.moveLeader(B, false)
	leaderCut := cutOff("leader")

	// (d) healed for 30 s: B never carries again (fenced); C routes to A.
	if err := c.sw.Heal(B.h); err != nil {
		t.Fatal(err)
	}
	healed := bootNow()
	time.Sleep(30 * time.Second)
	if s.carriedSince("b", healed) {
		t.Errorf("B carried the VIP after the heal")
	}
	if _, ok := c.firstEvent("b", true, healed); ok {
		t.Errorf("B's log shows an add after the heal")
	}
	stB, err := c.status(B)
	if err != nil || !stB.Fenced || stB.Carried {
		t.Errorf("B after the heal: %+v %v, want fenced and not carrying", stB, err)
	}
	stC, err := c.status(C)
	if err != nil || stC.RoutedTo != "a" || stC.Holder != "a" {
		t.Errorf("C after the heal: %+v %v, want routed to a", stC, err)
	}
	results["d"] = fmt.Sprintf("B never carried it again (fenced=%v); C routes to %s", stB.Fenced, stC.RoutedTo)

	// (e) a stale claim (B, an epoch below the counter's) is refused by C
	// with 409 and by etcd's compare; the counter is unchanged.
	before := c.counter()
	stale, err := claim.NewClaim(B.sign, B.addr, before.epoch-1, c.pair)
	if err != nil {
		t.Fatal(err)
	}
	err = c.postClaim(B, C, stale)
	var ref *claim.RefusalError
	if !errors.As(err, &ref) || !errors.Is(err, claim.ErrStale) || ref.Code != "stale" {
		t.Errorf("stale claim on C's channel: %v, want a 409 stale refusal", err)
	}
	if ok := c.staleTxn(B, stale, counterAtB.rev); ok {
		t.Errorf("etcd took the stale claim's transaction")
	}
	after := c.counter()
	if after != before {
		t.Errorf("counter changed: %+v -> %+v", before, after)
	}
	results["e"] = fmt.Sprintf("stale claim (B, epoch %d < %d): C refused it with 409 (%s) on the channel; etcd's compare refused it; the counter is unchanged", stale.Epoch, before.epoch, ref.Code)

	// (c) again, B as a follower.
	waitFor(t, 60*time.Second, "promote B back", func() bool {
		_, err := c.promote(B, false)
		if err != nil {
			t.Logf("promote b: %v", err)
		}
		return err == nil && carriesAddr(B.h, testVIP)
	})
	c.moveLeader(B, true)
	followerCut := cutOff("follower")
	if err := c.sw.Heal(B.h); err != nil {
		t.Fatal(err)
	}

	s.close()
	if err := checkTimeline(c.events()); err != nil {
		t.Errorf("timeline: %v", err)
	}
	if len(s.two) > 0 {
		t.Errorf("samples with two holders: %v", s.two)
	}
	evs := len(c.events())
	fmt.Fprintf(&table, "\nHolders sampled every 200 ms: %d samples, max step %s, never two holders; %d add/remove events on CLOCK_BOOTTIME merged, never two holders.\n\n",
		s.samples, fmt.Sprintf("%.3f s", s.maxStep.Seconds()), evs)
	fmt.Fprintf(&table, "| case | result |\n| --- | --- |\n| (a) A promotes | %s |\n| (b) planned promote to B | %s |\n", results["a"], results["b"])
	fmt.Fprintf(&table, "| (c) B cut off, B etcd's leader | B dropped the VIP at %s; the majority elected a leader at %s; A carried it at %s; C reached it again at %s |\n", secs(leaderCut.drop), secs(leaderCut.elected), secs(leaderCut.carry), secs(leaderCut.reach))
	fmt.Fprintf(&table, "| (c) B cut off, B a follower | B dropped the VIP at %s; A carried it at %s; C reached it again at %s |\n", secs(followerCut.drop), secs(followerCut.carry), secs(followerCut.reach))
	fmt.Fprintf(&table, "| (d) healed for 30 s | %s |\n| (e) stale claim | %s |\n", results["d"], results["e"])
	fmt.Fprintf(&table, "\nGoals: planned promote ≤ 1.5 s (%s); drop ≤ 10 s (leader %s, follower %s); carry ≤ 37 s as leader (%s), ≤ 25 s as follower (%s).\n",
		secs(gap), secs(leaderCut.drop), secs(followerCut.drop), secs(leaderCut.carry), secs(followerCut.carry))
	t.Logf("measured:\n%s", table.String())
	if p := os.Getenv("KEELVIP_TABLE"); p != "" {
		_ = os.WriteFile(p, []byte(table.String()), 0o644)
	}
}

type counterState struct {
	epoch uint64
	rev   int64
	value string
}

// counter reads the counter key through etcd.
func (c *cluster) counter() counterState {
	c.t.Helper()
	cli := c.etcdClient()
	defer cli.Close()
	kv := etcdkv.New(cli)
	keys := claim.KeysFor("e2e", testVIP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := kv.Get(ctx, keys.Epoch, false)
	if err != nil || len(g.KVs) != 1 {
		c.t.Fatalf("counter: %v %v", err, g.KVs)
	}
	cl, err := claim.ParseClaim(g.KVs[0].Value)
	if err != nil {
		c.t.Fatal(err)
	}
	return counterState{epoch: cl.Epoch, rev: g.KVs[0].ModRevision, value: base64.StdEncoding.EncodeToString(g.KVs[0].Value)}
}

// staleTxn writes cl the way a claimant does, comparing the counter with
// the revision it read back then (rev, now stale). It reports whether etcd
// took it.
func (c *cluster) staleTxn(n *node, cl *claim.Claim, rev int64) bool {
	c.t.Helper()
	cli := c.etcdClient()
	defer cli.Close()
	kv := etcdkv.New(cli)
	keys := claim.KeysFor("e2e", testVIP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := kv.Txn(ctx, claim.Txn{
		If:   []claim.Compare{{Key: keys.Epoch, Target: claim.ModRevision, Revision: rev}, {Key: keys.Holder, Target: claim.CreateRevision}},
		Then: []claim.Op{claim.Put(keys.Epoch, cl.Encode(), 0), claim.Put(keys.Holder, cl.Encode(), 0)},
	})
	if err != nil {
		c.t.Fatalf("stale txn: %v", err)
	}
	return r.Succeeded
}
