//go:build linux

package netns

import (
	"fmt"
	"strings"
	"testing"
)

// recordTB records what logWriter sends to the test.
type recordTB struct {
	testing.TB
	logs, errs []string
}

func (r *recordTB) Helper()                   {}
func (r *recordTB) Log(args ...any)           { r.logs = append(r.logs, fmt.Sprint(args...)) }
func (r *recordTB) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }

func TestLogWriterFailsOnChildRace(t *testing.T) {
	r := &recordTB{TB: t}
	w := &logWriter{t: r, prefix: "[x child y 7] "}
	fmt.Fprint(w, "starting\n==================\nWARNING: DATA")
	if len(r.errs) != 0 || len(r.logs) != 2 {
		t.Fatalf("before the warning: logs %q errors %q", r.logs, r.errs)
	}
	fmt.Fprint(w, " RACE\nWrite at 0x00c0001f0a68 by goroutine 147:\n")
	if len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], "[x child y 7] ") || len(r.logs) != 4 {
		t.Fatalf("after the warning: logs %q errors %q", r.logs, r.errs)
	}
	w.close()
	fmt.Fprint(w, "WARNING: DATA RACE\n") // after close: dropped
	if len(r.errs) != 1 || len(r.logs) != 4 {
		t.Fatalf("after close: logs %q errors %q", r.logs, r.errs)
	}
}
