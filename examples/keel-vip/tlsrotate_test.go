package keelvip_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

// connTracker dials etcd and can break every connection it made, as a
// network blip or an etcd restart would: etcd's client then dials again,
// with a new TLS handshake.
type connTracker struct {
	mu sync.Mutex
	// +checklocks:mu
	conns []net.Conn
}

func (ct *connTracker) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		ct.mu.Lock()
		ct.conns = append(ct.conns, c)
		ct.mu.Unlock()
	}
	return c, err
}

func (ct *connTracker) breakAll() {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for _, c := range ct.conns {
		c.Close()
	}
	ct.conns = nil
}

func newTrackedClient(t *testing.T, ep string, cfg *tls.Config, ct *connTracker) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(ct.dial)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestEtcdTLSRotation: the controller's etcd client certificate is
// rotated while a lease is renewed every 200 ms. The first certificate
// expires during the run and every connection is broken after that, so
// the client must dial again with the new one; no renewal gap reaches a
// second. A fixed configuration (certificates read once, as before) is
// refused by etcd after the same break. A new CA then takes over, and a
// bundle that no longer holds etcd's CA fails the next handshake: the
// bundle in use is the current one too.
func TestEtcdTLSRotation(t *testing.T) {
	dir := t.TempDir()
	ca, ca2 := newCA(t, "keel etcd ca"), newCA(t, "keel etcd ca 2")
	// etcd trusts clients of both CAs; its own certificate is ca's.
	ep := startTLSEtcdTrusting(t, dir, ca, append(append([]byte{}, ca.pem...), ca2.pem...))
	now := time.Now()
	short := now.Add(4 * time.Second)
	c1, k1 := ca.issue(t, "member-a-1", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), short)
	c2, k2 := ca.issue(t, "member-a-2", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	c3, k3 := ca2.issue(t, "member-a-3", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	bad, badKey := ca.issue(t, "expired", x509.ExtKeyUsageClientAuth, now.Add(-2*time.Hour), now.Add(-time.Hour))
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "member.pem"), filepath.Join(dir, "member-key.pem")
	install := func(caPEM, cert, key []byte) {
		t.Helper()
		for p, b := range map[string][]byte{caFile: caPEM, certFile: cert, keyFile: key} {
			if err := os.WriteFile(p+".new", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(ca.pem, c1, k1)
	e := keelvip.EtcdTLS{CAFile: caFile, CertFile: certFile, KeyFile: keyFile, ServerName: "etcd.test"}
	rot, err := keelvip.NewTLSRotator(e, now)
	if err != nil {
		t.Fatal(err)
	}
	static, err := (&keelvip.Mesh{EtcdTLS: e}).EtcdTLSConfig(now)
	if err != nil {
		t.Fatal(err)
	}
	ct, sct := &connTracker{}, &connTracker{}
	cli := newTrackedClient(t, ep, rot.Config(), ct)
	scli := newTrackedClient(t, ep, static, sct)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gctx, gcancel := context.WithTimeout(ctx, 10*time.Second)
	lease, err := cli.Grant(gctx, 10)
	gcancel()
	if err != nil {
		t.Fatalf("grant with the first certificate: %v", err)
	}
	var mu sync.Mutex
	var last time.Time
	var gap time.Duration
	var fails int
	renewed := func() time.Time { mu.Lock(); defer mu.Unlock(); return last }
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			_, err := cli.KeepAliveOnce(rctx, lease.ID)
			rcancel()
			mu.Lock()
			if err == nil {
				if n := time.Now(); !last.IsZero() && n.Sub(last) > gap {
					gap = n.Sub(last)
				}
				last = time.Now()
			} else if ctx.Err() == nil {
				fails++
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	waitRenewalAfter := func(what string, at time.Time) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !renewed().After(at) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no renewal since %v", what, at.Format(time.RFC3339Nano))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitRenewalAfter("first certificate", now)

	// Refusals leave the current contents in use.
	install(ca.pem, bad, badKey)
	if _, err := rot.Update(e, time.Now()); !errors.Is(err, keelvip.ErrEtcdTLS) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired certificate: %v, want ErrEtcdTLS naming the expiry", err)
	}
	install(ca.pem, c2, k1)
	if _, err := rot.Update(e, time.Now()); !errors.Is(err, keelvip.ErrEtcdTLS) || !strings.Contains(err.Error(), "key_file does not match") {
		t.Errorf("a key of another certificate: %v, want ErrEtcdTLS naming etcd.key_file", err)
	}
	install(nil, c2, k2)
	if _, err := rot.Update(keelvip.EtcdTLS{CertFile: certFile, KeyFile: keyFile, ServerName: "etcd.test"}, time.Now()); err == nil || !strings.Contains(err.Error(), "needs a restart") {
		t.Errorf("dropping the CA bundle: %v, want a refusal naming the restart", err)
	}
	if rot.Subject() != "member-a-1" {
		t.Fatalf("after refusals the subject is %q, want member-a-1", rot.Subject())
	}

	// The rotation: the second certificate, then the first expires and
	// every connection breaks.
	install(ca.pem, c2, k2)
	if changed, err := rot.Update(e, time.Now()); err != nil || !changed {
		t.Fatalf("rotate to the second certificate: %v %v", changed, err)
	}
	if changed, err := rot.Update(e, time.Now()); err != nil || changed {
		t.Fatalf("the same files again: changed %v %v, want no change", changed, err)
	}
	for time.Now().Before(short.Add(500 * time.Millisecond)) {
		time.Sleep(100 * time.Millisecond)
	}
	broke := time.Now()
	ct.breakAll()
	sct.breakAll()
	waitRenewalAfter("after the break, with the second certificate", broke)
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	_, serr := scli.Put(pctx, "/keel/tls", "static")
	pcancel()
	if serr == nil {
		t.Errorf("a configuration read once still reached etcd after its certificate expired and the connection broke")
	}

	// A new CA: the bundle holds both, the certificate is ca2's.
	install(append(append([]byte{}, ca.pem...), ca2.pem...), c3, k3)
	if _, err := rot.Update(e, time.Now()); err != nil {
		t.Fatalf("rotate to the new CA: %v", err)
	}
	broke = time.Now()
	ct.breakAll()
	waitRenewalAfter("after the break, with the new CA's certificate", broke)

	mu.Lock()
	g, f := gap, fails
	mu.Unlock()
	if g > 2*time.Second {
		t.Errorf("longest gap between renewals %v, want under 2 s (the lease TTL is 10 s)", g)
	}
	t.Logf("longest gap between answered renewals %v, %d renewal calls failed across two forced reconnects", g, f)

	// A bundle without etcd's CA: the next handshake fails, so the bundle
	// in use is the current one.
	install(ca2.pem, c3, k3)
	if _, err := rot.Update(e, time.Now()); err != nil {
		t.Fatalf("the new CA alone: %v", err)
	}
	cancel()
	<-done
	ct.breakAll()
	vctx, vcancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err = cli.Put(vctx, "/keel/tls", "unverified")
	vcancel()
	if err == nil {
		t.Errorf("etcd's server certificate was accepted by a bundle without its CA")
	}
}

// TestEtcdTLSWatchFiles: the helper reads the files every interval and
// on SIGHUP, hands over each new content once, never again what the
// controller refused, and retries what it could not hand over.
func TestEtcdTLSWatchFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	now := time.Now()
	c1, k1 := ca.issue(t, "one", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	c2, k2 := ca.issue(t, "two", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	e := keelvip.EtcdTLS{CAFile: writeFile(t, dir, "ca.pem", ca.pem), CertFile: writeFile(t, dir, "c.pem", c1), KeyFile: writeFile(t, dir, "k.pem", k1)}
	pushes := make(chan keelvip.TLSPush, 16)
	answered := make(chan int, 16) // the answer each push got, in order
	var mu sync.Mutex
	answer := 0
	var logs bytes.Buffer
	var lmu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&lmu, &logs}, nil))
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		keelvip.WatchTLSFiles(ctx, e, time.Hour, hup, func(p keelvip.TLSPush) int {
			mu.Lock()
			defer mu.Unlock()
			pushes <- p
			answered <- answer
			return answer
		}, log)
	}()
	defer func() { cancel(); <-done }()
	next := func(what string) keelvip.TLSPush {
		t.Helper()
		select {
		case p := <-pushes:
			<-answered
			return p
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no push", what)
		}
		return keelvip.TLSPush{}
	}
	none := func(what string) {
		t.Helper()
		// The channel holds one signal: the third send waits until the
		// watch took the second, so the first read has finished.
		for range 3 {
			hup <- syscall.SIGHUP
		}
		select {
		case p := <-pushes:
			t.Fatalf("%s: pushed %q again", what, p.Cert[:40])
		default:
		}
	}
	hup <- syscall.SIGHUP
	if p := next("first read"); p.Cert != string(c1) || p.Key != string(k1) || p.CA != string(ca.pem) {
		t.Fatal("first push: not the files' contents")
	}
	none("unchanged files")
	// A refusal is not sent again until the files change.
	mu.Lock()
	answer = 400
	mu.Unlock()
	writeFile(t, dir, "c.pem", c2)
	hup <- syscall.SIGHUP
	next("a change the controller refuses")
	none("refused files")
	lmu.Lock()
	logged := logs.String()
	lmu.Unlock()
	if !strings.Contains(logged, "refused the new files") {
		t.Errorf("the refusal is not logged: %s", logged)
	}
	// A failure to hand over is retried.
	mu.Lock()
	answer = 503
	mu.Unlock()
	writeFile(t, dir, "k.pem", k2)
	hup <- syscall.SIGHUP
	next("a change the controller cannot take now")
	mu.Lock()
	answer = 0
	mu.Unlock()
	// The last SIGHUP of none() may still be queued when the key file is
	// written, and then its read hands the new files over too: a push may
	// come more than once before one is taken. Ask until one is.
	for taken := false; !taken; {
		select {
		case hup <- syscall.SIGHUP:
		default: // one is queued already
		}
		var p keelvip.TLSPush
		var got int
		select {
		case p = <-pushes:
			got = <-answered
		case <-time.After(10 * time.Second):
			t.Fatal("the retry: no push")
		}
		if p.Cert != string(c2) || p.Key != string(k2) {
			t.Fatal("the retry did not carry the new files")
		}
		taken = got == 0
	}
	none("taken files")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestEtcdTLSHandOver: the helper's watch and the controller's endpoint
// over HTTP, as over control.sock: rotated files are in use after one
// SIGHUP; files the controller refuses (an expired certificate) leave
// the current ones in use, are counted, and are not sent again.
func TestEtcdTLSHandOver(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	now := time.Now()
	c1, k1 := ca.issue(t, "one", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	c2, k2 := ca.issue(t, "two", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	ce, ke := ca.issue(t, "expired", x509.ExtKeyUsageClientAuth, now.Add(-2*time.Hour), now.Add(-time.Hour))
	e := keelvip.EtcdTLS{CAFile: writeFile(t, dir, "ca.pem", ca.pem), CertFile: writeFile(t, dir, "c.pem", c1), KeyFile: writeFile(t, dir, "k.pem", k1)}
	rot, err := keelvip.NewTLSRotator(e, now)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var lmu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&lmu, &logs}, nil))
	h, taken, refused := keelvip.TLSEndpoint(rot, log)
	srv := httptest.NewServer(h)
	defer srv.Close()
	hup := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		keelvip.WatchTLSFilesHTTP(ctx, e, time.Hour, hup, srv.Client(), srv.URL, log)
	}()
	defer func() { cancel(); <-done }()
	settle := func() {
		for range 3 { // the third send waits until the second was taken
			hup <- syscall.SIGHUP
		}
	}
	writeFile(t, dir, "c.pem", c2)
	writeFile(t, dir, "k.pem", k2)
	settle()
	if rot.Subject() != "two" || taken() != 1 {
		// taken counts changes; a half-rotated read is refused, not taken.
		t.Fatalf("after the rotation: subject %q, %d taken, want two and 1", rot.Subject(), taken())
	}
	writeFile(t, dir, "c.pem", ce)
	writeFile(t, dir, "k.pem", ke)
	settle()
	// A read between the two writes sees a half-rotated pair, refused
	// too; what counts is that refused contents are not sent again.
	r := refused()
	settle()
	if rot.Subject() != "two" || r < 1 || refused() != r {
		t.Fatalf("after expired files: subject %q, refused %d then %d, want two, at least 1, and no resend", rot.Subject(), r, refused())
	}
	lmu.Lock()
	logged := logs.String()
	lmu.Unlock()
	if !strings.Contains(logged, "expired") || !strings.Contains(logged, "keeps the current ones") {
		t.Errorf("the refusal is not logged with its reason:\n%s", logged)
	}
}
