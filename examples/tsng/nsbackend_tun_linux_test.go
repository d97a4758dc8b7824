//go:build linux

package tsng

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// TestNetstackBackendFailoverToTUN: an HTTP server on the host's loopback,
// behind a netstack node (server1, in this process), is reached through a
// VIP from another netstack node (client); when it stops, the VIP fails
// over to a tun-mode node (server2: the tsng binary in a network
// namespace of its own, with its TUN tsng-server2), whose application
// listens on the namespace's kernel stack. The netstack nodes' WireGuard
// sockets live in a second namespace, on one LAN with server2's.
func TestNetstackBackendFailoverToTUN(t *testing.T) {
	testenv.NeedRoot(t)
	gobin := testenv.NeedBinary(t, "go")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "tsng")
	if out, err := exec.CommandContext(ctx, gobin, "build", "-o", bin, "../../cmd/tsng").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	port, stopHTTP := serveHostHTTP(t, "server1-host")
	nsA := netns.NewHostT(t, "nbA")
	nsT := netns.NewHostT(t, "nbT")
	_, ifs := netns.LANT(t, nsA, nsT)

	dir := t.TempDir()
	cfgs, err := demoConfigs(dir, []string{"server1", "server2", "client"})
	if err != nil {
		t.Fatal(err)
	}
	const tunWG = 51820
	endpoint := map[string]string{
		"server1": ifs[0].AddrPort4(cfgs[0].Networks[0].Node.ListenPort).String(),
		"server2": ifs[1].AddrPort4(tunWG).String(),
		"client":  ifs[0].AddrPort4(cfgs[2].Networks[0].Node.ListenPort).String(),
	}
	for _, c := range cfgs {
		c.Networks[0].ProbeFast = true
		for j := range c.Networks[0].Peers {
			p := &c.Networks[0].Peers[j]
			p.Endpoint = endpoint[p.Name]
		}
	}
	cfgs[0].Networks[0].BackendPorts = []string{fmt.Sprintf("tcp/%d", port)}
	s2 := cfgs[1]
	s2.Socket, s2.UI, s2.LogLevel = filepath.Join(dir, "server2.sock"), "off", "debug"
	s2.Networks[0].Mode, s2.Networks[0].TUN, s2.Networks[0].Node.ListenPort = "tun", "tsng-server2", tunWG
	if err := s2.Validate(); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(s2)
	s2Path := filepath.Join(dir, "server2.json")
	if err := os.WriteFile(s2Path, b, 0o600); err != nil {
		t.Fatal(err)
	}

	// server2's application, on its namespace's kernel stack.
	ln, err := nsT.Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "server2-tun") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p, err := nsT.Start(context.WithoutCancel(ctx), []string{bin, "daemon", "--config", s2Path}, netns.ProcOptions{Output: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill() })

	bind := func(string) conn.Bind { return nsA.Bind(wg.NewUDPBind(wg.UDPBindOptions{})) }
	var ds []*Daemon
	for _, i := range []int{0, 2} {
		d, _ := startReloadable(t, cfgs[i], DaemonOptions{NoAPI: true, Bind: bind})
		ds = append(ds, d)
	}
	server1, client := ds[0].Runtime("home"), ds[1].Runtime("home")
	reg := server1.Registry()
	if _, err := reg.Create(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	be := func(s string) vip.Backend {
		b, err := reg.ResolveBackend(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	l90 := vip.PortKey{Proto: vip.TCP, Port: 90}
	v, err := reg.PortAdd(ctx, "api", l90, []vip.Backend{be(fmt.Sprintf("server1:%d", port))})
	if err != nil {
		t.Fatal(err)
	}
	api90 := netip.AddrPortFrom(v.Addr, 90)
	pollUntil(t, 60*time.Second, "GET through the VIP to server1's loopback", func() (bool, string) {
		got, err := vipGet(ctx, client.Host(), api90)
		return err == nil && got == "server1-host", fmt.Sprintf("%q, %v", got, err)
	})
	if _, err := reg.BackendAdd(ctx, "api", l90, be(fmt.Sprintf("server2:%d", port))); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 60*time.Second, "the tun-mode server2's backend eligible at the client", func() (bool, string) {
		bs, _ := backendAt(client, "tcp/90", "server2")
		return bs.Eligible, fmt.Sprintf("%+v", bs)
	})
	stopHTTP()
	stopped := time.Now()
	pollUntil(t, 30*time.Second, "the client's server1 backend out of rotation", func() (bool, string) {
		bs, _ := backendAt(client, "tcp/90", "server1")
		return !bs.Eligible && bs.Reason == "check-failed", fmt.Sprintf("%+v", bs)
	})
	t.Logf("server1 out of rotation at the client %v after its application stopped", time.Since(stopped).Round(time.Millisecond))
	for range 3 {
		if got, err := vipGet(ctx, client.Host(), api90); err != nil || got != "server2-tun" {
			t.Fatalf("GET after failover to the tun-mode node: %q, %v; want server2-tun", got, err)
		}
	}
}
