package keelvip

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"os"
	"time"
)

// Hooks for the external tests of the etcd TLS rotation.

// TLSRotator is the controller's rotating etcd TLS, for tests.
type TLSRotator struct{ r *etcdTLSRotator }

// NewTLSRotator checks e's contents (files read as the controller does).
func NewTLSRotator(e EtcdTLS, now time.Time) (TLSRotator, error) {
	e, err := e.load()
	if err != nil {
		return TLSRotator{}, err
	}
	r, err := newEtcdTLSRotator(e, now)
	return TLSRotator{r}, err
}

// Config is the rotating client configuration.
func (t TLSRotator) Config() *tls.Config { return t.r.config() }

// Update makes e's files current, as the controller's endpoint does.
func (t TLSRotator) Update(e EtcdTLS, now time.Time) (bool, error) {
	e, err := e.load()
	if err != nil {
		return false, err
	}
	return t.r.update(e, now)
}

// Subject is the client certificate's common name in use.
func (t TLSRotator) Subject() string { s, _ := t.r.current(); return s }

// TLSPush is the helper's hand-over of new files, for tests.
type TLSPush struct{ CA, Cert, Key string }

// WatchTLSFiles runs the helper's file watch with push; a push returns
// status 0 for success, or an HTTP status for a refusal.
func WatchTLSFiles(ctx context.Context, e EtcdTLS, every time.Duration, hup <-chan os.Signal, push func(TLSPush) int, log *slog.Logger) {
	watchEtcdTLS(ctx, e, every, hup, func(_ context.Context, req etcdTLSRequest) (etcdTLSReply, error) {
		if code := push(TLSPush{req.CAPEM, req.CertPEM, req.KeyPEM}); code != 0 {
			return etcdTLSReply{}, &callError{url: "http://control" + etcdTLSPath, status: code, msg: "refused"}
		}
		return etcdTLSReply{Changed: true}, nil
	}, log)
}

// TLSEndpoint is the controller's etcd TLS endpoint over t, for tests,
// with its counts of taken and refused hand-overs.
func TLSEndpoint(t TLSRotator, log *slog.Logger) (h http.Handler, taken, refused func() uint64) {
	c := new(tlsReloads)
	return serveEtcdTLS(t.r, c, log), c.ok.Load, c.refused.Load
}

// WatchTLSFilesHTTP runs the helper's file watch handing over to the
// endpoint at base (http://host), as the helper does over control.sock.
func WatchTLSFilesHTTP(ctx context.Context, e EtcdTLS, every time.Duration, hup <-chan os.Signal, hc *http.Client, base string, log *slog.Logger) {
	watchEtcdTLS(ctx, e, every, hup, func(ctx context.Context, req etcdTLSRequest) (etcdTLSReply, error) {
		return pushTLS(ctx, hc, base, req)
	}, log)
}
