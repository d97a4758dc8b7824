package tsng

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the README's main job and checks that its output shows
// the traffic through the VIP and the failover.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Demo(ctx, &out); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{"DNS api.home → 100.80.0.", "answered by server", "echoed by server1", "failover: new connections to api.home:443 now reach", "status on the client:", "tcp/443"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// The status table has the columns of tsng vip status.
	for _, col := range []string{"LISTENER", "BACKEND", "HEALTH", "RTT", "AGE", "BINDINGS", "PKTS OUT/IN", "BYTES OUT/IN", "DROPS", "FAILOVERS", "NEXT"} {
		if !strings.Contains(s, "  "+col) {
			t.Errorf("demo status lacks the %s column", col)
		}
	}
}
