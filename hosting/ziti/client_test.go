package ziti_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

func serve(t *testing.T, status int, body string) (*ziti.Client, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if !strings.HasPrefix(r.URL.Path, ziti.BasePath+"/") || r.Header.Get("zt-session") != "tok" {
			w.WriteHeader(418)
			return
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	c, err := ziti.New(srv.URL, ziti.Options{Session: "tok", HTTPClient: srv.Client(), MaxResponseBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	return c, &n
}

var answers = []struct {
	name   string
	status int
	body   string
	want   error
}{
	{"in use is never retried", 500, `{"error":{"code":"UNHANDLED","message":"config is in use by identity","causeMessage":"config is in use by identity x"},"meta":{}}`, ziti.ErrConfigInUse},
	{"other 500", 500, `{"error":{"code":"UNHANDLED","message":"boom"},"meta":{}}`, ziti.ErrServer},
	{"404", 404, `{"error":{"code":"NOT_FOUND","message":"gone"},"meta":{}}`, ziti.ErrNotFound},
	{"400", 400, `{"error":{"code":"COULD_NOT_VALIDATE","message":"bad"},"meta":{}}`, ziti.ErrInvalid},
	{"401", 401, `{"error":{"code":"UNAUTHORIZED","message":"no"},"meta":{}}`, ziti.ErrUnauthorized},
	{"409", 409, `{"error":{"code":"CONFLICT_CANNOT_MODIFY_REFERENCED","message":"ref"},"meta":{}}`, ziti.ErrConflict},
	{"503 without envelope", 503, `<html>`, ziti.ErrServer},
	{"success that is not JSON", 200, `<html>`, ziti.ErrProtocol},
	{"answer too long", 200, `{"data":"` + strings.Repeat("x", 5000) + `"}`, ziti.ErrProtocol},
	{"unexpected status", 204, ``, ziti.ErrProtocol},
}

func TestErrorEnvelope(t *testing.T) {
	for _, tc := range answers {
		t.Run(tc.name, func(t *testing.T) {
			c, n := serve(t, tc.status, tc.body)
			err := c.DeleteConfig(context.Background(), "cfg-1")
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n.Load() != 1 {
				t.Fatalf("%d requests, want exactly 1 (no retry)", n.Load())
			}
		})
	}
	c, _ := serve(t, 404, answers[2].body)
	var ae *ziti.APIError
	if err := c.PatchConfig(context.Background(), "x", ziti.ConfigPatch{}); !errors.As(err, &ae) || ae.Op != "patchConfig" || ae.Code != "NOT_FOUND" || ae.Status != 404 {
		t.Fatalf("APIError %+v", ae)
	}
}

func TestCreateNeedsAnID(t *testing.T) {
	c, _ := serve(t, 201, `{"data":{},"meta":{}}`)
	if _, err := c.CreateConfig(context.Background(), ziti.ConfigCreate{}); !errors.Is(err, ziti.ErrProtocol) {
		t.Fatal(err)
	}
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "http://", "::"} {
		if _, err := ziti.New(u, ziti.Options{}); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, err := ziti.New("https://ctrl:1280/edge/management/v1/", ziti.Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestQuote(t *testing.T) {
	if got := ziti.Eq("tags.agentId", `a"b\c`); got != `tags.agentId = "a\"b\\c"` {
		t.Fatalf("got %s", got)
	}
}

type bodyRT string

func (b bodyRT) RoundTrip(r *http.Request) (*http.Response, error) {
	status := 200
	if len(b) > 0 && b[0]&1 == 1 {
		status = 500
	}
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(string(b))), Header: http.Header{}, Request: r}, nil
}

func FuzzAnswer(f *testing.F) {
	for _, a := range answers {
		f.Add(a.body)
	}
	f.Add(`{"data":[{"id":"x","configTypeId":"t","data":{}}],"meta":{"pagination":{"limit":1,"offset":0,"totalCount":1}}}`)
	f.Fuzz(func(t *testing.T, body string) {
		c, err := ziti.New("http://ctrl", ziti.Options{HTTPClient: &http.Client{Transport: bodyRT(body)}})
		if err != nil {
			t.Fatal(err)
		}
		// Paging must end even when the answer lies about totalCount.
		ctx := context.Background()
		_, _ = c.ListConfigs(ctx, "")
		_, _ = c.ListServiceConfigs(ctx, "i")
		_ = c.DeleteConfig(ctx, "x")
	})
}
