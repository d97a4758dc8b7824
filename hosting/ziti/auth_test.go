package ziti_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/zitifake"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func unauthorized(f *zititest.Fake) int {
	n := 0
	for _, c := range f.Calls() {
		if c.Status == 401 {
			n++
		}
	}
	return n
}

func TestPasswordLoginAndRefreshBeforeExpiry(t *testing.T) {
	clk := transporttest.NewManualClock()
	f := zitifake.Start(t, zititest.Options{Clock: clk, SessionTTL: 30 * time.Minute})
	f.AddUser("admin", "s3cret")
	c, err := ziti.New(f.URL(), ziti.Options{HTTPClient: f.HTTPClient(nil), Login: ziti.PasswordLogin("admin", "s3cret"), Clock: clk, RefreshBefore: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func() {
		t.Helper()
		if _, err := c.ListConfigTypes(ctx, ""); err != nil {
			t.Fatal(err)
		}
	}
	call()
	call()
	if f.Logins() != 1 {
		t.Fatalf("logins %d, want 1", f.Logins())
	}
	clk.Advance(28*time.Minute + 59*time.Second) // still more than a minute left
	call()
	if f.Logins() != 1 {
		t.Fatalf("renewed early: %d logins", f.Logins())
	}
	clk.Advance(2 * time.Second) // within a minute of expiry: renewed before it
	call()
	if f.Logins() != 2 || unauthorized(f) != 0 {
		t.Fatalf("logins %d, 401s %d: want a renewal before expiry and no 401", f.Logins(), unauthorized(f))
	}
	// The renewed session outlives the first one.
	clk.Advance(10 * time.Minute)
	call()
	if f.Logins() != 2 || unauthorized(f) != 0 {
		t.Fatalf("logins %d, 401s %d", f.Logins(), unauthorized(f))
	}
}

func TestRefreshOn401(t *testing.T) {
	f := zitifake.Start(t, zititest.Options{})
	f.AddUser("admin", "s3cret")
	c, err := ziti.New(f.URL(), ziti.Options{HTTPClient: f.HTTPClient(nil), Login: ziti.PasswordLogin("admin", "s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.ListConfigTypes(ctx, ""); err != nil {
		t.Fatal(err)
	}
	f.ExpireSessions() // the controller forgot every session
	// Eight callers at once: each sees 401 at most once, and one login
	// serves them all.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.ListConfigTypes(ctx, "")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if f.Logins() != 2 || unauthorized(f) == 0 || unauthorized(f) > 8 {
		t.Fatalf("logins %d, 401s %d: want one re-login after the 401s", f.Logins(), unauthorized(f))
	}
	// A wrong password is refused, and never retried in a loop.
	bad, _ := ziti.New(f.URL(), ziti.Options{HTTPClient: f.HTTPClient(nil), Login: ziti.PasswordLogin("admin", "wrong")})
	var ae *ziti.APIError
	if _, err := bad.ListConfigTypes(ctx, ""); !errors.Is(err, ziti.ErrUnauthorized) || !errors.As(err, &ae) || ae.Code != "INVALID_AUTH" {
		t.Fatalf("wrong password: %v", err)
	}
	if _, err := ziti.New(f.URL(), ziti.Options{Login: ziti.PasswordLogin("admin", "")}); !errors.Is(err, ziti.ErrLogin) {
		t.Fatalf("empty password accepted: %v", err)
	}
}

func clientCert(t *testing.T, cn string) (tls.Certificate, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, cert
}

func TestCertLogin(t *testing.T) {
	f := zitifake.Start(t, zititest.Options{TLS: true})
	good, goodX := clientCert(t, "hosting-service")
	other, _ := clientCert(t, "stranger")
	f.AddCertIdentity(goodX)
	ctx := context.Background()
	c, err := ziti.New(f.URL(), ziti.Options{HTTPClient: f.HTTPClient(&good), Login: ziti.CertLogin()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListConfigTypes(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if f.Logins() != 1 {
		t.Fatalf("logins %d", f.Logins())
	}
	for _, hc := range []*tls.Certificate{&other, nil} {
		c2, _ := ziti.New(f.URL(), ziti.Options{HTTPClient: f.HTTPClient(hc), Login: ziti.CertLogin()})
		if _, err := c2.ListConfigTypes(ctx, ""); !errors.Is(err, ziti.ErrUnauthorized) {
			t.Fatalf("unknown certificate: %v", err)
		}
	}
}
