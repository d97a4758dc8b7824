package socks5

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/transporttest"
)

// TestRelayIdle: a relay lasts while bytes flow either way, however long
// it has been open, and ends (ErrIdle, both connections closed) once none
// has for the idle time.
func TestRelayIdle(t *testing.T) {
	const idle = time.Minute
	clk := transporttest.NewManualClock()
	client, a := net.Pipe()
	b, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	done := make(chan error, 1)
	go func() { done <- RelayIdle(a, b, idle, clk) }()
	pass := func(from, to net.Conn, s string) {
		t.Helper()
		go from.Write([]byte(s))
		got := make([]byte, len(s))
		_ = to.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(to, got); err != nil || string(got) != s {
			t.Fatalf("relayed %q: %q, %v", s, got, err)
		}
	}
	pass(client, server, "a")
	clk.Advance(idle - time.Second)
	pass(server, client, "b")
	clk.Advance(idle - time.Second)
	pass(client, server, "c")
	select {
	case err := <-done:
		t.Fatalf("relay ended after bytes flowed within the idle time: %v", err)
	default:
	}
	clk.Advance(idle)
	select {
	case err := <-done:
		if !errors.Is(err, ErrIdle) {
			t.Errorf("relay ended with %v, want ErrIdle", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay still running 10 s after the idle time passed")
	}
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("client side after the idle close: %v, want it closed", err)
	}
}
