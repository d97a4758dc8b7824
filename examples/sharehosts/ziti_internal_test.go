package sharehosts

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// The config's certificate login: the client presents the key pair from
// the files and trusts the controller through the CA file.
func TestZitiCertLoginFromTheConfig(t *testing.T) {
	f := zitifake.Start(t, zititest.Options{TLS: true})
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "sharehosts"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	f.AddCertIdentity(cert)
	kb, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := Config{ZitiURL: f.URL(),
		ZitiCert: write("c.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		ZitiKey:  write("k.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})),
		ZitiCA:   write("ca.pem", f.CertificatePEM())}
	zc, err := zitiClient(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zc.ListConfigTypes(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	if f.Logins() != 1 {
		t.Fatalf("logins %d", f.Logins())
	}
	// Without the CA file the controller is not trusted.
	c.ZitiCA = ""
	zc, _ = zitiClient(c, nil)
	if _, err := zc.ListConfigTypes(context.Background(), ""); err == nil {
		t.Fatal("an untrusted controller was accepted")
	}
	c.ZitiCA = write("bad.pem", []byte("not a certificate"))
	if _, err := zitiClient(c, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad CA file: %v", err)
	}
}
