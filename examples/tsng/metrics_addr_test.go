package tsng

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/transport/wg"
)

// TestMetricsLoopbackOnly: the metrics listener takes a loopback address
// unless the config says otherwise in so many words.
func TestMetricsLoopbackOnly(t *testing.T) {
	seed := base64.StdEncoding.EncodeToString(make([]byte, 32))
	cfg := func(addr string, any bool) *Config {
		return &Config{DataDir: t.TempDir(), Metrics: addr, MetricsAnyAddress: any,
			Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24",
				Node: NodeConfig{Name: "n1", Address: "100.80.0.1", IdentityKey: seed, WireGuardKey: wg.GeneratePrivateKey()}}}}
	}
	for _, addr := range []string{":9469", "0.0.0.0:9469", "192.0.2.1:9469", "[::]:9469", "example.com:9469", "9469"} {
		err := cfg(addr, false).Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "metrics") {
			t.Errorf("metrics %q: %v, want a config error naming metrics", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:9469", "[::1]:9469", "localhost:9469", "127.0.0.1:0"} {
		if err := cfg(addr, false).Validate(); err != nil {
			t.Errorf("metrics %q: %v", addr, err)
		}
	}
	if err := cfg("0.0.0.0:9469", true).Validate(); err != nil {
		t.Errorf("metrics on every address when configured so: %v", err)
	}
	if err := cfg("example.com:9469", true).Validate(); err == nil {
		t.Error("metrics on a host name: want an IP:port")
	}
}

// TestDaemonMetricsLint: the agent's registry, with a VIP and a running
// control channel, passes client_golang's lint and carries the control
// channel's counters.
func TestDaemonMetricsLint(t *testing.T) {
	d, f := uiDaemon(t)
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	reg := d.metricsRegistry()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tsng_control_refused_total Control connections and frames refused: non-members, a member's connections over the limit, frames over the size limit or past the frame timeout.
# TYPE tsng_control_refused_total counter
tsng_control_refused_total{network="home"} 0
# HELP tsng_vip_routable 1 when the VIP is routed.
# TYPE tsng_vip_routable gauge
tsng_vip_routable{network="home",vip="api"} 1
`), "tsng_control_refused_total", "tsng_vip_routable"); err != nil {
		t.Fatal(err)
	}
}
