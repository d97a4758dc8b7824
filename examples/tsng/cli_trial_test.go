package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// trialEnv runs the CLI against socket with a cache directory of its own.
type trialEnv struct {
	t      *testing.T
	socket string
	cache  string
}

func newTrial(t *testing.T) (*Daemon, *trialEnv) {
	d, f := uiDaemon(t)
	return d, &trialEnv{t: t, socket: f.socket, cache: t.TempDir()}
}

func (e *trialEnv) run(env *Env, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	if env == nil {
		env = &Env{}
	}
	env.Stdout, env.Stderr = &out, &errb
	env.Getenv = func(k string) string {
		switch k {
		case "TSNG_SOCKET":
			return e.socket
		case "XDG_CACHE_HOME":
			return e.cache
		}
		return ""
	}
	code := Main(context.Background(), args, env)
	return code, out.String(), errb.String()
}

func (e *trialEnv) must(args ...string) string {
	e.t.Helper()
	code, out, errs := e.run(nil, args...)
	if code != 0 {
		e.t.Fatalf("tsng %s: exit %d: %s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// TestCLIStatusTable: `vip status` prints a table (the demo's columns),
// not JSON; --json still prints the JSON sample.
func TestCLIStatusTable(t *testing.T) {
	_, e := newTrial(t)
	e.must("vip", "create", "home", "api")
	e.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server2:7443")
	out := e.must("vip", "status", "home", "api")
	if strings.Contains(out, "{") || strings.Count(out, "\n") > 12 {
		t.Errorf("status without --json prints JSON or too much:\n%s", out)
	}
	for _, want := range []string{"LISTENER", "BACKEND", "HEALTH", "RTT", "BINDINGS", "NEXT", "tcp/443", "server1:6443", "server2:7443"} {
		if !strings.Contains(out, want) {
			t.Errorf("status: no %q in\n%s", want, out)
		}
	}
	var s Sample
	if err := json.Unmarshal([]byte(e.must("vip", "status", "home", "api", "--json")), &s); err != nil || s.Status == nil {
		t.Errorf("status --json: %v", err)
	}
}

// TestCLIShowNames: `vip show` names backends by node; --json keeps ids.
func TestCLIShowNames(t *testing.T) {
	d, e := newTrial(t)
	e.must("vip", "create", "home", "api")
	e.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server2:7443")
	out := e.must("vip", "show", "home", "api")
	if !strings.Contains(out, "server2:7443") {
		t.Errorf("show: no server2:7443 in\n%s", out)
	}
	id := nodeID(d.Runtime("home").Registry(), "server2")
	if strings.Contains(out, id) {
		t.Errorf("show prints the node id %s:\n%s", id, out)
	}
	if js := e.must("vip", "show", "home", "api", "--json"); !strings.Contains(js, id) {
		t.Errorf("show --json lacks the node id:\n%s", js)
	}
}

// TestCLIListStopped: `vip list` does not call a stopped network's VIPs
// routed.
func TestCLIListStopped(t *testing.T) {
	_, e := newTrial(t)
	e.must("vip", "create", "home", "api")
	if out := e.must("vip", "list", "home"); !strings.Contains(out, "routed") {
		t.Fatalf("list while up:\n%s", out)
	}
	e.must("network", "down", "home")
	out := e.must("vip", "list", "home")
	if strings.Contains(out, " routed") || !strings.Contains(out, "network down") {
		t.Errorf("list of a stopped network:\n%s", out)
	}
}

// TestCLIExplicitZero: --failures 0 and --idle-timeout 0 are given, so
// they are refused with the range they are outside of, not taken as
// "flag not given".
func TestCLIExplicitZero(t *testing.T) {
	_, e := newTrial(t)
	e.must("vip", "create", "home", "api")
	e.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	for _, c := range []struct{ flag, want string }{
		{"--failures", "--failures 0: want 1-"},
		{"--successes", "--successes 0: want 1-"},
		{"--idle-timeout", "--idle-timeout 0: want 1-"},
		{"--check-interval-ms", "--check-interval-ms 0: want 250-"},
		{"--check-timeout-ms", "--check-timeout-ms 0: want 10-"},
	} {
		code, _, errs := e.run(nil, "vip", "port", "set", "home", "api", "tcp/443", c.flag, "0")
		if code != ExitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("%s 0: exit %d %q, want %q", c.flag, code, errs, c.want)
		}
	}
	// A non-zero value next to an explicit zero changes nothing either.
	before := e.must("vip", "show", "home", "api", "--json")
	e.run(nil, "vip", "port", "set", "home", "api", "tcp/443", "--failures", "3", "--idle-timeout", "0")
	if after := e.must("vip", "show", "home", "api", "--json"); after != before {
		t.Error("a refused port set changed the listener")
	}
}

// TestCLIEditNames: the edit file names the nodes, and a node name typed
// into a backend is accepted.
func TestCLIEditNames(t *testing.T) {
	d, e := newTrial(t)
	reg := d.Runtime("home").Registry()
	e.must("vip", "create", "home", "api")
	e.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	var seen string
	env := &Env{RunEditor: func(_ context.Context, p string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		seen = string(b)
		s := strings.Replace(seen, `"node": "server1"`, `"node": "server2"`, 1)
		return os.WriteFile(p, []byte(s), 0o600)
	}}
	code, out, errs := e.run(env, "vip", "edit", "home", "api")
	if code != 0 {
		t.Fatalf("edit with a node name: exit %d %s%s\nfile:\n%s", code, out, errs, seen)
	}
	if !strings.Contains(seen, "server1 = "+nodeID(reg, "server1")) {
		t.Errorf("the edit file does not name the nodes:\n%s", seen)
	}
	v, err := reg.Get("api")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Listeners) != 1 || len(v.Listeners[0].Backends) != 1 || v.Listeners[0].Backends[0].Node.String() != nodeID(reg, "server2") {
		t.Fatalf("edit saved %+v", v.Listeners)
	}
	// An unknown name is refused with its line, and nothing changes.
	env.RunEditor = func(_ context.Context, p string) error {
		b, _ := os.ReadFile(p)
		return os.WriteFile(p, []byte(strings.Replace(string(b), `"node": "server2"`, `"node": "nosuch"`, 1)), 0o600)
	}
	code, _, errs = e.run(env, "vip", "edit", "home", "api")
	if code != ExitInvalid || !strings.Contains(errs, `backend node "nosuch"`) || !regexp.MustCompile(`line \d+`).MatchString(errs) {
		t.Fatalf("unknown node: exit %d %q", code, errs)
	}
}

// TestCLIEditKeptFile: invalid JSON is reported with its line and column,
// and running the edit again reopens the kept file, not a fresh copy.
func TestCLIEditKeptFile(t *testing.T) {
	_, e := newTrial(t)
	e.must("vip", "create", "home", "api")
	var paths []string
	var contents []string
	editor := func(edit func(string) string) *Env {
		return &Env{RunEditor: func(_ context.Context, p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			paths, contents = append(paths, p), append(contents, string(b))
			return os.WriteFile(p, []byte(edit(string(b))), 0o600)
		}}
	}
	// Break the JSON on line 3: a missing comma.
	code, _, errs := e.run(editor(func(s string) string {
		lines := strings.Split(s, "\n")
		lines[2] = strings.TrimSuffix(lines[2], ",") + ` "oops": 1`
		return strings.Join(lines, "\n")
	}), "vip", "edit", "home", "api")
	if code != ExitInvalid || !regexp.MustCompile(`line 3, column \d+`).MatchString(errs) {
		t.Fatalf("invalid edit: exit %d %q, want the line and column", code, errs)
	}
	if strings.Contains(errs, "tsng: tsng:") {
		t.Errorf("repeated prefix: %q", errs)
	}
	kept := paths[0]
	if !strings.Contains(errs, kept) {
		t.Fatalf("the kept file %s is not named: %q", kept, errs)
	}
	if fi, err := os.Stat(kept); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept file: %v %v", fi, err)
	}
	// Again: the editor opens the kept file, with the broken edit in it.
	code, _, errs = e.run(editor(func(s string) string { return strings.Replace(s, ` "oops": 1`, ",", 1) }), "vip", "edit", "home", "api")
	if paths[1] != kept || !strings.Contains(contents[1], `"oops"`) {
		t.Fatalf("the second edit opened %s with\n%s\nwant the kept %s", paths[1], contents[1], kept)
	}
	if code != 0 {
		t.Fatalf("fixed edit: exit %d %q", code, errs)
	}
	if _, err := os.Stat(kept); err == nil {
		t.Error("the kept file stays after a successful save")
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (master, slave *os.File) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(filepath.Join("/dev/pts", strconv.Itoa(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// TestCLIRemoveAsks: on a terminal, `vip remove` asks; no keeps the VIP,
// yes removes it; --yes skips the question.
func TestCLIRemoveAsks(t *testing.T) {
	d, e := newTrial(t)
	reg := d.Runtime("home").Registry()
	e.must("vip", "create", "home", "api")
	e.must("vip", "create", "home", "web")
	master, slave := openPTY(t)
	master.Write([]byte("n\n"))
	code, _, errs := e.run(&Env{Stdin: slave}, "vip", "remove", "home", "api")
	if _, err := reg.Get("api"); err != nil || code == 0 || !strings.Contains(errs, "permanent") {
		t.Fatalf("answered no: exit %d %q, err %v", code, errs, err)
	}
	master.Write([]byte("y\n"))
	if code, _, errs := e.run(&Env{Stdin: slave}, "vip", "remove", "home", "api"); code != 0 {
		t.Fatalf("answered yes: exit %d %q", code, errs)
	}
	if _, err := reg.Get("api"); err == nil {
		t.Fatal("api still there after yes")
	}
	if code, _, errs := e.run(&Env{Stdin: slave}, "vip", "remove", "home", "web", "--yes"); code != 0 {
		t.Fatalf("--yes: exit %d %q", code, errs)
	}
	if _, err := reg.Get("web"); err == nil {
		t.Fatal("web still there after --yes")
	}
}

// TestHelpNamesSocket: --help says how the CLI finds the agent.
func TestHelpNamesSocket(t *testing.T) {
	_, e := newTrial(t)
	out := e.must("--help")
	for _, want := range []string{"--socket PATH", "TSNG_SOCKET", "keygen", "init", "config", "version"} {
		if !strings.Contains(out, want) {
			t.Errorf("tsng --help lacks %q:\n%s", want, out)
		}
	}
}

// TestCLIStatusWatchTable: --watch prints one table per sample, with the
// byte rates from the second sample on.
func TestCLIStatusWatchTable(t *testing.T) {
	_, e := newTrial(t)
	e.must("vip", "create", "home", "api")
	e.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	env := &Env{Sleep: func(context.Context, time.Duration) error { return nil }}
	code, out, errs := e.run(env, "vip", "status", "home", "api", "--watch", "--count", "2")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	if strings.Count(out, "LISTENER") != 2 || strings.Count(out, "BYTES/S OUT/IN") != 1 || strings.Contains(out, "{") {
		t.Fatalf("watch output:\n%s", out)
	}
}
