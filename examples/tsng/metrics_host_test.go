package tsng

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

// TestMetricsRefuseRebinding plays finding 5 of issue #28: a page on
// attacker.example whose name the attacker rebinds to 127.0.0.1 reads the
// agent's metrics; its requests carry Host: attacker.example. Metrics
// refuse any Host that is not an IP address or localhost, as the editor
// does; with metrics_any_address they accept any IP address, and still no
// other name.
func TestMetricsRefuseRebinding(t *testing.T) {
	for _, anyAddr := range []bool{false, true} {
		t.Run(fmt.Sprintf("metrics_any_address=%v", anyAddr), func(t *testing.T) {
			dir := socketDir(t, "tsngmet")
			peer, _ := testPeer(2)
			cfg := oneNodeConfig(dir, peer)
			cfg.UI = "off"
			cfg.MetricsAnyAddress = anyAddr
			d := startDaemon(t, cfg)
			t.Cleanup(func() { d.Close() })
			reg := d.Runtime("home").Registry()
			ctx := context.Background()
			if _, err := reg.Create(ctx, "payroll"); err != nil {
				t.Fatal(err)
			}
			b, err := reg.ResolveBackend("server1:6443")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := reg.PortAdd(ctx, "payroll", vip.PortKey{Proto: vip.TCP, Port: 443}, []vip.Backend{b}); err != nil {
				t.Fatal(err)
			}
			addr := d.MetricsAddr()
			_, port, _ := net.SplitHostPort(addr)
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			get := func(host string) (int, string) {
				t.Helper()
				req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Host = host
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(body)
			}
			waitFor(t, func() bool {
				code, body := get(addr)
				return code == http.StatusOK && strings.Contains(body, "payroll")
			})
			for _, host := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.1.attacker.example:" + port, "localhost.attacker.example:" + port} {
				code, body := get(host)
				if (code != http.StatusForbidden && code != http.StatusMisdirectedRequest) || strings.Contains(body, "payroll") {
					t.Errorf("Host %s: %d, %d bytes (VIP names: %v); want 403 or 421 and no VIP names", host, code, len(body), strings.Contains(body, "payroll"))
				}
			}
			for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port} {
				if code, body := get(host); code != http.StatusOK || !strings.Contains(body, "payroll") {
					t.Errorf("Host %s: %d; want the metrics", host, code)
				}
			}
			code, _ := get("192.0.2.7:" + port)
			if anyAddr && code != http.StatusOK {
				t.Errorf("metrics_any_address, Host 192.0.2.7: %d; want the metrics for an IP address", code)
			}
			if !anyAddr && code != http.StatusForbidden {
				t.Errorf("loopback metrics, Host 192.0.2.7: %d; want 403", code)
			}
		})
	}
}
