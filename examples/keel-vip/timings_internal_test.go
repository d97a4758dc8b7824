package keelvip

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A mesh file that breaks the margin rule starts with a warning naming
// the rule; one that keeps it logs nothing.
func TestWarnTimings(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	warnTimings(log, &Mesh{})
	if buf.Len() != 0 {
		t.Fatalf("defaults warned: %s", buf.String())
	}
	warnTimings(log, &Mesh{RenewInterval: 10 * time.Second, DropAfter: 10500 * time.Millisecond})
	if s := buf.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "start goes on") || !strings.Contains(s, "leave no margin") {
		t.Fatalf("warning %q", s)
	}
}
