package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

const acct, other = "acct-1", "acct-2"

var hc = hosting.HealthCheck{Interval: 5 * time.Second, Timeout: 2 * time.Second, Failures: 3}

// stuckIngress: the ingress of the shares in stuck never comes down.
type stuckIngress struct {
	// mu guards stuck.
	mu sync.Mutex
	// +checklocks:mu
	stuck map[string]bool
}

func (s *stuckIngress) TearDown(ctx context.Context, sh hosting.Share) error { return nil }
func (s *stuckIngress) Up(ctx context.Context, sh hosting.Share) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stuck[sh.ID], nil
}

type env struct {
	t     testing.TB
	fake  *zititest.Fake
	svc   *hosting.Service
	store hosting.Store
	srv   *httptest.Server
	h     *api.Handler
	ing   *stuckIngress
	ident map[string]string
	// auth is the Authorization header of every request whose hdr does
	// not set one ("" for none).
	auth string
}

// Tokens of withBearer: tenant-a acts on acct-1, ops on every account.
const (
	tenantA  = "tenant-a-token-0123456789"
	opsToken = "ops-token-0123456789abcd"
)

// withBearer serves e's handler behind tenant-a's and ops's tokens and
// sends tenant-a's by default.
func (e *env) withBearer() {
	e.t.Helper()
	sa, err := api.AccountScope(acct)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := api.NewBearer([]api.Token{{Secret: tenantA, Principal: "tenant-a", Scope: sa}, {Secret: opsToken, Principal: "ops", Scope: api.AllAccounts()}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.srv.Close()
	e.srv = httptest.NewServer(b.Wrap(e.h))
	e.t.Cleanup(e.srv.Close)
	e.auth = "Bearer " + tenantA
}

func newEnv(t testing.TB, st hosting.Store) *env {
	t.Helper()
	f := zitifake.Start(t, zititest.Options{})
	if st == nil {
		st = hosting.NewMemStore()
	}
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: "fd-1", HealthCheck: hc})
	if err != nil {
		t.Fatal(err)
	}
	ing := &stuckIngress{stuck: map[string]bool{}}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p, Ingress: ing})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Service: svc, BasePath: "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &env{t: t, fake: f, svc: svc, store: st, srv: srv, h: h, ing: ing, ident: map[string]string{}}
}

func (e *env) agents(account string, ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		if err := e.store.PutAgent(context.Background(), hosting.Agent{ID: id, AccountID: account}); err != nil {
			e.t.Fatal(err)
		}
		e.ident[id] = e.fake.AddIdentity(id)
	}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) problem(t testing.TB) api.Problem {
	t.Helper()
	var p api.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("not a problem: %s", a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != api.MediaProblem {
		t.Fatalf("problem with content type %q", ct)
	}
	return p
}

func (a answer) share(t testing.TB) api.ShareView {
	t.Helper()
	var v api.ShareView
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("not a share: %s", a.body)
	}
	return v
}

func (e *env) do(method, path, body string, hdr map[string]string) answer {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if e.auth != "" {
		req.Header.Set("Authorization", e.auth)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}
