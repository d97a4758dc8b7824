package tsng

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/transport/wg"
)

// writeConfig writes cfg as a config file and returns its path.
func writeConfig(t testing.TB, cfg *Config) string {
	t.Helper()
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tsng.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAddrCollisionReported: a member whose address is a VIP's stored
// reservation is reported by `tsng config check` (from the running agent,
// and from the stored state when no agent runs), in the agent's log, in
// status and in the CLI.
func TestAddrCollisionReported(t *testing.T) {
	a := newRestartableAgent(t)
	a.f.must("vip", "create", "home", "api")
	v, err := a.d.Runtime("home").Registry().Get("api")
	if err != nil {
		t.Fatal(err)
	}
	reserved := v.Addr.String()

	// The next version of the config adds server3 at the VIP's address.
	peerSeed := make([]byte, 32)
	peerSeed[0] = 7
	next := *a.cfg
	next.Networks = append([]NetworkConfig(nil), a.cfg.Networks...)
	next.Networks[0].Peers = append(append([]PeerConfig(nil), a.cfg.Networks[0].Peers...), PeerConfig{Name: "server3", Address: reserved,
		Identity: base64.StdEncoding.EncodeToString(ed25519.NewKeyFromSeed(peerSeed).Public().(ed25519.PublicKey)), WireGuardKey: wg.GeneratePrivateKey().PublicKey()})
	file := writeConfig(t, &next)
	mentions := func(what, s string) {
		t.Helper()
		for _, p := range []string{"server3", reserved, "api"} {
			if !strings.Contains(s, p) {
				t.Fatalf("%s does not name %q:\n%s", what, p, s)
			}
		}
	}

	// Before the change reaches the agent, config check asks the agent.
	code, out, errs := a.f.run(nil, "config", "check", file)
	if code != ExitInvalid {
		t.Fatalf("config check with a colliding peer, agent running: exit %d, want %d:\n%s%s", code, ExitInvalid, out, errs)
	}
	mentions("config check (agent)", errs)
	t.Logf("config check, agent running:\n%s%s", out, errs)

	// The agent restarted with the change: log, status and CLI say it.
	a.cfg = &next
	a.Restart()
	if !strings.Contains(a.logs.String(), "collides with a VIP reservation") {
		t.Fatalf("the log does not report the collision:\n%s", a.logs.String())
	}
	var logged bool
	for _, line := range strings.Split(a.logs.String(), "\n") {
		if strings.Contains(line, "collides with a VIP reservation") {
			mentions("the log", line)
			logged = true
		}
	}
	if !logged {
		t.Fatal("no log line")
	}
	var doc struct {
		AddrCollision *struct {
			NodeName  string     `json:"node_name"`
			Addr      netip.Addr `json:"addr"`
			Effective netip.Addr `json:"effective_addr"`
		} `json:"addr_collision"`
		Addr   netip.Addr `json:"addr"`
		Status struct {
			AddrCollision *struct {
				NodeName string `json:"node_name"`
			} `json:"addr_collision"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(a.f.must("vip", "show", "home", "api", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if c := doc.AddrCollision; c == nil || c.NodeName != "server3" || c.Addr.String() != reserved || c.Effective != doc.Addr || doc.Addr.String() == reserved {
		t.Fatalf("show --json: addr %v, collision %+v", doc.Addr, doc.AddrCollision)
	}
	if doc.Status.AddrCollision == nil || doc.Status.AddrCollision.NodeName != "server3" {
		t.Fatalf("status has no collision: %+v", doc.Status)
	}
	show := a.f.must("vip", "show", "home", "api")
	mentions("vip show", show)
	t.Logf("vip show:\n%s", show)
	mentions("vip list", a.f.must("vip", "list", "home"))
	mentions("vip status", a.f.must("vip", "status", "home", "api"))
	code, _, errs = a.f.run(nil, "network", "list")
	if code != 0 {
		t.Fatalf("network list: exit %d", code)
	}
	mentions("network list", errs)
	t.Logf("network list (stderr):\n%s", errs)
	code, _, errs = a.f.run(nil, "config", "check", file)
	if code != ExitInvalid {
		t.Fatalf("config check, agent running the colliding config: exit %d", code)
	}
	// The editor shows it on the VIP's window, not only in the details.
	ctx := browser(t)
	if err := chromedp.Do(ctx, uiSignIn(t, a.d, "#/n/home/v/"+v.ID.String()),
		waitJS(`document.querySelector("#addr-collision") !== null`)); err != nil {
		t.Fatalf("the editor shows no collision: %v", err)
	}
	banner, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#addr-collision").textContent`))
	if err != nil {
		t.Fatal(err)
	}
	mentions("the editor", banner+" api")
	mentions("config check (agent, after)", errs)

	// Without an agent, config check reads the stored state.
	a.d.Close()
	a.d = nil
	code, out, errs = a.f.run(nil, "config", "check", file)
	if code != ExitInvalid {
		t.Fatalf("config check, no agent: exit %d, want %d:\n%s%s", code, ExitInvalid, out, errs)
	}
	mentions("config check (stored state)", errs)
	t.Logf("config check, no agent:\n%s%s", out, errs)
	if !strings.Contains(errs+out, "stored state") {
		t.Fatalf("config check does not say where it found the reservations:\n%s%s", out, errs)
	}
	// The config the agent had before is clean.
	clean := writeConfig(t, &Config{DataDir: a.cfg.DataDir, Socket: a.cfg.Socket, Networks: []NetworkConfig{func() NetworkConfig {
		n := next.Networks[0]
		n.Peers = n.Peers[:1]
		return n
	}()}})
	if code, out, errs := a.f.run(nil, "config", "check", clean); code != 0 {
		t.Fatalf("config check of a clean file: exit %d:\n%s%s", code, out, errs)
	}
}

// TestInitAvoidsReservations: `tsng init` without --address chooses an
// address that is no known VIP reservation: the running agent's, or the
// data_dir's stored state, and says what it knew.
func TestInitAvoidsReservations(t *testing.T) {
	const overlay = "100.80.0.0/29" // .1 to .6; server1 .1, server2 .2
	a := newAgentIn(t, overlay)
	for _, name := range []string{"api", "db", "web"} {
		a.f.must("vip", "create", "home", name)
	}
	taken := map[string]bool{"100.80.0.1": true, "100.80.0.2": true}
	for _, v := range a.d.Runtime("home").Registry().List() {
		taken[v.Addr.String()] = true
	}
	var free string
	for i := 1; i <= 6; i++ {
		if s := netip.AddrFrom4([4]byte{100, 80, 0, byte(i)}).String(); !taken[s] {
			free = s
		}
	}
	if len(taken) != 5 || free == "" {
		t.Fatalf("want one free address in %s: taken %v", overlay, taken)
	}
	initAddr := func(args ...string) (string, string) {
		t.Helper()
		p := filepath.Join(t.TempDir(), "new.json")
		out := a.f.must(append([]string{"init", "--network", "home", "--overlay", overlay, "--name", "server3", "--config", p}, args...)...)
		cfg, err := LoadConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Networks[0].Node.Address, out
	}

	// The running agent knows the nodes and the VIPs: one address is left.
	for range 5 {
		addr, out := initAddr("--socket", a.cfg.Socket, "--data-dir", a.cfg.DataDir)
		if addr != free {
			t.Fatalf("init chose %s with the agent running; the only free address is %s:\n%s", addr, free, out)
		}
		t.Logf("init, agent running: %s", strings.SplitN(out, "\n", 2)[0])
		if !strings.Contains(out, "3 VIP") || !strings.Contains(out, "agent") {
			t.Fatalf("init does not say what it avoided:\n%s", out)
		}
	}

	// Without the agent, the stored state still has the reservations.
	a.d.Close()
	a.d = nil
	for range 8 {
		addr, out := initAddr("--socket", a.cfg.Socket, "--data-dir", a.cfg.DataDir)
		if taken[addr] && addr != "100.80.0.1" && addr != "100.80.0.2" {
			t.Fatalf("init chose %s, a VIP's address, from the stored state:\n%s", addr, out)
		}
		t.Logf("init, stored state: %s", strings.SplitN(out, "\n", 2)[0])
		if !strings.Contains(out, "stored state") || !strings.Contains(out, "3 VIP") {
			t.Fatalf("init does not say it read the stored state:\n%s", out)
		}
	}

	// Knowing nothing, it says so.
	addr, out := initAddr("--socket", filepath.Join(t.TempDir(), "none.sock"), "--data-dir", t.TempDir())
	if !netip.MustParsePrefix(overlay).Contains(netip.MustParseAddr(addr)) {
		t.Fatalf("init chose %s outside %s", addr, overlay)
	}
	if !strings.Contains(out, "no VIP reservations") || !strings.Contains(out, "config check") {
		t.Fatalf("init does not explain what it could not know:\n%s", out)
	}
}
