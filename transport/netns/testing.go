//go:build linux

package netns

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/internal/testenv"
)

// The functions ending in T are for tests: they skip the test (or fail it
// under VIPKIT_REQUIRE_ALL=1) without root, fail it on error, and register
// the teardown with t.Cleanup, so that namespaces, links and processes go
// away when the test ends, passed or failed.

var sweepOnce sync.Once

// NewHostT creates a Host named UniqueName(label) for the test and closes it
// at cleanup. The first call in a process also runs Sweep, removing what
// earlier killed runs left behind.
func NewHostT(t testing.TB, label string) *Host {
	t.Helper()
	testenv.NeedRoot(t)
	sweepOnce.Do(func() {
		removed, err := Sweep(context.Background())
		if len(removed) > 0 {
			t.Logf("netns: swept stale namespaces %v", removed)
		}
		if err != nil {
			t.Logf("netns: sweep: %v", err)
		}
	})
	name, err := UniqueName(label)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("netns: close %s: %v", h.name, err)
		}
	})
	// Registered after Close, so it runs first: the host's state when the
	// test failed.
	t.Cleanup(func() {
		if t.Failed() {
			logState(t, h)
		}
	})
	return h
}

// logState logs a host's addresses, routes and neighbours, for a failed
// test, when the ip command is there.
func logState(t testing.TB, h *Host) {
	if _, err := exec.LookPath("ip"); err != nil || h.isClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, argv := range [][]string{
		{"ip", "-d", "addr"},
		{"ip", "route", "show", "table", "all"},
		{"ip", "neigh"},
	} {
		out, err := h.Run(ctx, argv...)
		if err != nil && len(out) == 0 {
			t.Logf("netns: %s: %v", strings.Join(argv, " "), err)
			continue
		}
		t.Logf("netns: state of %s: %s\n%s", h.name, strings.Join(argv, " "), out)
	}
}

// ConnectT connects a and b with Connect and fails t on error. The link goes
// away with either host.
func ConnectT(t testing.TB, a, b *Host, o LinkOptions) *Link {
	t.Helper()
	l, err := Connect(context.Background(), a, b, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// NewSwitchT creates a Switch for the test, closed at cleanup.
func NewSwitchT(t testing.TB, label string) *Switch {
	t.Helper()
	testenv.NeedRoot(t)
	name, err := UniqueName(label)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSwitch(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("netns: close switch %s: %v", s.host.name, err)
		}
	})
	return s
}

// LANT makes a switch and attaches every host to it; it returns the hosts'
// interfaces on the LAN, in order.
func LANT(t testing.TB, hosts ...*Host) (*Switch, []Iface) {
	t.Helper()
	s := NewSwitchT(t, "lan")
	ifs := make([]Iface, len(hosts))
	for i, h := range hosts {
		var err error
		if ifs[i], err = s.Attach(context.Background(), h, PortOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return s, ifs
}

// StartT runs argv in h with Start, logging its output to the test log line
// by line (prefixed with the program and pid), and kills it at cleanup. A
// race detector report in its output fails the test: a -race binary's
// child that races is as much a failure as the test process racing.
func StartT(t testing.TB, h *Host, argv ...string) *Process {
	t.Helper()
	lw := &logWriter{t: t, prefix: fmt.Sprintf("[%s %s] ", h.name, argv[0])}
	p, err := h.Start(context.Background(), argv, ProcOptions{Output: lw})
	if err != nil {
		t.Fatal(err)
	}
	lw.setPrefix(fmt.Sprintf("[%s %s %d] ", h.name, argv[0], p.Pid()))
	t.Cleanup(func() {
		_ = p.Kill()
		lw.close()
	})
	return p
}

// StartChildT runs the registered child function name in h with
// StartChild, logging its output to the test log, and kills it at cleanup.
// As with StartT, a race detector report in its output fails the test.
func StartChildT(t testing.TB, h *Host, name string, args ...string) *Process {
	t.Helper()
	lw := &logWriter{t: t, prefix: fmt.Sprintf("[%s child %s] ", h.name, name)}
	p, err := h.StartChild(context.Background(), name, args, ProcOptions{Output: lw})
	if err != nil {
		t.Fatal(err)
	}
	lw.setPrefix(fmt.Sprintf("[%s child %s %d] ", h.name, name, p.Pid()))
	t.Cleanup(func() {
		_ = p.Kill()
		lw.close()
	})
	return p
}

// logWriter sends whole lines to t.Log and drops output after close (t.Log
// after the test has ended panics). A line with the race detector's
// warning also fails the test.
type logWriter struct {
	// mu guards every field below, and serialises the calls to t, so
	// that lines do not interleave and none is logged after close.
	mu syncx.Mutex
	// +checklocks:mu
	t testing.TB
	// +checklocks:mu
	prefix string
	// +checklocks:mu
	buf []byte
	// +checklocks:mu
	closed bool
}

const raceWarning = "WARNING: DATA RACE"

func (w *logWriter) setPrefix(p string) {
	w.mu.Lock()
	w.prefix = p
	w.mu.Unlock()
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := w.buf[:i]
		w.t.Log(w.prefix + string(line))
		if bytes.Contains(line, []byte(raceWarning)) {
			w.t.Errorf("%sthe race detector reported a data race (above)", w.prefix)
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *logWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 && !w.closed {
		w.t.Log(w.prefix + string(w.buf))
	}
	w.buf = nil
	w.closed = true
}
