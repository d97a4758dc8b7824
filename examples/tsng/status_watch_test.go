package tsng

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/transport/wg"
)

// restartableAgent is a one-node agent (netstack mode) whose config and
// state survive Restart, as an agent restarted by systemd does.
type restartableAgent struct {
	t    *testing.T
	cfg  *Config
	d    *Daemon
	f    *apiFixture
	logs syncBuffer // the agent's log, across restarts
}

func newRestartableAgent(t *testing.T) *restartableAgent { return newAgentIn(t, "100.80.0.0/24") }

// newAgentIn is newRestartableAgent on another overlay range (server1 has
// its first address, server2 the second).
func newAgentIn(t *testing.T, overlay string) *restartableAgent {
	dir := socketDir(t, "tsngwatch")
	seed := make([]byte, 32)
	seed[0] = 5
	peerSeed := make([]byte, 32)
	peerSeed[0] = 6
	cfg := &Config{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "api.sock"),
		Networks: []NetworkConfig{{Name: "home", Overlay: overlay, DNSPort: 5353,
			Node: NodeConfig{Name: "server1", Address: "100.80.0.1", IdentityKey: base64.StdEncoding.EncodeToString(seed), WireGuardKey: wg.GeneratePrivateKey()},
			Peers: []PeerConfig{{Name: "server2", Address: "100.80.0.2", Identity: base64.StdEncoding.EncodeToString(ed25519.NewKeyFromSeed(peerSeed).Public().(ed25519.PublicKey)),
				WireGuardKey: wg.GeneratePrivateKey().PublicKey()}}}}}
	a := &restartableAgent{t: t, cfg: cfg, f: &apiFixture{t: t, socket: cfg.Socket}}
	a.start()
	t.Cleanup(func() {
		if a.d != nil {
			a.d.Close()
		}
	})
	return a
}

func (a *restartableAgent) start() {
	a.t.Helper()
	d, err := NewDaemon(context.Background(), a.cfg, DaemonOptions{Logger: slog.New(slog.NewJSONHandler(&a.logs, nil))})
	if err != nil {
		a.t.Fatal(err)
	}
	a.d = d
}

// Restart stops the agent and starts it again on the same state: the
// configuration stays, the engine (and its counters) is new.
func (a *restartableAgent) Restart() {
	a.t.Helper()
	if err := a.d.Close(); err != nil {
		a.t.Fatal(err)
	}
	a.d = nil
	a.start()
}

// echo serves UDP echo on the node's own address at port until the test
// ends or the agent restarts (the netstack host goes with it).
func (a *restartableAgent) echo(port uint16) {
	a.t.Helper()
	pc, err := a.d.Runtime("home").Host().ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("100.80.0.1"), port))
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// send sends n datagrams to the VIP's udp/port from the node itself (the
// local backend is hairpinned) and waits for each echo.
func (a *restartableAgent) send(vipAddr netip.Addr, port uint16, n int) {
	a.t.Helper()
	c, err := a.d.Runtime("home").Host().DialUDP(netip.AddrPort{}, netip.AddrPortFrom(vipAddr, port))
	if err != nil {
		a.t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for i := range n {
		msg := fmt.Sprintf("datagram %d", i)
		got := false
		for try := 0; try < 20 && !got; try++ {
			if _, err := c.Write([]byte(msg)); err != nil {
				a.t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			m, err := c.Read(buf)
			got = err == nil && string(buf[:m]) == msg
		}
		if !got {
			a.t.Fatalf("no echo of %q through %v:%d", msg, vipAddr, port)
		}
	}
}

// activeBindings is the engine's count of live NAT bindings.
func (a *restartableAgent) activeBindings() int {
	return a.d.Runtime("home").Engine().Status().Flow.Active
}

// TestStatusWatchRates runs `vip status --watch --json` against a real
// agent through binding expiry, a listener removal and an agent restart:
// the rates follow the traffic sent in each interval, never go negative,
// never spike when nothing was sent, and start again from a new baseline
// after the restart.
func TestStatusWatchRates(t *testing.T) {
	a := newRestartableAgent(t)
	a.f.must("vip", "create", "home", "api")
	a.f.must("vip", "port", "add", "home", "api", "udp/53", "--backend", "server1:7053")
	a.f.must("vip", "port", "add", "home", "api", "udp/54", "--backend", "server1:7054")
	a.f.must("vip", "port", "set", "home", "api", "udp/53", "--idle-timeout", "1")
	a.f.must("vip", "port", "set", "home", "api", "udp/54", "--idle-timeout", "1")
	v, err := a.d.Runtime("home").Registry().Get("api")
	if err != nil {
		t.Fatal(err)
	}
	a.echo(7053)
	a.echo(7054)

	// What happens before each sample after the first. quiet marks the
	// intervals in which no user traffic was sent.
	steps := []struct {
		what  string
		do    func()
		quiet bool
	}{
		{"traffic to udp/54", func() { a.send(v.Addr, 54, 5) }, false},
		{"the bindings expire", func() {
			deadline := time.Now().Add(20 * time.Second)
			for a.activeBindings() > 0 {
				if time.Now().After(deadline) {
					t.Fatal("the bindings did not expire")
				}
				time.Sleep(50 * time.Millisecond) // polling a real-time expiry
			}
		}, true},
		{"udp/53 is removed (the listeners before udp/54 change)", func() { a.f.must("vip", "port", "remove", "home", "api", "udp/53") }, true},
		{"the agent restarts, then a little traffic", func() {
			a.Restart()
			a.echo(7054)
			a.send(v.Addr, 54, 2)
		}, false},
		{"more traffic", func() { a.send(v.Addr, 54, 3) }, false},
	}
	step := 0
	env := &Env{Sleep: func(ctx context.Context, _ time.Duration) error {
		if step < len(steps) {
			steps[step].do()
		}
		step++
		return nil
	}}
	code, out, errs := a.f.run(env, "vip", "status", "home", "api", "--watch", "--json", "--count", fmt.Sprint(len(steps)+1))
	if code != 0 {
		t.Fatalf("status --watch: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(steps)+1 {
		t.Fatalf("%d samples, want %d:\n%s", len(lines), len(steps)+1, out)
	}
	type sample struct {
		Rates map[string]float64 `json:"rates"`
		Reset bool               `json:"counters_reset"`
	}
	var samples []sample
	for i, line := range lines {
		var s sample
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		samples = append(samples, s)
	}
	check := func(who string, samples []sample) {
		t.Helper()
		for i, s := range samples {
			if i == 0 {
				if len(s.Rates) != 0 || s.Reset {
					t.Errorf("%s: the first sample has rates: %v", who, s.Rates)
				}
				continue
			}
			st := steps[i-1]
			positive := 0
			for k, r := range s.Rates {
				if r < 0 {
					t.Errorf("%s: sample %d (after %s): rate %s = %v, negative", who, i, st.what, k, r)
				}
				if st.quiet && r != 0 {
					t.Errorf("%s: sample %d (after %s): rate %s = %v, but nothing was sent", who, i, st.what, k, r)
				}
				if r > 0 {
					positive++
				}
			}
			switch {
			case strings.HasPrefix(st.what, "the agent restarts"):
				if !s.Reset || len(s.Rates) != 0 {
					t.Errorf("%s: sample %d (after %s): want counters_reset and no rates (a new baseline), got reset=%v rates %v", who, i, st.what, s.Reset, s.Rates)
				}
			case !st.quiet:
				if s.Reset || positive == 0 {
					t.Errorf("%s: sample %d (after %s): want positive rates, got reset=%v rates %v", who, i, st.what, s.Reset, s.Rates)
				}
			}
		}
	}
	check("vip status --watch", samples)

	// The editor derives its rates from the same documents the same way:
	// feed it the samples in order.
	ctx := browser(t)
	if err := chromedp.Do(ctx, uiSignIn(t, a.d, ""), waitJS(`typeof window.tsngStatusRates === "function"`)); err != nil {
		t.Fatal(err)
	}
	type guiRate struct {
		PPS float64 `json:"pps"`
		BPS float64 `json:"bps"`
	}
	type guiSample struct {
		Reset bool               `json:"reset"`
		Rates map[string]guiRate `json:"rates"`
	}
	// Samples taken a millisecond apart are real here, so the times are
	// passed in fractional milliseconds since the first sample.
	var items []string
	var t0 time.Time
	for i, line := range lines {
		var tm struct {
			Time time.Time `json:"time"`
		}
		if err := json.Unmarshal([]byte(line), &tm); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			t0 = tm.Time
		}
		items = append(items, fmt.Sprintf(`{"doc":%s,"t":%v}`, line, float64(tm.Time.Sub(t0).Nanoseconds())/1e6))
	}
	js := fmt.Sprintf(`(() => { const docs = [%s]; let base = null;
		return docs.map((d) => { const r = window.tsngStatusRates(base, d.doc, d.t); base = r.base; return { reset: r.reset, rates: r.rates }; }); })()`,
		strings.Join(items, ","))
	gui, err := chromedp.Run(ctx, chromedp.Evaluate[[]guiSample](js))
	if err != nil {
		t.Fatal(err)
	}
	if len(gui) != len(samples) {
		t.Fatalf("the editor derived %d samples from %d", len(gui), len(samples))
	}
	var flat []sample
	for _, g := range gui {
		s := sample{Reset: g.Reset, Rates: map[string]float64{}}
		for k, r := range g.Rates {
			s.Rates[k+" pkt/s"], s.Rates[k+" B/s"] = r.PPS, r.BPS
		}
		flat = append(flat, s)
	}
	check("editor", flat)
}
