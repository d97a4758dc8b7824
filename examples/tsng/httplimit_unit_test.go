package tsng

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestConnLimiterRefusesAtCap: with its cap open, a listener answers the
// next connection 503 and closes it, and counts it; a closed connection
// frees its slot.
func TestConnLimiterRefusesAtCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := defaultHTTPLimits(serverUI)
	lim.maxConns = 2
	l := lim.listen(raw, serverUI)
	defer l.Close()
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	a, b := <-accepted, <-accepted
	defer b.Close()
	c := dial()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("third connection: %v; want a 503", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "too many connections (limit 2)") {
		t.Errorf("third connection: %d %q", resp.StatusCode, body)
	}
	if n := l.refused.Load(); n != 1 {
		t.Errorf("refused %d, want 1", n)
	}
	a.Close()
	a.Close() // a second Close frees nothing more
	dial()
	if c := <-accepted; c == nil {
		t.Fatal("no connection accepted after one closed")
	} else {
		c.Close()
	}
	if open, peak := l.open.Load(), l.peak.Load(); open != 1 || peak != 2 {
		t.Errorf("open %d, peak %d; want 1 and 2", open, peak)
	}
}

// TestRequestPhaseEndsReadTimeout: the read timeout bounds reading the
// request, not the handler: a request that outlives it (as a `vip
// forward` does) keeps its context, while a body that does not arrive in
// time still ends the request.
func TestRequestPhaseEndsReadTimeout(t *testing.T) {
	const rt = time.Second
	lim := defaultHTTPLimits(serverAPI)
	lim.read = rt
	outlived := make(chan error, 1)
	srv := lim.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			outlived <- context.Cause(r.Context())
		case <-time.After(2 * rt):
			outlived <- nil
		}
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /forward HTTP/1.1\r\nHost: tsng\r\nContent-Length: 2\r\n\r\n{}")
	if err := <-outlived; err != nil {
		t.Errorf("the request's context ended after the read timeout, with its body read: %v", err)
	}
	// A body that never arrives is cut at the read timeout.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	io.WriteString(c2, "POST /forward HTTP/1.1\r\nHost: tsng\r\nContent-Length: 2\r\n\r\n{")
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Error("a body short of its length is still awaited 10 s later; want it cut at the read timeout")
	case err == nil && resp.StatusCode != http.StatusBadRequest:
		t.Errorf("a body short of its length: %d; want 400 or a closed connection", resp.StatusCode)
	}
}
