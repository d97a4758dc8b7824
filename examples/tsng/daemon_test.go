package tsng

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestCLIAgainstDaemon runs the CLI against a real running agent (one
// node, netstack mode): every mutation, the --json shapes with the engine's
// observation, metrics, and the network-down error, then a restart that
// keeps the configuration.
func TestCLIAgainstDaemon(t *testing.T) {
	p2, _ := testPeer(2)
	cfg := oneNodeConfig(socketDir(t, "tsngd"), p2)
	d := startDaemon(t, cfg)
	f := &apiFixture{t: t, socket: cfg.Socket}
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server2:7443")
	f.must("vip", "port", "add", "home", "api", "udp/53", "--backend", "server1:5353")
	f.must("vip", "backend", "remove", "home", "api", "tcp/443", "server2:7443")
	f.must("vip", "backend", "add", "home", "api", "tcp/443", "server2:7443")
	f.must("vip", "port", "set", "home", "api", "tcp/443", "--check-interval-ms", "1000", "--check-timeout-ms", "500")
	var doc map[string]any
	if err := json.Unmarshal([]byte(f.must("vip", "show", "home", "api", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	st, ok := doc["status"].(map[string]any)
	if !ok || st["listeners"] == nil || doc["revision"] == "" {
		t.Fatalf("show --json lacks the engine's observation: %v", doc)
	}
	out := f.must("vip", "status", "home", "api")
	if !strings.Contains(out, "tcp/443") {
		t.Fatalf("status: %s", out)
	}
	if out := f.must("network", "list"); !strings.Contains(out, "home") || !strings.Contains(out, "up") {
		t.Fatalf("network list: %s", out)
	}
	// Metrics.
	resp, err := http.Get("http://" + d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `tsng_backend_eligible{backend="server1:6443"`) || !strings.Contains(string(body), "tsng_probe_bytes_total") {
		t.Fatalf("metrics:\n%s", body)
	}
	// Network down: reads work, updates say so clearly.
	f.must("network", "down", "home")
	if out := f.must("vip", "show", "home", "api"); !strings.Contains(out, "api.home") {
		t.Fatal("configuration not visible while the network is stopped")
	}
	code, _, errs := f.run(nil, "vip", "port", "remove", "home", "api", "udp/53")
	if code != ExitNetworkDown || !strings.Contains(errs, "stopped on this node") {
		t.Fatalf("update while down: exit %d %q", code, errs)
	}
	f.must("network", "up", "home")
	f.must("vip", "port", "remove", "home", "api", "udp/53")
	if err := json.Unmarshal([]byte(f.must("vip", "show", "home", "api", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	rev := doc["revision"]
	// Restart: the configuration is intact (pebble).
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, cfg)
	defer d.Close()
	if err := json.Unmarshal([]byte(f.must("vip", "show", "home", "api", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["revision"] != rev {
		t.Fatalf("after restart revision %v, want %v", doc["revision"], rev)
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(b))
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}
