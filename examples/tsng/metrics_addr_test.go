package tsng

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

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
