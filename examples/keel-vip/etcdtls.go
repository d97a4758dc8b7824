package keelvip

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrEtcdTLS is returned at start for an unusable etcd TLS setting; the
// message names the mesh file's field (etcd.ca_file, etcd.cert_file,
// etcd.key_file).
var ErrEtcdTLS = errors.New("keelvip: etcd tls")

// EtcdTLS is the mesh file's etcd TLS setting:
//
//	"etcd": {"endpoints": ["https://[fd7a::1:1]:2379"],
//	         "ca_file": "/etc/keel/etcd/ca.pem",
//	         "cert_file": "/etc/keel/etcd/member.pem",
//	         "key_file": "/etc/keel/etcd/member-key.pem",
//	         "server_name": "etcd.keel"}
//
// The CA bundle verifies etcd's server certificate and the member's own;
// the certificate and key are the member's client certificate, which an
// etcd started with --client-cert-auth requires. The *PEM fields carry
// the same contents inline: the helper hands them over that way to the
// controller it starts (which cannot read root's files), and under
// systemd the controller's unit has them as the credentials etcd-ca,
// etcd-cert and etcd-key.
type EtcdTLS struct {
	CAFile, CertFile, KeyFile, ServerName string
	CAPEM, CertPEM, KeyPEM                []byte
}

// Enabled reports whether etcd is reached over TLS.
func (e EtcdTLS) Enabled() bool {
	return e.CAFile != "" || e.CertFile != "" || e.KeyFile != "" || len(e.CAPEM) > 0 || len(e.CertPEM) > 0
}

// load reads the files into the PEM fields (credentials of those names
// first, under systemd).
func (e EtcdTLS) load() (EtcdTLS, error) {
	for _, f := range []struct {
		field, path, cred string
		dst               *[]byte
	}{{"etcd.ca_file", e.CAFile, "etcd-ca", &e.CAPEM}, {"etcd.cert_file", e.CertFile, "etcd-cert", &e.CertPEM}, {"etcd.key_file", e.KeyFile, "etcd-key", &e.KeyPEM}} {
		if len(*f.dst) > 0 || f.path == "" {
			continue
		}
		path := f.path
		if c, err := openCredential(f.cred); err != nil {
			return e, fmt.Errorf("%w: %s: %w", ErrEtcdTLS, f.field, err)
		} else if c != nil {
			path = c.Name()
			c.Close()
		}
		b, err := readSmall(path, 1<<20)
		if err != nil {
			return e, fmt.Errorf("%w: %s %q: %w", ErrEtcdTLS, f.field, f.path, err)
		}
		*f.dst = b
	}
	return e, nil
}

// EtcdTLSConfig builds the client's TLS configuration and checks it as of
// now (wall-clock time): each file is readable PEM, the certificate is
// within its validity, the key matches it, and it chains to the CA bundle
// for client authentication. Each failure is ErrEtcdTLS naming the field.
// It returns nil, nil for plain http. The configuration is fixed; the
// controller uses a rotating one (etcdTLSRotator) built from the same
// checks.
func (m *Mesh) EtcdTLSConfig(now time.Time) (*tls.Config, error) {
	e, err := m.EtcdTLS.load()
	if err != nil || !e.Enabled() {
		return nil, err
	}
	mt, err := buildTLSMaterial(e, now)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.ServerName, RootCAs: mt.roots}
	if mt.pair != nil {
		cfg.Certificates = []tls.Certificate{*mt.pair}
	}
	return cfg, nil
}

// tlsMaterial is one checked set of etcd TLS contents.
type tlsMaterial struct {
	roots    *x509.CertPool   // nil: the system's roots
	pair     *tls.Certificate // nil: no client certificate
	notAfter time.Time        // the client certificate's; zero without one
	subject  string           // the client certificate's common name
	sum      [32]byte         // of the PEM contents, to tell a change
}

// pemSum hashes the three PEM contents of e.
func pemSum(e EtcdTLS) [32]byte {
	h := sha256.New()
	for _, b := range [][]byte{e.CAPEM, e.CertPEM, e.KeyPEM} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var s [32]byte
	h.Sum(s[:0])
	return s
}

// buildTLSMaterial checks e's PEM contents as of now, as EtcdTLSConfig
// documents.
func buildTLSMaterial(e EtcdTLS, now time.Time) (*tlsMaterial, error) {
	mt := &tlsMaterial{sum: pemSum(e)}
	if len(e.CAPEM) > 0 {
		pool := x509.NewCertPool()
		n := 0
		for rest := e.CAPEM; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: etcd.ca_file: certificate %d: %w", ErrEtcdTLS, n+1, err)
			}
			pool.AddCert(c)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("%w: etcd.ca_file: no PEM certificate in it", ErrEtcdTLS)
		}
		mt.roots = pool
	}
	if len(e.CertPEM) == 0 {
		return mt, nil
	}
	pair, err := tls.X509KeyPair(e.CertPEM, e.KeyPEM)
	if err != nil {
		if _, cerr := firstCert(e.CertPEM); cerr != nil {
			return nil, fmt.Errorf("%w: etcd.cert_file: %w", ErrEtcdTLS, cerr)
		}
		return nil, fmt.Errorf("%w: etcd.key_file does not match etcd.cert_file: %w", ErrEtcdTLS, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%w: etcd.cert_file: %w", ErrEtcdTLS, err)
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("%w: etcd.cert_file: certificate %q expired at %v", ErrEtcdTLS, leaf.Subject.CommonName, leaf.NotAfter.UTC())
	}
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("%w: etcd.cert_file: certificate %q is valid only from %v", ErrEtcdTLS, leaf.Subject.CommonName, leaf.NotBefore.UTC())
	}
	if mt.roots != nil {
		inter := x509.NewCertPool()
		for _, raw := range pair.Certificate[1:] {
			if c, err := x509.ParseCertificate(raw); err == nil {
				inter.AddCert(c)
			}
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: mt.roots, Intermediates: inter, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, fmt.Errorf("%w: etcd.cert_file does not chain to etcd.ca_file for client authentication: %w", ErrEtcdTLS, err)
		}
	}
	pair.Leaf = leaf
	mt.pair, mt.notAfter, mt.subject = &pair, leaf.NotAfter, leaf.Subject.CommonName
	return mt, nil
}

// etcdTLSRotator is the controller's etcd TLS: every new connection
// (etcd's client dials again after any break) takes the client
// certificate and the CA bundle current at its handshake, so new
// contents apply without a restart and without closing a connection
// that works. Connections already open keep the certificate they were
// made with, which etcd checked once, at their handshake.
type etcdTLSRotator struct {
	serverName string
	cur        atomic.Pointer[tlsMaterial]
}

// newEtcdTLSRotator checks e as of now; nil, nil for plain http.
func newEtcdTLSRotator(e EtcdTLS, now time.Time) (*etcdTLSRotator, error) {
	if !e.Enabled() {
		return nil, nil
	}
	mt, err := buildTLSMaterial(e, now)
	if err != nil {
		return nil, err
	}
	r := &etcdTLSRotator{serverName: e.ServerName}
	r.cur.Store(mt)
	return r, nil
}

// config is the client's tls.Config; nil for a nil r.
func (r *etcdTLSRotator) config() *tls.Config {
	if r == nil {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if mt := r.cur.Load(); mt.pair != nil {
				return mt.pair, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		}}
	if r.cur.Load().roots == nil {
		return cfg // the system's roots, verified as usual
	}
	// The server is verified against the bundle current at the handshake:
	// crypto/tls's own check would keep the bundle of the config.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: etcd sent no certificate", ErrEtcdTLS)
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		name := r.serverName
		if name == "" {
			name = cs.ServerName
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: r.cur.Load().roots, Intermediates: inter, DNSName: name})
		return err
	}
	return cfg
}

// update checks e as of now and makes it current. A refused e leaves the
// current contents in use. changed is false when e is what is current.
// A change from a CA bundle to none, or the reverse, is refused: it
// changes how the server is verified, which takes a restart.
func (r *etcdTLSRotator) update(e EtcdTLS, now time.Time) (changed bool, err error) {
	cur := r.cur.Load()
	if pemSum(e) == cur.sum {
		return false, nil
	}
	mt, err := buildTLSMaterial(e, now)
	if err != nil {
		return false, err
	}
	if (mt.roots == nil) != (cur.roots == nil) {
		return false, fmt.Errorf("%w: etcd.ca_file: adding or removing the CA bundle needs a restart", ErrEtcdTLS)
	}
	if (mt.pair == nil) != (cur.pair == nil) {
		return false, fmt.Errorf("%w: etcd.cert_file: adding or removing the client certificate needs a restart", ErrEtcdTLS)
	}
	r.cur.Store(mt)
	return true, nil
}

// current returns the client certificate's subject and expiry (zero
// without one).
func (r *etcdTLSRotator) current() (subject string, notAfter time.Time) {
	if r == nil {
		return "", time.Time{}
	}
	mt := r.cur.Load()
	return mt.subject, mt.notAfter
}

func firstCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM certificate in it")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// inlineEtcdTLS returns the mesh file raw with the etcd TLS files read in
// as inline PEM (what the helper hands the controller it starts).
func inlineEtcdTLS(m *Mesh, raw []byte) ([]byte, error) {
	if !m.EtcdTLS.Enabled() {
		return raw, nil
	}
	e, err := m.EtcdTLS.load()
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMesh, err)
	}
	ed, _ := doc["etcd"].(map[string]any)
	if ed == nil {
		return raw, nil
	}
	for k, v := range map[string][]byte{"ca_pem": e.CAPEM, "cert_pem": e.CertPEM, "key_pem": e.KeyPEM} {
		if len(v) > 0 {
			ed[k] = string(v)
		}
	}
	delete(ed, "ca_file")
	delete(ed, "cert_file")
	delete(ed, "key_file")
	return json.Marshal(doc)
}
