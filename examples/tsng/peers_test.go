package tsng

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPeerAddRemove: two nodes set up with `init --entry`, each adding
// the other's entry with `peer add`; bad input is refused with the file
// named and the config left byte for byte as it was.
func TestPeerAddRemove(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (int, string) { t.Helper(); return runSocket(missing(t), "", args...) }
	must := func(args ...string) string {
		t.Helper()
		code, out := run(args...)
		if code != ExitOK {
			t.Fatalf("tsng %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}
	cfg := map[string]string{}
	entry := map[string]string{}
	for i, n := range []string{"server1", "client"} {
		cfg[n], entry[n] = filepath.Join(dir, n+".json"), filepath.Join(dir, n+".peer")
		out := must("init", "--network", "home", "--overlay", "100.80.0.0/16", "--address", "100.80.0."+string(rune('1'+i)), "--name", n,
			"--config", cfg[n], "--data-dir", filepath.Join(dir, n), "--socket", filepath.Join(dir, n+".sock"),
			"--endpoint", "192.0.2."+string(rune('1'+i))+":51820", "--entry", entry[n], "--http-proxy", "127.0.0.1:3128")
		if !strings.Contains(out, "tsng peer add home "+entry[n]) {
			t.Fatalf("init --entry should print the peer add line:\n%s", out)
		}
		b, err := os.ReadFile(entry[n])
		if err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfig(cfg[n])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"endpoint": "192.0.2.`) || strings.Contains(string(b), "identity_key") ||
			strings.Contains(string(b), c.Networks[0].Node.WireGuardKey.String()) {
			t.Fatalf("entry file: want the endpoint and no private key: %s", b)
		}
	}
	if code, out := run("init", "--network", "home", "--overlay", "100.80.0.0/16", "--address", "100.80.0.9", "--name", "x",
		"--config", filepath.Join(dir, "x.json"), "--entry", entry["client"]); code == ExitOK || !strings.Contains(out, "exists") {
		t.Fatalf("init over an existing entry: exit %d %q", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.json")); err == nil {
		t.Fatal("init wrote the config although its entry file exists")
	}

	must("peer", "add", "home", entry["client"], "--config", cfg["server1"])
	must("--config", cfg["client"], "peer", "add", "home", entry["server1"])
	for _, n := range []string{"server1", "client"} {
		c, err := LoadConfig(cfg[n])
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Networks[0].Peers) != 1 || c.Networks[0].Peers[0].Endpoint == "" {
			t.Fatalf("%s's peers: %+v", n, c.Networks[0].Peers)
		}
		if fi, _ := os.Stat(cfg[n]); fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v after peer add, want 0600", n, fi.Mode().Perm())
		}
		if n == "client" && c.Networks[0].HTTPProxy != "127.0.0.1:3128" {
			t.Fatalf("init --http-proxy: %q", c.Networks[0].HTTPProxy)
		}
	}
	if out := must("config", "check", cfg["server1"]); !strings.Contains(out, "1 peers") {
		t.Fatalf("config check: %s", out)
	}

	// Refusals: nothing changes.
	before, _ := os.ReadFile(cfg["server1"])
	bad := filepath.Join(dir, "bad.peer")
	os.WriteFile(bad, []byte(`{"name":"n3","address":"100.80.0.3","identity":"x","wireguard_key":"y","endpont":"1.2.3.4:5"}`), 0o644)
	big := filepath.Join(dir, "big.peer")
	os.WriteFile(big, bytes.Repeat([]byte(" "), maxPeerEntry+1), 0o644)
	dupAddr := filepath.Join(dir, "dup.peer")
	b, _ := os.ReadFile(entry["client"])
	os.WriteFile(dupAddr, bytes.Replace(b, []byte(`"client"`), []byte(`"client2"`), 1), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"peer", "add", "home", entry["client"]}, ExitExists, "already has a peer named \"client\""},
		{[]string{"peer", "add", "home", bad}, ExitInvalid, bad},
		{[]string{"peer", "add", "home", big}, ExitInvalid, "more than 65536 bytes"},
		{[]string{"peer", "add", "home", dupAddr}, ExitInvalid, "not changed"},
		{[]string{"peer", "add", "nonet", entry["client"]}, ExitNotFound, "no network \"nonet\""},
		{[]string{"peer", "add", "home", bad, big, "--endpoint", "192.0.2.9:1"}, ExitUsage, "one FILE"},
		{[]string{"peer", "add", "home", entry["client"], "--endpoint", "nope"}, ExitUsage, "want IP:PORT"},
		{[]string{"peer", "remove", "home", "nobody"}, ExitNotFound, "no peer named \"nobody\""},
	} {
		code, out := run(append(c.args, "--config", cfg["server1"])...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("tsng %s: exit %d %q, want %d and %q", strings.Join(c.args, " "), code, out, c.code, c.want)
		}
		if after, _ := os.ReadFile(cfg["server1"]); !bytes.Equal(after, before) {
			t.Fatalf("tsng %s changed the config", strings.Join(c.args, " "))
		}
	}
	must("peer", "remove", "home", "client", "--config", cfg["server1"])
	c, err := LoadConfig(cfg["server1"])
	if err != nil || len(c.Networks[0].Peers) != 0 {
		t.Fatalf("after remove: %+v %v", c, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*")); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
}
