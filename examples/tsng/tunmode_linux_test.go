package tsng

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg"
)

// logWriter passes a process's output to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestTunModeDNSAndWgShow runs the real tsng binary in tun mode inside a
// network namespace (root): dig +tcp and plain dig get the VIP's address
// from the agent on its TUN address, a name outside the network is
// answered by a test upstream on the namespace's loopback, and Debian's
// wg show and wg showconf read the device through its UAPI socket, and a
// second agent in another namespace with the same TUN name fails to start.
func TestTunModeDNSAndWgShow(t *testing.T) {
	testenv.NeedRoot(t)
	gobin := testenv.NeedBinary(t, "go")
	dig := testenv.NeedBinary(t, "dig")
	wgBin := testenv.NeedBinary(t, "wg")
	h := netns.NewHostT(t, "tm")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The upstream resolver, on the namespace's loopback.
	ln, err := h.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := h.ListenPacket(ctx, "udp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	up := &testUpstream{addr: ln.Addr().String()}
	upSrv, err := serveDNS(upstreamDNS(up), pc, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer upSrv.Close()

	bin := filepath.Join(t.TempDir(), "tsng")
	if out, err := exec.CommandContext(ctx, gobin, "build", "-o", bin, "../../cmd/tsng").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	tun := fmt.Sprintf("tsngt%d", os.Getpid()%100000)
	k, _ := GenerateKeys()
	peer, _ := GenerateKeys()
	cfg := Config{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "api.sock"), UI: "off",
		Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24", Mode: "tun", TUN: tun, DNSUpstreams: []string{up.addr},
			Node:  NodeConfig{Name: "server1", Address: "100.80.0.1", IdentityKey: k.IdentityKey, WireGuardKey: k.WireGuardKey},
			Peers: []PeerConfig{{Name: "server2", Address: "100.80.0.2", Identity: peer.Identity, WireGuardKey: peer.WireGuardPublicKey, Endpoint: "192.0.2.2:51820"}}}}}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "tsng.json")
	os.WriteFile(cfgPath, b, 0o600)
	p, err := h.Start(ctx, []string{bin, "daemon", "--config", cfgPath}, netns.ProcOptions{Output: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	cli := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, append([]string{"--socket", cfg.Socket}, args...)...).CombinedOutput()
		return string(out), err
	}
	waitFor(t, func() bool { out, err := cli("network", "list"); return err == nil && strings.Contains(out, "up") })
	if out, err := cli("vip", "create", "home", "api"); err != nil {
		t.Fatalf("vip create: %v\n%s", err, out)
	}
	out, _ := cli("vip", "show", "home", "api", "--json")
	var doc ServiceDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("show: %v\n%s", err, out)
	}
	digq := func(args ...string) string {
		out, err := h.Run(ctx, append([]string{dig, "@100.80.0.1", "+short", "+time=2", "+tries=2"}, args...)...)
		if err != nil {
			t.Fatalf("dig %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := digq("+tcp", "api.home"); got != doc.Addr.String() {
		t.Errorf("dig +tcp api.home: %q, want %v", got, doc.Addr)
	}
	if got := digq("+notcp", "api.home"); got != doc.Addr.String() {
		t.Errorf("dig api.home: %q, want %v", got, doc.Addr)
	}
	if got := digq("+tcp", "example.test"); got != "192.0.2.7" {
		t.Errorf("dig +tcp example.test (forwarded): %q", got)
	}
	if up.tcp.Load() != 1 {
		t.Errorf("the upstream saw %d TCP queries, want 1", up.tcp.Load())
	}

	// wg show and wg showconf, through /var/run/wireguard/TUN.sock.
	sock := filepath.Join(wg.UAPIDir, tun+".sock")
	var st unix.Stat_t
	if err := unix.Stat(sock, &st); err != nil || st.Mode&0o777 != 0o600 || st.Uid != 0 {
		t.Fatalf("UAPI socket %s: mode %o uid %d %v", sock, st.Mode&0o777, st.Uid, err)
	}
	show, err := exec.CommandContext(ctx, wgBin, "show", tun).CombinedOutput()
	if err != nil || !strings.Contains(string(show), "peer: "+peer.WireGuardPublicKey.String()) || !strings.Contains(string(show), "allowed ips: 100.80.0.2/32") {
		t.Fatalf("wg show %s: %v\n%s", tun, err, show)
	}
	conf, err := exec.CommandContext(ctx, wgBin, "showconf", tun).CombinedOutput()
	if err != nil || !strings.Contains(string(conf), "PublicKey = "+peer.WireGuardPublicKey.String()) || !strings.Contains(string(conf), "Endpoint = 192.0.2.2:51820") {
		t.Fatalf("wg showconf %s: %v\n%s", tun, err, conf)
	}
	if out, err := exec.CommandContext(ctx, wgBin, "set", tun, "listen-port", "1").CombinedOutput(); err == nil || !strings.Contains(string(out), "Operation not permitted") {
		t.Fatalf("wg set: %v %s", err, out)
	}
	// A second agent in another namespace with the same TUN name: the
	// namespace has its own interfaces, but /var/run/wireguard is the
	// host's. Its network does not start, the error names the field to
	// change, and wg show still shows the first agent's device.
	h2 := netns.NewHostT(t, "tm2")
	dir2 := t.TempDir()
	k2, _ := GenerateKeys()
	cfg2 := Config{DataDir: filepath.Join(dir2, "data"), Socket: filepath.Join(dir2, "api.sock"), UI: "off",
		Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24", Mode: "tun", TUN: tun,
			Node:  NodeConfig{Name: "server2", Address: "100.80.0.2", IdentityKey: k2.IdentityKey, WireGuardKey: k2.WireGuardKey},
			Peers: []PeerConfig{{Name: "server1", Address: "100.80.0.1", Identity: k.Identity, WireGuardKey: k.WireGuardPublicKey}}}}}
	b2, _ := json.Marshal(cfg2)
	cfg2Path := filepath.Join(dir2, "tsng.json")
	os.WriteFile(cfg2Path, b2, 0o600)
	ctx2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	var out2 syncBuffer
	p2, err := h2.Start(ctx2, []string{bin, "daemon", "--config", cfg2Path}, netns.ProcOptions{Output: &out2})
	if err == nil {
		err = p2.Wait(ctx2)
	}
	timedOut := ctx2.Err() != nil
	cancel2()
	t.Logf("second agent: %v\n%s", err, out2.String())
	if err == nil || timedOut || !strings.Contains(out2.String(), "networks[0] (home).tun") || !strings.Contains(out2.String(), sock) {
		t.Fatalf("second agent on TUN name %s: %v, want a start error naming networks[0] (home).tun and %s\n%s", tun, err, sock, out2.String())
	}
	show, err = exec.CommandContext(ctx, wgBin, "show", tun).CombinedOutput()
	if err != nil || !strings.Contains(string(show), "peer: "+peer.WireGuardPublicKey.String()) {
		t.Fatalf("wg show %s after the second agent: %v\n%s", tun, err, show)
	}

	// Stopping the network removes the socket.
	if out, err := cli("network", "down", "home"); err != nil {
		t.Fatalf("network down: %v\n%s", err, out)
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Fatal("the UAPI socket outlived the network")
	}
}

// TestUAPIUnprivileged: an agent that is not root offers no socket and
// says so; as root it serves one.
func TestUAPIUnprivileged(t *testing.T) {
	io, _ := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	dev, err := wg.NewDevice(io, wg.Config{PrivateKey: wg.GeneratePrivateKey()}, wg.Options{Bind: wg.NewUDPBind(wg.UDPBindOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	var logs syncBuffer
	d := &Daemon{log: slog.New(slog.NewJSONHandler(&logs, nil))}
	n := &netRuntime{d: d, cfg: NetworkConfig{Name: "home", Mode: "tun"}, tunName: "tsng-home"}
	// startUAPILocked's caller holds n.mu.
	startUAPI := func() *wg.UAPIServer {
		n.mu.Lock()
		defer n.mu.Unlock()
		if err := n.startUAPILocked(dev); err != nil {
			t.Fatal(err)
		}
		return n.uapi
	}
	defer func(f func() int, dir string) { geteuid, uapiDir = f, dir }(geteuid, uapiDir)
	geteuid = func() int { return 1000 }
	uapiDir = filepath.Join(t.TempDir(), "wireguard")
	if srv := startUAPI(); srv != nil || !strings.Contains(logs.String(), "no UAPI socket: the agent does not run as root") {
		t.Fatalf("unprivileged: server %v, log %s", srv, logs.String())
	}
	if _, err := os.Stat(uapiDir); err == nil {
		t.Fatal("an unprivileged agent created the socket directory")
	}
	if os.Geteuid() == 0 {
		geteuid = os.Geteuid
		srv := startUAPI()
		if srv == nil {
			t.Fatalf("as root: no socket; log %s", logs.String())
		}
		srv.Close()
	}
	// Off when the config says so, and never in netstack mode.
	off := false
	for _, c := range []NetworkConfig{{Name: "home", Mode: "tun", UAPI: &off}, {Name: "home"}} {
		m := &netRuntime{d: d, cfg: c, tunName: "tsng-home"}
		m.mu.Lock()
		err := m.startUAPILocked(dev)
		served := m.uapi != nil
		m.mu.Unlock()
		if served || err != nil {
			t.Fatalf("%+v: served a socket (%v)", c, err)
		}
	}
}

// TestUAPINameCollision: a second agent on the host (another network
// namespace shares /var/run/wireguard) whose TUN has the same name as a
// running one fails to start the network, with an error naming the
// config field to change; the first agent's socket keeps answering.
func TestUAPINameCollision(t *testing.T) {
	testenv.NeedRoot(t)
	newDev := func() *wg.Device {
		pio, _ := transporttest.NewChanPair(transporttest.ChanPairOptions{})
		dev, err := wg.NewDevice(pio, wg.Config{PrivateKey: wg.GeneratePrivateKey()}, wg.Options{Bind: wg.NewUDPBind(wg.UDPBindOptions{})})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		return dev
	}
	defer func(dir string) { uapiDir = dir }(uapiDir)
	uapiDir = filepath.Join(t.TempDir(), "wireguard")
	first, err := newDev().ServeUAPI("tsng-home", wg.UAPIOptions{Dir: uapiDir})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	d := &Daemon{log: slog.New(slog.DiscardHandler)}
	n := &netRuntime{d: d, cfg: NetworkConfig{Name: "home", Mode: "tun"}, tunName: "tsng-home"}
	n.index.Store(1)
	second := newDev()
	n.mu.Lock()
	err = n.startUAPILocked(second)
	served := n.uapi != nil
	n.mu.Unlock()
	if served || err == nil || !errors.Is(err, wg.ErrUAPIInUse) || !strings.Contains(err.Error(), "networks[1] (home).tun") ||
		!strings.Contains(err.Error(), first.Path()) {
		t.Fatalf("second agent: served %v, err %v; want ErrUAPIInUse naming networks[1] (home).tun and %s", served, err, first.Path())
	}
	t.Log(err)
	c, err := net.Dial("unix", first.Path())
	if err != nil {
		t.Fatalf("the first socket: %v", err)
	}
	defer c.Close()
	c.Write([]byte("get=1\n\n"))
	// The server keeps the connection open for the next operation: read
	// up to the reply's errno line.
	var got []string
	for r := bufio.NewScanner(c); r.Scan(); {
		got = append(got, r.Text())
		if strings.HasPrefix(r.Text(), "errno=") {
			break
		}
	}
	if len(got) == 0 || got[len(got)-1] != "errno=0" {
		t.Fatalf("the first socket answered %q", got)
	}
}
