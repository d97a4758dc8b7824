package keelvip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/internal/jsonx"
)

// etcdTLSPath is the controller's endpoint on control.sock (root, the
// helper, only) that takes new etcd TLS contents.
const etcdTLSPath = "/etcd-tls"

// maxTLSBody bounds an etcd TLS request: three files of at most 1 MiB
// each (EtcdTLS.load's limit), as JSON strings.
const maxTLSBody = 7 << 20

// Etcd TLS rotation timings (docs/defaults.md).
const (
	// tlsPollInterval is how often the helper reads the certificate
	// files for a change; SIGHUP reads them at once.
	tlsPollInterval = 10 * time.Second
	// certWarnBefore is how long before its expiry the client
	// certificate is warned about, in the log, status and metrics.
	certWarnBefore = 14 * 24 * time.Hour
	// certLogEvery is how often the controller repeats that warning,
	// or the error for an expired certificate.
	certLogEvery = time.Hour
)

// etcdTLSRequest carries new etcd TLS contents to the controller.
type etcdTLSRequest struct {
	CAPEM   string `json:"ca_pem,omitempty"`
	CertPEM string `json:"cert_pem,omitempty"`
	KeyPEM  string `json:"key_pem,omitempty"`
}

// etcdTLSReply is the controller's answer to an etcdTLSRequest it took.
type etcdTLSReply struct {
	Changed  bool   `json:"changed"`
	Subject  string `json:"subject,omitempty"`
	NotAfter string `json:"not_after,omitempty"` // RFC 3339, UTC
}

// tlsReloads counts the controller's etcd TLS updates.
type tlsReloads struct {
	ok      atomic.Uint64
	refused atomic.Uint64
}

// certState describes the client certificate as of now: "" without one,
// else "ok", "expiring" (within certWarnBefore) or "expired".
func certState(notAfter, now time.Time) string {
	switch {
	case notAfter.IsZero():
		return ""
	case !now.Before(notAfter):
		return "expired"
	case notAfter.Sub(now) <= certWarnBefore:
		return "expiring"
	}
	return "ok"
}

// serveEtcdTLS is the controller's etcdTLSPath handler.
func serveEtcdTLS(rot *etcdTLSRotator, counts *tlsReloads, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			jsonx.Write(w, http.StatusMethodNotAllowed, errorReply{Error: "POST only"})
			return
		}
		body, ok := readBody(w, r, maxTLSBody)
		if !ok {
			return
		}
		if rot == nil {
			jsonx.Write(w, http.StatusConflict, errorReply{Error: "keelvip: etcd tls: this controller reaches etcd over plain http; enabling TLS needs a restart", Code: "no-tls"})
			return
		}
		var req etcdTLSRequest
		if err := decodeStrict(body, &req); err != nil {
			jsonx.Write(w, http.StatusBadRequest, errorReply{Error: err.Error(), Code: "malformed"})
			return
		}
		changed, err := rot.update(EtcdTLS{CAPEM: []byte(req.CAPEM), CertPEM: []byte(req.CertPEM), KeyPEM: []byte(req.KeyPEM)}, wallNow())
		if err != nil {
			counts.refused.Add(1)
			log.Error("etcd tls: new files refused; the current ones stay in use", "err", err)
			jsonx.Write(w, http.StatusBadRequest, errorReply{Error: err.Error(), Code: "refused"})
			return
		}
		subject, notAfter := rot.current()
		rep := etcdTLSReply{Changed: changed, Subject: subject}
		if !notAfter.IsZero() {
			rep.NotAfter = notAfter.UTC().Format(time.RFC3339)
		}
		if changed {
			counts.ok.Add(1)
			log.Info("etcd tls: new files in use for new connections", "subject", subject, "not_after", rep.NotAfter)
		}
		jsonx.Write(w, http.StatusOK, rep)
	}
}

// watchCertExpiry logs a warning while the client certificate is within
// certWarnBefore of its expiry and an error once it has expired, at
// start and then every certLogEvery, until ctx ends.
func watchCertExpiry(ctx context.Context, rot *etcdTLSRotator, log *slog.Logger, every time.Duration) {
	if rot == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		subject, notAfter := rot.current()
		now := wallNow()
		switch certState(notAfter, now) {
		case "expired":
			log.Error("etcd tls: the client certificate has expired: etcd refuses every new connection; install a new one (the helper reads it within 10 s, or at once on SIGHUP)",
				"subject", subject, "not_after", notAfter.UTC().Format(time.RFC3339))
		case "expiring":
			log.Warn("etcd tls: the client certificate expires soon",
				"subject", subject, "not_after", notAfter.UTC().Format(time.RFC3339), "in", notAfter.Sub(now).Round(time.Minute).String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readTLSFiles reads the mesh file's etcd TLS files themselves (never
// systemd's credential copies, which are the contents at the unit's
// start). ok is false when the setting names no file to watch.
func readTLSFiles(e EtcdTLS) (etcdTLSRequest, bool, error) {
	var req etcdTLSRequest
	if e.CAFile == "" && e.CertFile == "" {
		return req, false, nil
	}
	for _, f := range []struct {
		field, path string
		dst         *string
	}{{"etcd.ca_file", e.CAFile, &req.CAPEM}, {"etcd.cert_file", e.CertFile, &req.CertPEM}, {"etcd.key_file", e.KeyFile, &req.KeyPEM}} {
		if f.path == "" {
			continue
		}
		b, err := readSmall(f.path, 1<<20)
		if err != nil {
			return req, true, fmt.Errorf("%w: %s %q: %w", ErrEtcdTLS, f.field, f.path, err)
		}
		*f.dst = string(b)
	}
	return req, true, nil
}

// watchEtcdTLS is the helper's side of the rotation: it reads the etcd
// TLS files every interval and at each receive from hup (SIGHUP), and
// when their contents differ from what the controller last took, hands
// them over with push. A push that fails is tried again at the next
// read; contents the controller refused are logged once and not sent
// again until they change. It returns when ctx ends.
func watchEtcdTLS(ctx context.Context, e EtcdTLS, interval time.Duration, hup <-chan os.Signal,
	push func(context.Context, etcdTLSRequest) (etcdTLSReply, error), log *slog.Logger) {
	var taken, refused [32]byte
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-hup:
			log.Info("SIGHUP: reading the etcd tls files")
		}
		req, ok, err := readTLSFiles(e)
		if !ok {
			continue
		}
		if err != nil {
			log.Error("etcd tls: cannot read the files; the controller keeps the current ones", "err", err)
			continue
		}
		sum := pemSum(EtcdTLS{CAPEM: []byte(req.CAPEM), CertPEM: []byte(req.CertPEM), KeyPEM: []byte(req.KeyPEM)})
		if sum == taken || sum == refused {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rep, err := push(pctx, req)
		cancel()
		var ce *callError
		switch {
		case errors.As(err, &ce) && ce.status == http.StatusBadRequest:
			refused = sum
			log.Error("etcd tls: the controller refused the new files; it keeps the current ones", "err", err)
		case err != nil:
			log.Warn("etcd tls: could not hand the new files to the controller; trying again", "err", err)
		default:
			taken = sum
			if rep.Changed {
				log.Info("etcd tls: the controller took new files", "subject", rep.Subject, "not_after", rep.NotAfter)
			}
		}
	}
}

// pushTLS posts req to the controller's etcdTLSPath at base.
func pushTLS(ctx context.Context, hc *http.Client, base string, req etcdTLSRequest) (etcdTLSReply, error) {
	var rep etcdTLSReply
	err := callJSON(ctx, hc, http.MethodPost, base+etcdTLSPath, req, &rep, map[string]string{"Content-Type": "application/json"})
	return rep, err
}
