package ziti

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// DefaultRefreshBefore is how long before a session expires the client
// renews it.
const DefaultRefreshBefore = time.Minute

// Authentication methods of the authenticate operation.
const (
	MethodPassword = "password" // updb: username and password
	MethodCert     = "cert"     // the client certificate of the TLS connection
)

// Login is how a Client logs in to the controller (authenticate).
type Login struct {
	Method   string // MethodPassword or MethodCert
	Username string // password only
	Password string // password only
}

// PasswordLogin logs in with an updb authenticator.
func PasswordLogin(username, password string) *Login {
	return &Login{Method: MethodPassword, Username: username, Password: password}
}

// CertLogin logs in with the client certificate that the Client's
// HTTPClient presents (its transport's TLSClientConfig.Certificates).
func CertLogin() *Login { return &Login{Method: MethodCert} }

// ErrLogin means a Login is incomplete.
var ErrLogin = errors.New("ziti: bad login")

func (l *Login) check() error {
	switch l.Method {
	case MethodPassword:
		if l.Username == "" || l.Password == "" {
			return fmt.Errorf("%w: a password login needs a username and a password", ErrLogin)
		}
	case MethodCert:
	default:
		return fmt.Errorf("%w: unknown method %q", ErrLogin, l.Method)
	}
	return nil
}

// Session is an API session of the controller.
type Session struct {
	Token     string
	ExpiresAt time.Time // on the client's clock
}

type apiSession struct {
	Token             string    `json:"token"`
	ExpiresAt         time.Time `json:"expiresAt"`
	ExpirationSeconds *int64    `json:"expirationSeconds"`
}

// Authenticate logs in with the client's Login and returns the session; it
// does not install it (the client does that itself when it needs one). A
// refusal is *APIError matching ErrUnauthorized.
func (c *Client) Authenticate(ctx context.Context) (Session, error) {
	if c.login == nil {
		return Session{}, fmt.Errorf("%w: the client has no login", ErrLogin)
	}
	var body any = struct{}{}
	if c.login.Method == MethodPassword {
		body = map[string]string{"username": c.login.Username, "password": c.login.Password}
	}
	start := c.clk.Now()
	var s apiSession
	if _, err := c.send(ctx, "authenticate", http.MethodPost, "/authenticate", url.Values{"method": {c.login.Method}}, body, http.StatusOK, &s, ""); err != nil {
		return Session{}, err
	}
	if s.Token == "" {
		return Session{}, fmt.Errorf("%w: authenticate: the session has no token", ErrProtocol)
	}
	// The lifetime is taken from expirationSeconds, counted from before the
	// request on the client's own clock, so that a skewed controller clock
	// cannot make the client keep an expired session.
	out := Session{Token: s.Token}
	switch {
	case s.ExpirationSeconds != nil && *s.ExpirationSeconds > 0:
		out.ExpiresAt = start.Add(time.Duration(*s.ExpirationSeconds) * time.Second)
	default:
		return Session{}, fmt.Errorf("%w: authenticate: the session has no expirationSeconds", ErrProtocol)
	}
	return out, nil
}

// token returns a session token that is not about to expire, logging in
// when there is none, when it is within RefreshBefore of its expiry, or
// when stale (the token a request was refused with) is still the current
// one. One login runs at a time; callers that waited reuse its session, or
// log in themselves when it failed. The login runs with no lock held, and
// a caller waiting for another's login gives up when its ctx ends.
func (c *Client) token(ctx context.Context, stale string) (string, error) {
	for {
		now := c.clk.Now()
		c.mu.Lock()
		if c.session != "" && c.session != stale && now.Before(c.expires.Add(-c.refresh)) {
			tok := c.session
			c.mu.Unlock()
			return tok, nil
		}
		if l := c.inflight; l != nil {
			c.mu.Unlock()
			select {
			case <-l.done:
				continue // look again: its session, or our turn
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		l := &loginCall{done: make(chan struct{})}
		c.inflight = l
		c.mu.Unlock()
		s, err := c.Authenticate(ctx)
		c.mu.Lock()
		if err == nil {
			c.session, c.expires = s.Token, s.ExpiresAt
		}
		c.inflight = nil
		c.mu.Unlock()
		close(l.done)
		if err != nil {
			return "", err
		}
		return s.Token, nil
	}
}
