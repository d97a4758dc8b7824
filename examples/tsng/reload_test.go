package tsng

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// cloneConfig returns a deep copy of cfg: its networks and their peers
// can be edited without touching cfg.
func cloneConfig(t testing.TB, cfg *Config) *Config {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// rewriteConfig writes cfg over the file at path (atomically, as an
// editor's save would).
func rewriteConfig(t testing.TB, path string, cfg *Config) {
	t.Helper()
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// memberNames returns the names of the network's members in force, this
// node first.
func memberNames(n *netRuntime) []string {
	ms := n.ms()
	out := []string{ms.members[0].Name}
	for _, p := range ms.peers {
		out = append(out, p.Name)
	}
	return out
}

// startReloadable starts the agent of cfg from a config file (so that
// Reload re-reads it) and returns it and the file's path.
func startReloadable(t *testing.T, cfg *Config, o DaemonOptions) (*Daemon, string) {
	t.Helper()
	path := writeConfig(t, cfg)
	o.ConfigPath = path
	d, err := NewDaemon(context.Background(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

// TestReloadPeers: a reload adds a peer (to the WireGuard device, the
// replicator's peers and the crdt member set), changes a peer's endpoint
// in place (same session), and removes a peer, which becomes a former
// member; each is reported by name.
func TestReloadPeers(t *testing.T) {
	ctx := context.Background()
	p2, _ := testPeer(2)
	p2.Endpoint = "127.0.0.1:40002"
	p3, _ := testPeer(3)
	cfg := oneNodeConfig(socketDir(t, "reload"), p2)
	cfg.Socket = ""
	d, path := startReloadable(t, cfg, DaemonOptions{NoAPI: true})
	n := d.Runtime("home")

	add := cloneConfig(t, cfg)
	add.Networks[0].Peers = append(add.Networks[0].Peers, p3)
	add.Networks[0].Peers[0].Endpoint = "127.0.0.1:40012"
	rewriteConfig(t, path, add)
	res, err := d.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := NetworkReload{Network: "home", Added: []string{"server3"}, Changed: []string{"server2: endpoint"}}
	if !res.Changed || len(res.Networks) != 1 || !equalReload(res.Networks[0], want) {
		t.Fatalf("reload that adds server3 and moves server2: %+v, want %+v", res, want)
	}
	if got := memberNames(n); !slices.Equal(got, []string{"server1", "server2", "server3"}) {
		t.Fatalf("members after the add: %v", got)
	}
	if got := len(n.ms().peerIDs); got != 2 {
		t.Fatalf("the replicator has %d peers, want 2", got)
	}
	st, err := devOf(n).Stats()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st[p3.WireGuardKey]; !ok || len(st) != 2 {
		t.Fatalf("the device's peers after the add: %v", st)
	}
	if e := st[p2.WireGuardKey].Endpoint.String(); e != "127.0.0.1:40012" {
		t.Fatalf("server2's endpoint after the change: %s", e)
	}
	if !slices.Contains(n.replica.Members(), authorsOf(n.ms().members)[2]) {
		t.Fatal("server3 is not in the crdt member set")
	}

	// The same file again: no change.
	if res, err := d.Reload(ctx); err != nil || res.Changed {
		t.Fatalf("a second reload of the same file: %+v %v", res, err)
	}

	rm := cloneConfig(t, add)
	rm.Networks[0].Peers = rm.Networks[0].Peers[1:] // server2 leaves
	rewriteConfig(t, path, rm)
	res, err = d.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (NetworkReload{Network: "home", Removed: []string{"server2"}}); !equalReload(res.Networks[0], want) {
		t.Fatalf("reload that removes server2: %+v", res.Networks[0])
	}
	if got := memberNames(n); !slices.Equal(got, []string{"server1", "server3"}) {
		t.Fatalf("members after the removal: %v", got)
	}
	st, _ = devOf(n).Stats()
	if _, ok := st[p2.WireGuardKey]; ok || len(st) != 1 {
		t.Fatalf("the device's peers after the removal: %v", st)
	}
	former := n.replica.Former()
	if len(former) != 1 {
		t.Fatalf("former members after server2 left: %v", former)
	}
	// server3's WireGuard key changes: the device's peer is replaced.
	rekey := cloneConfig(t, rm)
	newKey := wg.GeneratePrivateKey().PublicKey()
	rekey.Networks[0].Peers[0].WireGuardKey = newKey
	rewriteConfig(t, path, rekey)
	res, err = d.Reload(ctx)
	if err != nil || !equalReload(res.Networks[0], NetworkReload{Network: "home", Changed: []string{"server3: wireguard_key"}}) {
		t.Fatalf("reload that changes server3's key: %+v %v", res, err)
	}
	st, _ = devOf(n).Stats()
	if _, ok := st[newKey]; !ok || len(st) != 1 {
		t.Fatalf("the device's peers after server3's new key: %v", st)
	}

	// server2 signs after it left: refused, and counted where an operator
	// looks.
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 2
	r2, err := crdt.Open(ctx, crdt.Config{Network: n.id, Signer: ed25519.NewKeyFromSeed(seed), Members: authorsOf(append(n.ms().members, vip.NodeInfo{ID: vip.NodeID(former[0].Author)}))})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	fs, err := r2.Edit(ctx, crdt.ServiceID{7}, crdt.NoRevision, crdt.Edit{Key: "name", Value: []byte("late")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.replica.MergeFields(ctx, fs); !errors.Is(err, crdt.ErrFormerMember) {
		t.Fatalf("a field server2 signed after it left: %v, want ErrFormerMember", err)
	}
	if got := metricValue(t, controlCollector{d}, "tsng_crdt_refused_total", "reason", "former"); got != 1 {
		t.Fatalf("tsng_crdt_refused_total{reason=\"former\"} = %v, want 1", got)
	}
}

// metricValue gathers c and returns the value of the series of name whose
// label is value.
func metricValue(t *testing.T, c prometheus.Collector, name, label, value string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

// equalReload compares two reports.
func equalReload(a, b NetworkReload) bool {
	return a.Network == b.Network && slices.Equal(a.Added, b.Added) && slices.Equal(a.Removed, b.Removed) && slices.Equal(a.Changed, b.Changed)
}

// TestReloadRefused: a config that fails validation (a duplicate key, an
// address collision, a bad field), or that changes a setting read only at
// start, is refused with an error naming the field, and the members, the
// device and the config in force stay as they were.
func TestReloadRefused(t *testing.T) {
	ctx := context.Background()
	p2, _ := testPeer(2)
	p3, _ := testPeer(3)
	cfg := oneNodeConfig(socketDir(t, "reload"), p2)
	cfg.Socket = ""
	d, path := startReloadable(t, cfg, DaemonOptions{NoAPI: true})
	n := d.Runtime("home")
	before := memberNames(n)
	devBefore, _ := devOf(n).Config()
	api, err := n.Registry().Create(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if api.Addr.String() == p3.Address { // the VIP's address is drawn at random
		p3.Address = "100.80.0.4"
	}

	cases := []struct {
		name  string
		edit  func(c *Config)
		is    error
		field string
	}{
		{"duplicate identity", func(c *Config) {
			q := p3
			q.Identity = c.Networks[0].Peers[0].Identity
			c.Networks[0].Peers = append(c.Networks[0].Peers, q)
		}, ErrConfig, "identity"},
		{"duplicate wireguard key", func(c *Config) {
			q := p3
			q.WireGuardKey = p2.WireGuardKey
			c.Networks[0].Peers = append(c.Networks[0].Peers, q)
		}, ErrConfig, "wireguard_key"},
		{"address collision", func(c *Config) {
			q := p3
			q.Address = p2.Address
			c.Networks[0].Peers = append(c.Networks[0].Peers, q)
		}, ErrConfig, "address"},
		{"bad endpoint", func(c *Config) {
			q := p3
			q.Endpoint = "nowhere"
			c.Networks[0].Peers = append(c.Networks[0].Peers, q)
		}, ErrConfig, "endpoint"},
		{"a VIP's address", func(c *Config) {
			q := p3
			q.Address = api.Addr.String()
			c.Networks[0].Peers = append(c.Networks[0].Peers, q)
		}, ErrConfig, "is the address of VIP api"},
		{"a start-only setting", func(c *Config) {
			c.Networks[0].Peers = append(c.Networks[0].Peers, p3)
			c.Networks[0].DNSPort = 5454
		}, ErrRestartNeeded, "dns_port"},
		{"a new network", func(c *Config) {
			nc := c.Networks[0]
			nc.Name = "work"
			c.Networks = append(c.Networks, nc)
		}, ErrRestartNeeded, "work"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cloneConfig(t, cfg)
			tc.edit(c)
			rewriteConfig(t, path, c)
			_, err := d.Reload(ctx)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("reload: %v; want %v naming %q", err, tc.is, tc.field)
			}
			t.Logf("refused: %v", err)
			if got := memberNames(n); !slices.Equal(got, before) {
				t.Fatalf("members after a refused reload: %v, want %v", got, before)
			}
			if got, _ := devOf(n).Config(); !wgConfigEqual(got, devBefore) {
				t.Fatalf("the device changed after a refused reload: %+v", got)
			}
			if m := n.replica.Members(); len(m) != 2 {
				t.Fatalf("crdt members after a refused reload: %d", len(m))
			}
		})
	}
	// The file is fixed: the reload applies it.
	c := cloneConfig(t, cfg)
	c.Networks[0].Peers = append(c.Networks[0].Peers, p3)
	rewriteConfig(t, path, c)
	if res, err := d.Reload(ctx); err != nil || !res.Changed {
		t.Fatalf("reload of the fixed file: %+v %v", res, err)
	}
}

// wgConfigEqual compares two device configs by their peers' keys,
// endpoints and allowed IPs.
func wgConfigEqual(a, b wg.Config) bool {
	if a.PrivateKey != b.PrivateKey || len(a.Peers) != len(b.Peers) {
		return false
	}
	for i := range a.Peers {
		x, y := a.Peers[i], b.Peers[i]
		if x.PublicKey != y.PublicKey || x.Endpoint != y.Endpoint || !slices.Equal(x.AllowedIPs, y.AllowedIPs) {
			return false
		}
	}
	return true
}

// TestReloadDuringReload: a reload while another runs is refused with
// ErrReloadBusy (through the API: CodeBusy, 409), and the first one
// completes.
func TestReloadDuringReload(t *testing.T) {
	ctx := context.Background()
	p2, _ := testPeer(2)
	p3, _ := testPeer(3)
	cfg := oneNodeConfig(socketDir(t, "reload"), p2)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d, path := startReloadable(t, cfg, DaemonOptions{reloadHook: func() {
		once.Do(func() { close(entered); <-release })
	}})
	c := cloneConfig(t, cfg)
	c.Networks[0].Peers = append(c.Networks[0].Peers, p3)
	rewriteConfig(t, path, c)
	first := make(chan error, 1)
	go func() {
		_, err := d.Reload(ctx)
		first <- err
	}()
	testenv.Within(t, "the first reload reaching its hook", func() { <-entered })
	if _, err := d.Reload(ctx); !errors.Is(err, ErrReloadBusy) {
		t.Fatalf("a reload during a reload: %v, want ErrReloadBusy", err)
	}
	var out, errOut bytes.Buffer
	code := Main(ctx, []string{"--socket", cfg.Socket, "reload"}, &Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
	if code == 0 || !strings.Contains(errOut.String(), "already in progress") {
		t.Fatalf("tsng reload during a reload: exit %d, %q", code, errOut.String())
	}
	close(release)
	testenv.Within(t, "the first reload", func() {
		if err := <-first; err != nil {
			t.Errorf("the first reload: %v", err)
		}
	})
	if got := memberNames(d.Runtime("home")); len(got) != 3 {
		t.Fatalf("members after the first reload: %v", got)
	}
}

// TestReloadCLIAndSignal: `tsng reload` asks the agent's API and prints
// what changed; the agent's SIGHUP handler reloads the same way and logs
// a refusal without stopping.
func TestReloadCLIAndSignal(t *testing.T) {
	ctx := context.Background()
	p2, _ := testPeer(2)
	p3, _ := testPeer(3)
	cfg := oneNodeConfig(socketDir(t, "reload"), p2)
	d, path := startReloadable(t, cfg, DaemonOptions{})
	env := func(out, errOut *bytes.Buffer) *Env {
		return &Env{Stdout: out, Stderr: errOut, Getenv: func(string) string { return "" }}
	}
	c := cloneConfig(t, cfg)
	c.Networks[0].Peers = append(c.Networks[0].Peers, p3)
	rewriteConfig(t, path, c)
	var out, errOut bytes.Buffer
	if code := Main(ctx, []string{"--socket", cfg.Socket, "reload"}, env(&out, &errOut)); code != 0 || strings.TrimSpace(out.String()) != "network home: added server3" {
		t.Fatalf("tsng reload: exit %d, %q %q", code, out.String(), errOut.String())
	}
	// A bad file: the CLI exits with the config status and names the
	// field.
	bad := cloneConfig(t, c)
	bad.Networks[0].Peers[1].Address = bad.Networks[0].Peers[0].Address
	rewriteConfig(t, path, bad)
	out.Reset()
	errOut.Reset()
	if code := Main(ctx, []string{"--socket", cfg.Socket, "reload"}, env(&out, &errOut)); code == 0 || !strings.Contains(errOut.String(), "address") {
		t.Fatalf("tsng reload of a bad file: exit %d, %q", code, errOut.String())
	}

	// SIGHUP: the handler reloads, and logs a refusal.
	rewriteConfig(t, path, cfg) // server3 leaves
	var logs syncBuffer
	hup := make(chan os.Signal, 1)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		reloadOnSignal(sctx, d, hup, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	hup <- nil
	pollUntil(t, 10*time.Second, "the SIGHUP reload removing server3", func() (bool, string) {
		got := memberNames(d.Runtime("home"))
		return len(got) == 2, strings.Join(got, ", ")
	})
	rewriteConfig(t, path, bad)
	hup <- nil
	pollUntil(t, 10*time.Second, "the refused SIGHUP reload in the log", func() (bool, string) {
		l := logs.String()
		return strings.Contains(l, "reload refused"), l
	})
	cancel()
	<-done
	if got := len(memberNames(d.Runtime("home"))); got != 2 {
		t.Fatalf("a refused SIGHUP reload changed the members: %d", got)
	}
}

// TestCredentialNote: a reload of systemd's credential copy that changes
// nothing says why.
func TestCredentialNote(t *testing.T) {
	if n := credentialNote("/run/credentials/tsng.service/tsng.json", "/run/credentials/tsng.service"); !strings.Contains(n, "RefreshOnReload=credentials") {
		t.Fatalf("note for a credential copy: %q", n)
	}
	if n := credentialNote("/etc/tsng/tsng.json", "/run/credentials/tsng.service"); n != "" {
		t.Fatalf("note for a config outside the credentials directory: %q", n)
	}
	if n := credentialNote("/etc/tsng/tsng.json", ""); n != "" {
		t.Fatalf("note without a credentials directory: %q", n)
	}
}

// pollUntil polls cond every 20 ms until it holds, failing t after d with
// what and cond's last note.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, note := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, d, note)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// devOf returns n's WireGuard device (nil while the network is down).
func devOf(n *netRuntime) *wg.Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dev
}

// TestReloadKeepsConfigPaths: a reload may reorder the networks; errors
// that name a network's config field (such as a taken tun name at its
// next start) then use its new place.
func TestReloadKeepsConfigPaths(t *testing.T) {
	cfg := oneNodeConfig(socketDir(t, "tsngpaths"))
	work := cfg.Networks[0]
	work.Name, work.Overlay, work.DNSPort, work.Node.Address = "work", "100.81.0.0/24", 5354, "100.81.0.1"
	cfg.Networks = append(cfg.Networks, work)
	d := startDaemon(t, cfg)
	defer d.Close()
	where := func() []string { return []string{d.Runtime("home").where(), d.Runtime("work").where()} }
	if got := where(); !slices.Equal(got, []string{"networks[0] (home)", "networks[1] (work)"}) {
		t.Fatalf("at start: %v", got)
	}
	c := cloneConfig(t, cfg)
	c.Networks[0], c.Networks[1] = c.Networks[1], c.Networks[0]
	if _, err := d.ReloadConfig(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if got := where(); !slices.Equal(got, []string{"networks[1] (home)", "networks[0] (work)"}) {
		t.Fatalf("after a reordering reload: %v", got)
	}
}
