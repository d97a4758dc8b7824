package zititest

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"time"

	"github.com/vipkit/vipkit/hosting/ziti"
)

type user struct {
	password string
	identity string
}

// AddUser creates an admin identity with an updb authenticator and returns
// the identity's id.
func (f *Fake) AddUser(username, password string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID("ident")
	f.idents[id] = ziti.Identity{ID: id, Name: username}
	f.users[username] = user{password, id}
	return id
}

// AddCertIdentity creates an admin identity whose cert authenticator is
// the certificate, and returns the identity's id.
func (f *Fake) AddCertIdentity(cert *x509.Certificate) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID("ident")
	f.idents[id] = ziti.Identity{ID: id, Name: cert.Subject.CommonName}
	f.certs[sha256.Sum256(cert.Raw)] = id
	return id
}

// Logins is how many sessions authenticate has made.
func (f *Fake) Logins() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.logins
}

// ExpireSessions ends every session authenticate made, as a controller
// restart or an administrator would: the next request with one is 401.
func (f *Fake) ExpireSessions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.sessions)
}

// HTTPClient returns an HTTP client that trusts the fake's certificate
// and, when cert is not nil, presents it as its client certificate.
func (f *Fake) HTTPClient(cert *tls.Certificate) *http.Client {
	c := f.srv.Client()
	if cert == nil {
		return c
	}
	tr := c.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
	return &http.Client{Transport: tr}
}

const (
	codeInvalidAuth = "INVALID_AUTH"
	msgInvalidAuth  = "The authentication request failed"
)

func (f *Fake) authenticateOp(w http.ResponseWriter, r *http.Request, body []byte) {
	var ident string
	switch r.URL.Query().Get("method") {
	case ziti.MethodPassword:
		var b struct {
			Username string `json:"username"`
			Password string `json:"password"`
		}
		if !f.decode(w, body, &b) {
			return
		}
		f.mu.Lock()
		if u, ok := f.users[b.Username]; ok && u.password == b.Password && b.Password != "" {
			ident = u.identity
		}
		f.mu.Unlock()
	case ziti.MethodCert:
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			f.mu.Lock()
			ident = f.certs[sha256.Sum256(r.TLS.PeerCertificates[0].Raw)]
			f.mu.Unlock()
		}
	}
	if ident == "" {
		f.writeError(w, http.StatusUnauthorized, codeInvalidAuth, msgInvalidAuth, "", nil)
		return
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	tok := hex.EncodeToString(raw[:])
	now := f.clk.Now()
	f.mu.Lock()
	f.sessions[tok] = now.Add(f.ttl)
	f.logins++
	sid := f.newID("sess")
	name := f.idents[ident].Name
	f.mu.Unlock()
	m := base(sid, nil, "current-api-session")
	m["token"], m["identityId"], m["identity"] = tok, ident, map[string]any{"id": ident, "name": name, "entity": "identities"}
	m["configTypes"], m["ipAddress"], m["authQueries"], m["cachedUpdatedAt"] = []string{}, "127.0.0.1", []any{}, now.UTC().Format(time.RFC3339)
	m["isMfaRequired"], m["isMfaComplete"], m["authenticatorId"], m["isCertExtendable"] = false, false, "auth-"+ident, false
	m["expiresAt"], m["expirationSeconds"] = now.Add(f.ttl).UTC().Format(time.RFC3339Nano), int64(f.ttl/time.Second)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(map[string]any{"data": m, "meta": metaBody})
}

// CertificatePEM returns the PEM of the fake's TLS certificate (with
// Options.TLS), for a client's CA bundle.
func (f *Fake) CertificatePEM() []byte {
	c := f.srv.Certificate()
	if c == nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
