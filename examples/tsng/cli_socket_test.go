package tsng

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// secretKey stands for the private keys a config file holds: the CLI
// reads only the socket field and must never print the rest.
const secretKey = "c2VjcmV0LXByaXZhdGUta2V5LW11c3Qtbm90LWxlYWsxMjM="

// writeSocketConfig writes a config file naming socket, with key
// material beside it, mode 0600, and returns its path.
func writeSocketConfig(t *testing.T, socket string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tsng.json")
	body := `{"data_dir": "/var/lib/tsng", "socket": "` + socket + `",
  "networks": [{"name": "home", "overlay": "100.80.0.0/16",
    "node": {"name": "n1", "address": "100.80.0.1", "identity_key": "` + secretKey + `", "wireguard_key": "` + secretKey + `"}}]}`
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runSocket runs the CLI with TSNG_SOCKET set to envSocket (empty: unset)
// and defaultConfig as the default config path.
func runSocket(defaultConfig, envSocket string, args ...string) (int, string) {
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb, DefaultConfig: defaultConfig, Getenv: func(k string) string {
		if k == "TSNG_SOCKET" {
			return envSocket
		}
		return ""
	}}
	code := Main(context.Background(), args, env)
	return code, out.String() + errb.String()
}

// TestCLISocketFromConfig: the CLI finds the agent's socket from --socket,
// then TSNG_SOCKET, then the config's socket field (--config, else the
// default config file), then DefaultSocket.
func TestCLISocketFromConfig(t *testing.T) {
	f := newAPIFixture(t)
	dead := filepath.Join(t.TempDir(), "dead.sock")
	good := writeSocketConfig(t, f.socket)
	bad := writeSocketConfig(t, dead)
	missing := filepath.Join(t.TempDir(), "absent.json")
	cases := []struct {
		name          string
		defaultConfig string
		envSocket     string
		args          []string
		ok            bool   // else the agent is unreachable at want
		want          string // the socket named when unreachable
	}{
		{"--config names the socket", missing, "", []string{"--config", good, "vip", "list"}, true, ""},
		{"--config=FILE", missing, "", []string{"--config=" + good, "vip", "list"}, true, ""},
		{"the default config names the socket", good, "", []string{"vip", "list"}, true, ""},
		{"--config beats the default config", good, "", []string{"--config", bad, "vip", "list"}, false, dead},
		{"TSNG_SOCKET beats the config", bad, f.socket, []string{"vip", "list"}, true, ""},
		{"TSNG_SOCKET beats --config", missing, dead, []string{"--config", good, "vip", "list"}, false, dead},
		{"--socket beats TSNG_SOCKET and the config", bad, dead, []string{"--socket", f.socket, "vip", "list"}, true, ""},
		{"--socket after --config", bad, dead, []string{"--config", bad, "--socket", f.socket, "vip", "list"}, true, ""},
		{"no config: the default socket", missing, "", []string{"vip", "list"}, false, DefaultSocket},
	}
	for _, c := range cases {
		code, out := runSocket(c.defaultConfig, c.envSocket, c.args...)
		if c.ok && code != ExitOK || !c.ok && (code != ExitAgent || !strings.Contains(out, "agent not reachable at "+c.want+":")) {
			t.Errorf("%s: exit %d %q; want ok=%v (else unreachable at %s)", c.name, code, out, c.ok, c.want)
		}
		if strings.Contains(out, "cannot read") {
			t.Errorf("%s: a note on a readable or absent config: %q", c.name, out)
		}
	}
	// --config is not a command of its own.
	if code, out := runSocket(missing, "", "--config"); code != ExitUsage || !strings.Contains(out, "--config needs a file") {
		t.Errorf("--config alone: exit %d %q", code, out)
	}
}

// TestCLISocketConfigUnreadable: a config file the CLI cannot read or
// parse is named on stderr, with the default socket used instead, and no
// key material is printed.
func TestCLISocketConfigUnreadable(t *testing.T) {
	f := newAPIFixture(t)
	dir := t.TempDir() // a directory: open succeeds, read fails (the test may run as root)
	broken := filepath.Join(t.TempDir(), "broken.json")
	os.WriteFile(broken, []byte(`{"networks": [{"node": {"wireguard_key": "`+secretKey+`" "socket": 1}`), 0o600)
	notString := filepath.Join(t.TempDir(), "num.json")
	os.WriteFile(notString, []byte(`{"socket": 42, "node": {"wireguard_key": "`+secretKey+`"}}`), 0o600)
	for _, c := range []struct{ name, path, why string }{
		{"unreadable", dir, "cannot read " + dir},
		{"not JSON", broken, "cannot read the socket from " + broken},
		{"socket not a string", notString, "cannot read the socket from " + notString},
	} {
		code, out := runSocket(missing(t), "", "--config", c.path, "vip", "list")
		if code != ExitAgent || !strings.Contains(out, c.why) || !strings.Contains(out, "agent not reachable at "+DefaultSocket) {
			t.Errorf("%s: exit %d %q, want %q and the default socket", c.name, code, out, c.why)
		}
		if strings.Contains(out, secretKey) || strings.Contains(out, secretKey[:8]) {
			t.Errorf("%s: key material printed: %q", c.name, out)
		}
		// As the default config too; TSNG_SOCKET then skips the file.
		code, out = runSocket(c.path, "", "vip", "list")
		if code != ExitAgent || !strings.Contains(out, c.why) {
			t.Errorf("%s as the default config: exit %d %q", c.name, code, out)
		}
		if code, out := runSocket(c.path, f.socket, "vip", "list"); code != ExitOK || strings.Contains(out, "cannot read") {
			t.Errorf("%s with TSNG_SOCKET: exit %d %q", c.name, code, out)
		}
	}
	// Commands that do not talk to the agent say nothing of it.
	if code, out := runSocket(dir, "", "version"); code != ExitOK || strings.Contains(out, "cannot read") {
		t.Errorf("version with an unreadable config: exit %d %q", code, out)
	}
}

func missing(t *testing.T) string { return filepath.Join(t.TempDir(), "absent.json") }

// TestCLIInitThenList: the steps. After `tsng init --socket S`
// writes the default config, `tsng vip list` reaches the agent on S with
// neither --socket nor TSNG_SOCKET; a global --config reaches `init` and
// `daemon` as their config file.
func TestCLIInitThenList(t *testing.T) {
	f := newAPIFixture(t)
	cfg := filepath.Join(t.TempDir(), "etc", "tsng.json")
	code, out := runSocket(cfg, "", "init", "--network", "home", "--overlay", "100.80.0.0/16", "--address", "100.80.0.9",
		"--name", "n9", "--data-dir", t.TempDir(), "--socket", f.socket, "--config", cfg)
	if code != ExitOK {
		t.Fatalf("init: exit %d %q", code, out)
	}
	if code, out := runSocket(cfg, "", "vip", "list"); code != ExitOK || !strings.Contains(out, "NETWORK") {
		t.Fatalf("vip list after init --socket: exit %d %q", code, out)
	}
	other := filepath.Join(t.TempDir(), "other.json")
	code, out = runSocket(missing(t), "", "--config", other, "init", "--network", "home", "--overlay", "100.80.0.0/16",
		"--address", "100.80.0.9", "--name", "n9", "--data-dir", t.TempDir(), "--socket", f.socket)
	if _, err := os.Stat(other); code != ExitOK || err != nil {
		t.Fatalf("init with the global --config: exit %d %q, %v", code, out, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"daemon"}, DefaultConfig},
		{[]string{"--config", other, "daemon"}, other},
		{[]string{"--config", other, "daemon", "--config", cfg}, cfg},
	} {
		var got string
		env := &Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" },
			Daemon: func(_ context.Context, path string) error { got = path; return nil }}
		if code := Main(context.Background(), c.args, env); code != ExitOK || got != c.want {
			t.Errorf("tsng %s: exit %d, daemon config %q, want %q", strings.Join(c.args, " "), code, got, c.want)
		}
	}
}
