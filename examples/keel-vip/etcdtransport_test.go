package keelvip_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// TestEtcdStreamReadTimeoutNotApplied pins the etcd defect that the
// README's etcd hosts' setting (net.ipv4.tcp_rto_max_ms) works around:
// rafthttp builds its peer stream transport with NewTimeoutTransport and
// a 5 s read timeout, but that transport never applies it (it sets the
// deprecated http.Transport.Dial, which net/http ignores when DialContext
// is set), so a silent stream is never given up. Here a server sends the
// response headers and then nothing for 2 s; a 100 ms read timeout
// should end the body read at once. When this test fails, etcd applies
// the timeout, and the setting and rtoMaxMs in the tests can go.
func TestEtcdStreamReadTimeoutNotApplied(t *testing.T) {
	const silence, timeout = 2 * time.Second, 100 * time.Millisecond
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(silence):
		}
	}))
	defer srv.Close()
	defer close(release)
	tr, err := transport.NewTimeoutTransport(transport.TLSInfo{}, time.Second, timeout, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		errc <- err
	}()
	select {
	case err := <-errc:
		t.Fatalf("the body read ended while the server was silent (%v): etcd's timeout transport applies its read timeout; drop the tcp_rto_max_ms workaround", err)
	case <-time.After(10 * timeout):
		t.Logf("no read timeout after %v of silence (set: %v): etcd's peer streams keep silent connections", 10*timeout, timeout)
	}
}
