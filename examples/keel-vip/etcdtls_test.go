package keelvip_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

// testCA is a certificate authority made in the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64 = 1

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key (PEM) for cn, valid from nb to na.
func (ca *testCA) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, nb, na time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: nb, NotAfter: na,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"etcd.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// writeFile puts b in dir/name whole, by a rename, as a certificate
// manager does: a watch reading the file at the same instant sees the old
// contents or the new, never part of them.
func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	tmp := p + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// startTLSEtcd runs an embedded etcd on https://127.0.0.1 that requires
// client certificates signed by ca.
func startTLSEtcd(t *testing.T, dir string, ca *testCA) string {
	t.Helper()
	return startTLSEtcdTrusting(t, dir, ca, ca.pem)
}

// startTLSEtcdTrusting is startTLSEtcd with etcd's certificate from ca
// and the client CAs it trusts in trusted (PEM).
func startTLSEtcdTrusting(t *testing.T, dir string, ca *testCA, trusted []byte) string {
	t.Helper()
	now := time.Now()
	sc, sk := ca.issue(t, "etcd", x509.ExtKeyUsageServerAuth, now.Add(-time.Hour), now.Add(time.Hour))
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	cu, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", free()))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", free()))
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ListenMetricsUrls = nil
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ClientTLSInfo.CertFile = writeFile(t, dir, "server.pem", sc)
	cfg.ClientTLSInfo.KeyFile = writeFile(t, dir, "server-key.pem", sk)
	cfg.ClientTLSInfo.TrustedCAFile = writeFile(t, dir, "server-ca.pem", trusted)
	cfg.ClientTLSInfo.ClientCertAuth = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		t.Fatal("etcd not ready")
	}
	return cu.String()
}

// meshWithEtcd parses a mesh file whose etcd block is etcd.
func meshWithEtcd(t *testing.T, dir string, etcd map[string]any) (*keelvip.Mesh, error) {
	doc := meshDoc(dir)
	doc["etcd"] = etcd
	return keelvip.ParseMesh(bytes.NewReader(encode(t, doc)))
}

// TestEtcdTLS: an etcd that requires client certificates accepts the
// member's certificate as the mesh file names it, refuses one from
// another CA, and each bad setting is a start-up error naming its field.
func TestEtcdTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t, "keel etcd ca"), newCA(t, "another ca")
	ep := startTLSEtcd(t, dir, ca)
	now := time.Now()
	mc, mk := ca.issue(t, "member-a", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	oc, ok := other.issue(t, "intruder", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	ec, ek := ca.issue(t, "expired", x509.ExtKeyUsageClientAuth, now.Add(-2*time.Hour), now.Add(-time.Hour))
	_, otherKey := ca.issue(t, "b", x509.ExtKeyUsageClientAuth, now.Add(-time.Hour), now.Add(time.Hour))
	caFile := writeFile(t, dir, "ca.pem", ca.pem)
	files := map[string]string{
		"member.pem": writeFile(t, dir, "member.pem", mc), "member-key.pem": writeFile(t, dir, "member-key.pem", mk),
		"other.pem": writeFile(t, dir, "other.pem", oc), "other-key.pem": writeFile(t, dir, "other-key.pem", ok),
		"expired.pem": writeFile(t, dir, "expired.pem", ec), "expired-key.pem": writeFile(t, dir, "expired-key.pem", ek),
		"b-key.pem": writeFile(t, dir, "b-key.pem", otherKey),
	}
	put := func(cfg *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = cli.Put(ctx, "/keel/tls", "ok")
		return err
	}

	m, err := meshWithEtcd(t, dir, map[string]any{"endpoints": []string{ep}, "ca_file": caFile,
		"cert_file": files["member.pem"], "key_file": files["member-key.pem"], "server_name": "etcd.test"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := m.EtcdTLSConfig(now)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(cfg); err != nil {
		t.Fatalf("the member's certificate: %v", err)
	}
	// A certificate of another CA, offered directly: etcd refuses it.
	intruder, err := tls.X509KeyPair(oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(&tls.Config{RootCAs: cfg.RootCAs, ServerName: "etcd.test", Certificates: []tls.Certificate{intruder}}); err == nil {
		t.Fatal("etcd took a client certificate of another CA")
	}

	for _, tc := range []struct {
		name        string
		etcd        map[string]any
		want, want2 string
	}{
		{"missing file", map[string]any{"ca_file": caFile, "cert_file": filepath.Join(dir, "nope.pem"), "key_file": files["member-key.pem"]}, "etcd.cert_file", "no such file"},
		{"unreadable file", map[string]any{"ca_file": dir, "cert_file": files["member.pem"], "key_file": files["member-key.pem"]}, "etcd.ca_file", ""},
		{"not PEM", map[string]any{"ca_file": files["member-key.pem"], "cert_file": files["member.pem"], "key_file": files["member-key.pem"]}, "etcd.ca_file", "no PEM certificate"},
		{"expired", map[string]any{"ca_file": caFile, "cert_file": files["expired.pem"], "key_file": files["expired-key.pem"]}, "etcd.cert_file", "expired"},
		{"key mismatch", map[string]any{"ca_file": caFile, "cert_file": files["member.pem"], "key_file": files["b-key.pem"]}, "etcd.key_file does not match etcd.cert_file", ""},
		{"other CA", map[string]any{"ca_file": caFile, "cert_file": files["other.pem"], "key_file": files["other-key.pem"]}, "does not chain to etcd.ca_file", ""},
	} {
		tc.etcd["endpoints"] = []string{ep}
		m, err := meshWithEtcd(t, dir, tc.etcd)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, err = m.EtcdTLSConfig(now)
		if !errors.Is(err, keelvip.ErrEtcdTLS) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.want2) {
			t.Errorf("%s: %v, want ErrEtcdTLS with %q %q", tc.name, err, tc.want, tc.want2)
		}
	}
	if _, err := meshWithEtcd(t, dir, map[string]any{"endpoints": []string{"http://127.0.0.1:2379"}, "ca_file": caFile}); err == nil ||
		!strings.Contains(err.Error(), "https://") {
		t.Errorf("TLS with an http endpoint: %v", err)
	}
	if _, err := meshWithEtcd(t, dir, map[string]any{"endpoints": []string{ep}, "ca_file": caFile, "cert_file": files["member.pem"]}); err == nil ||
		!strings.Contains(err.Error(), "go together") {
		t.Errorf("a certificate without its key: %v", err)
	}
}
