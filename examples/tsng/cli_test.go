package tsng

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/vip"
)

// apiFixture serves the local API over a real Unix socket for networks
// held in memory, so that every CLI command runs end to end against it.
type apiFixture struct {
	t      *testing.T
	socket string
	nets   []*Network
	up     map[string]*atomic.Bool
	nodes  []vip.NodeInfo
}

func (f *apiFixture) Networks() []*Network { return f.nets }

func newAPIFixture(t *testing.T) *apiFixture {
	dir := socketDir(t, "tsng")
	f := &apiFixture{t: t, socket: filepath.Join(dir, "api.sock"), up: map[string]*atomic.Bool{}}
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))
	var self vip.NodeID
	copy(self[:], key.Public().(ed25519.PublicKey))
	f.nodes = []vip.NodeInfo{{ID: self, Name: "server1", Addr: netip.MustParseAddr("100.80.0.1")}}
	for i := 2; i <= 3; i++ {
		var id vip.NodeID
		id[0], id[1] = 0xa0, byte(i)
		f.nodes = append(f.nodes, vip.NodeInfo{ID: id, Name: "server" + string(rune('0'+i)), Addr: netip.AddrFrom4([4]byte{100, 80, 0, byte(i)})})
	}
	members := []crdt.AuthorID{crdt.AuthorID(self)}
	for _, n := range []struct{ name, id string }{{"home", "aa11"}, {"lab", "aa22"}} {
		var nid crdt.NetworkID
		copy(nid[:], n.name)
		rep, err := crdt.Open(context.Background(), crdt.Config{Network: nid, Signer: key, Members: members, Obsolete: vip.Obsolete, Check: vip.CheckField, Rank: vip.Rank})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rep.Close() })
		reg, err := vip.NewRegistry(vip.RegistryOptions{Network: n.name, Prefix: netip.MustParsePrefix("100.80.0.0/16"), Replica: rep, Nodes: func() []vip.NodeInfo { return f.nodes }})
		if err != nil {
			t.Fatal(err)
		}
		up := &atomic.Bool{}
		up.Store(true)
		f.up[n.name] = up
		f.nets = append(f.nets, &Network{Name: n.name, ID: n.id + strings.Repeat("0", 28), Registry: reg, Up: up.Load,
			Status: func(vip.ServiceID) any {
				return map[string]any{"to_backend": map[string]any{"packets": 10, "bytes": 1000}}
			}})
	}
	l, err := ListenUnix(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(f.socket)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", st.Mode().Perm())
	}
	srv := &http.Server{Handler: NewAPIServer(f)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return f
}

// run runs the CLI and returns its exit status, stdout and stderr.
func (f *apiFixture) run(env *Env, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	if env == nil {
		env = &Env{}
	}
	env.Stdout, env.Stderr = &out, &errb
	env.Getenv = func(k string) string {
		if k == "TSNG_SOCKET" {
			return f.socket
		}
		return ""
	}
	code := Main(context.Background(), args, env)
	return code, out.String(), errb.String()
}

func (f *apiFixture) must(args ...string) string {
	f.t.Helper()
	code, out, errs := f.run(nil, args...)
	if code != 0 {
		f.t.Fatalf("tsng %s: exit %d: %s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func TestCLIEveryCommand(t *testing.T) {
	f := newAPIFixture(t)
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server2:7443")
	f.must("vip", "port", "add", "home", "api", "udp/53", "--backend", "server1:5353")
	f.must("vip", "backend", "add", "home", "api", "tcp/443", "server3:6443")
	f.must("vip", "backend", "remove", "home", "api", "tcp/443", "server2:7443")
	f.must("vip", "port", "set", "home", "api", "tcp/443", "--port-check", "off")
	f.must("vip", "port", "set", "home", "api", "tcp/443", "--check-interval-ms", "3000", "--check-timeout-ms", "2000", "--failures", "2", "--successes", "1", "--idle-timeout", "7200")

	var doc ServiceDoc
	if err := json.Unmarshal([]byte(f.must("vip", "show", "home", "api", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Name != "api" || doc.Network != "home" || len(doc.Listeners) != 2 || doc.Revision == "" || !doc.Addr.IsValid() || doc.Status == nil {
		t.Fatalf("show --json: %+v", doc)
	}
	l, _ := doc.Listener(vip.PortKey{Proto: vip.TCP, Port: 443})
	if len(l.Backends) != 2 || l.Check.Enabled() || l.IdleTimeout != vip.Duration(7200e9) {
		t.Fatalf("tcp/443 after edits: %+v", l)
	}
	text := f.must("vip", "show", "home", "api")
	if !strings.Contains(text, "api.home") || !strings.Contains(text, "tcp/443") {
		t.Fatalf("show: %s", text)
	}

	// list: one JSON object per service; without a network, every network.
	f.must("vip", "create", "lab", "db")
	lines := strings.Split(strings.TrimSpace(f.must("vip", "list", "--json")), "\n")
	if len(lines) != 2 {
		t.Fatalf("list --json over all networks: %d lines", len(lines))
	}
	for _, ln := range lines {
		var d ServiceDoc
		if err := json.Unmarshal([]byte(ln), &d); err != nil || d.Revision == "" {
			t.Fatalf("list line %q: %v", ln, err)
		}
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(f.must("vip", "list", "home")), "\n")[1:] {
		names = append(names, strings.Fields(line)[1]) // NETWORK NAME ...
	}
	if len(names) != 1 || names[0] != "api" {
		t.Fatalf("list home lists %v, want only api", names)
	}

	// status --watch --json: one object per sample, with rates.
	env := &Env{Sleep: func(context.Context, time.Duration) error { return nil }}
	code, out, errs := f.run(env, "vip", "status", "home", "api", "--watch", "--count", "2", "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errs)
	}
	samples := strings.Split(strings.TrimSpace(out), "\n")
	if len(samples) != 2 {
		t.Fatalf("watch printed %d samples, want 2", len(samples))
	}

	f.must("vip", "port", "remove", "home", "api", "udp/53")
	f.must("vip", "remove", "home", "api", "--yes")
	if code, _, _ := f.run(nil, "vip", "show", "home", "api"); code != ExitNotFound {
		t.Fatalf("show after remove: exit %d, want %d", code, ExitNotFound)
	}
	if out := f.must("completion", "bash"); !strings.Contains(out, "complete -F _tsng tsng") || !strings.Contains(out, "backend") {
		t.Fatalf("completion: %s", out)
	}
}

func TestCLIErrorsAndExitCodes(t *testing.T) {
	f := newAPIFixture(t)
	f.must("vip", "create", "home", "api")
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"vip", "create", "home", "api"}, ExitExists, "already exists"},
		{[]string{"vip", "show", "aa", "api"}, ExitAmbiguous, "candidate: home"},      // network id prefix of both
		{[]string{"vip", "show", "nonet", "api"}, ExitNotFound, "no network matches"}, //
		{[]string{"vip", "port", "add", "home", "api", "tcp/0"}, ExitInvalid, `port "0": want 1-65535`},
		{[]string{"vip", "port", "add", "home", "api", "tcp/443", "--backend", "nobody:1"}, ExitNotFound, "no node matches"},
		{[]string{"vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:0"}, ExitInvalid, "port"},
		{[]string{"vip", "port", "set", "home", "api", "tcp/443", "--port-check", "maybe"}, ExitUsage, "on or off"},
		{[]string{"vip", "port", "set", "home", "api", "tcp/443"}, ExitUsage, "at least one"},
		{[]string{"vip", "port", "set", "home", "api", "tcp/443", "--failures", "3"}, ExitNotFound, "listener tcp/443"},
		{[]string{"vip", "frobnicate"}, ExitUsage, "unknown command"},
		{[]string{"vip", "show", "home"}, ExitUsage, "usage"},
	}
	for _, c := range cases {
		code, _, errs := f.run(nil, c.args...)
		if code != c.code || !strings.Contains(errs, c.msg) {
			t.Errorf("tsng %s: exit %d (%q), want %d with %q", strings.Join(c.args, " "), code, errs, c.code, c.msg)
		}
	}
	// Ambiguous service selector: two services sharing an id prefix.
	seen := map[byte]bool{}
	var prefix string
	for i := 0; prefix == ""; i++ {
		var d ServiceDoc
		if err := json.Unmarshal([]byte(f.must("vip", "create", "home", "s"+strconv.Itoa(i), "--json")), &d); err != nil {
			t.Fatal(err)
		}
		c := d.ID.String()[0]
		if seen[c] {
			prefix = string(c)
		}
		seen[c] = true
	}
	code, _, errs := f.run(nil, "vip", "port", "add", "home", prefix, "tcp/1")
	if code != ExitAmbiguous || strings.Count(errs, "candidate:") < 2 {
		t.Fatalf("ambiguous service selector: exit %d %q", code, errs)
	}
	// Network down: reads work, updates are refused clearly.
	f.up["home"].Store(false)
	if out := f.must("vip", "show", "home", "api"); !strings.Contains(out, "api.home") {
		t.Fatal("saved configuration not visible while the network is stopped")
	}
	code, _, errs = f.run(nil, "vip", "port", "add", "home", "api", "tcp/80")
	if code != ExitNetworkDown || !strings.Contains(errs, "network home is stopped on this node") {
		t.Fatalf("network down: exit %d %q", code, errs)
	}
	f.up["home"].Store(true)
	// Agent unreachable.
	var out, eb bytes.Buffer
	code = Main(context.Background(), []string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "vip", "list"}, &Env{Stdout: &out, Stderr: &eb})
	if code != ExitAgent || !strings.Contains(eb.String(), "agent not reachable") {
		t.Fatalf("no agent: exit %d %q", code, eb.String())
	}
	// --help on every command exits 0 and prints usage.
	for _, args := range [][]string{{"--help"}, {"vip", "--help"}, {"vip", "port", "add", "--help"}, {"vip", "status", "--help"}, {"vip", "edit", "-h"}} {
		code, out, _ := f.run(nil, args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: exit %d %q", args, code, out)
		}
	}
}

func keptPath(t *testing.T, stderr string) string {
	t.Helper()
	i := strings.Index(stderr, "your edit is kept in ")
	if i < 0 {
		t.Fatalf("no kept path in %q", stderr)
	}
	rest := stderr[i+len("your edit is kept in "):]
	return strings.Fields(rest)[0]
}
