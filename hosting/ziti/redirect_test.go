package ziti_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/hosting/ziti"
)

// TestClientFollowsNoRedirect: a controller address that answers with a
// redirect to another host gets ErrProtocol, and that host sees no
// request: neither the zt-session header nor a login's password is sent
// on, whatever the HTTPClient's own CheckRedirect allows.
func TestClientFollowsNoRedirect(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string // what the other host received
	)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s zt-session=%q body=%q", r.Method, r.URL.Path, r.Header.Get("zt-session"), b))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"data":[],"meta":{}}`)
	}))
	defer target.Close()
	ctx := context.Background()
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.RequestURI(), code)
		}))
		follow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
		for _, call := range []struct {
			name string
			o    ziti.Options
			do   func(*ziti.Client) error
		}{
			{"session", ziti.Options{Session: "tok"}, func(c *ziti.Client) error { _, err := c.ListConfigTypes(ctx, ""); return err }},
			{"password login", ziti.Options{Login: ziti.PasswordLogin("admin", "s3cret")}, func(c *ziti.Client) error { _, err := c.Authenticate(ctx); return err }},
		} {
			for _, hc := range []*http.Client{nil, redirect.Client(), follow} {
				o := call.o
				o.HTTPClient = hc
				c, err := ziti.New(redirect.URL, o)
				if err != nil {
					t.Fatal(err)
				}
				err = call.do(c)
				if !errors.Is(err, ziti.ErrProtocol) || !strings.Contains(err.Error(), target.URL) {
					t.Errorf("status %d, %s: %v, want ErrProtocol naming %s", code, call.name, err, target.URL)
				}
			}
		}
		redirect.Close()
		mu.Lock()
		if len(seen) != 0 {
			t.Errorf("status %d: the redirect's target received %d requests: %s", code, len(seen), strings.Join(seen, "; "))
		}
		seen = nil
		mu.Unlock()
	}
}
