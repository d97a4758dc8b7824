package keelvip

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestRTOMaxCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content *string // nil: no file
		ok      bool
		value   string
	}{
		{"missing", nil, false, rtoMaxMissing},
		{"capped", strPtr("1000\n"), true, "1000"},
		{"below the cap", strPtr("800\n"), true, "800"},
		{"kernel default", strPtr("120000\n"), false, "120000"},
		{"just above", strPtr("1001\n"), false, "1001"},
		{"garbage", strPtr("fast\n"), false, `"fast" (not a number)`},
		{"empty", strPtr(""), false, `"" (not a number)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "sys", "net", "ipv4")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.content != nil {
				if err := os.WriteFile(filepath.Join(dir, "tcp_rto_max_ms"), []byte(*tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			value, ok := checkRTOMax(root)
			if value != tc.value || ok != tc.ok {
				t.Errorf("checkRTOMax = %q, %v; want %q, %v", value, ok, tc.value, tc.ok)
			}

			var buf bytes.Buffer
			warnRTOMax(slog.New(slog.NewTextHandler(&buf, nil)), root)
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			if tc.ok {
				if buf.Len() != 0 {
					t.Errorf("logged %q for a capped setting", buf.String())
				}
				return
			}
			if len(lines) != 1 {
				t.Fatalf("logged %d lines, want one WARN line: %q", len(lines), buf.String())
			}
			for _, want := range []string{"level=WARN", "setting=" + rtoMaxSysctl, "etcd hosts: cap TCP's retransmission backoff"} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("log line %q lacks %q", lines[0], want)
				}
			}
			if wantValue := "value=" + tc.value; !strings.Contains(lines[0], wantValue) && !strings.Contains(lines[0], "value="+strconv.Quote(tc.value)) {
				t.Errorf("log line %q lacks the value %q", lines[0], tc.value)
			}
		})
	}
}

func strPtr(s string) *string { return &s }
