package ziti_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// reentrantTransport calls back into the client from inside its login
// request, as a transport that refreshes something through the
// application might.
type reentrantTransport struct {
	next  http.RoundTripper
	c     *ziti.Client
	inner error
	done  bool
}

func (t *reentrantTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/authenticate") && !t.done {
		t.done = true
		ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
		_, t.inner = t.c.ListConfigTypes(ctx, "")
		cancel()
	}
	return t.next.RoundTrip(r)
}

// TestLoginRunsUnlocked pins that the client logs in with no lock held: a
// call made while a login is in flight (here from the login's own
// transport) waits for it within its own context instead of blocking on
// the client's lock for ever, and the login then completes.
func TestLoginRunsUnlocked(t *testing.T) {
	f := zitifake.Start(t, zititest.Options{SessionTTL: 30 * time.Minute})
	f.AddUser("admin", "s3cret")
	hc := f.HTTPClient(nil)
	tr := &reentrantTransport{next: hc.Transport}
	c, err := ziti.New(f.URL(), ziti.Options{HTTPClient: &http.Client{Transport: tr}, Login: ziti.PasswordLogin("admin", "s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	tr.c = c
	testenv.Within(t, "a call whose login calls the client", func() {
		_, err = c.ListConfigTypes(context.Background(), "")
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(tr.inner, context.DeadlineExceeded) {
		t.Fatalf("call during the login: %v, want its context's deadline", tr.inner)
	}
	if f.Logins() != 1 {
		t.Fatalf("logins %d, want 1", f.Logins())
	}
}
