package claim_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
)

// httpMesh serves each controller's channel on its own loopback httptest
// server. The server learns the sender's overlay address from a header the
// test client sets per node (on a real node it is the WireGuard peer's
// address, RemoteAddr).
type httpMesh struct {
	mu sync.Mutex
	// +checklocks:mu
	servers map[netip.Addr]*httptest.Server
}

const fromHeader = "X-Test-Overlay-From"

func (h *httpMesh) serve(t *testing.T, self netip.Addr, hs ...claim.Handler) {
	s := claim.NewServer(hs...)
	s.PeerAddr = func(r *http.Request) (netip.Addr, error) { return netip.ParseAddr(r.Header.Get(fromHeader)) }
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	h.mu.Lock()
	h.servers[self] = ts
	h.mu.Unlock()
}

type fromTransport struct {
	from netip.Addr
	rt   http.RoundTripper
}

func (f fromTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(fromHeader, f.from.String())
	return f.rt.RoundTrip(r)
}

func (h *httpMesh) client(from netip.Addr) *claim.Client {
	return &claim.Client{
		HTTP: &http.Client{Timeout: 5 * time.Second, Transport: fromTransport{from, http.DefaultTransport}},
		URL: func(peer netip.Addr) string {
			h.mu.Lock()
			defer h.mu.Unlock()
			if s := h.servers[peer]; s != nil {
				return s.URL + claim.MembersPath
			}
			return "http://127.0.0.1:1" + claim.MembersPath // refused: not answering
		},
	}
}

func TestMembersChannelOverHTTP(t *testing.T) {
	e := newEnv(t, false)
	mesh := &httpMesh{servers: map[netip.Addr]*httptest.Server{}}
	for _, n := range []string{"a", "b", "c"} {
		m := e.m(n)
		m.Cfg.Channel = mesh.client(m.Node.Addr)
		ctl := e.start(n)
		mesh.serve(t, m.Node.Addr, ctl)
	}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	ctx := context.Background()
	a, b, c := e.m("a"), e.m("b"), e.m("c")
	res, err := a.Ctl().Promote(ctx, claim.PromoteOptions{})
	if err != nil || res.Taken != 2 || !a.Carrier.Carried(e.f.VIP) {
		t.Fatalf("promote over http: %+v %v", res, err)
	}
	// Epoch query.
	got, err := mesh.client(e.f.C.Addr).Epoch(ctx, e.f.B.Addr, e.f.VIP)
	if err != nil || got == nil || got.Epoch != 1 || got.Holder != e.f.A.Addr {
		t.Fatalf("epoch query: %v %v", got, err)
	}
	// A stale claim (the old epoch-1 claim, replayed by a) is a 409 with a reason.
	if _, err := b.Ctl().Promote(ctx, claim.PromoteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = mesh.client(e.f.A.Addr).Announce(ctx, e.f.C.Addr, e.f.Claim(e.f.A, 1))
	var ref *claim.RefusalError
	if !errors.As(err, &ref) || !errors.Is(err, claim.ErrStale) || ref.Code != "stale" || !strings.Contains(ref.Reason, "stale epoch") {
		t.Fatalf("stale claim over http: %v", err)
	}
	// A claim sent by another node than its holder.
	err = mesh.client(e.f.C.Addr).Announce(ctx, e.f.A.Addr, e.f.Claim(e.f.B, 3))
	if !errors.Is(err, claim.ErrWrongSender) {
		t.Fatalf("claim from a third node: %v", err)
	}
	// A release from the observer is refused; the holder keeps the vip.
	r, _ := claim.NewRelease(e.f.C.Key, e.f.Mesh, e.f.VIP, e.f.C.Addr, 3)
	if _, err := mesh.client(e.f.C.Addr).Release(ctx, e.f.B.Addr, r); !errors.Is(err, claim.ErrNotPairMember) {
		t.Fatalf("release from the observer: %v", err)
	}
	if !b.Carrier.Carried(e.f.VIP) || c.Carrier.RoutedTo(e.f.VIP) != e.f.B.Addr {
		t.Fatal("the refused release moved the vip")
	}
	// Unknown VIP.
	if _, err := mesh.client(e.f.C.Addr).Epoch(ctx, e.f.A.Addr, netip.MustParseAddr("fd7a:115c:a1e0::1:999")); !errors.Is(err, claim.ErrUnknownVIP) {
		t.Fatalf("unknown vip: %v", err)
	}
	// A peer that does not answer is not a refusal.
	err = mesh.client(e.f.C.Addr).Announce(ctx, e.f.D.Addr, e.f.Claim(e.f.B, 3))
	if err == nil || errors.As(err, &ref) {
		t.Fatalf("unanswered announce: %v", err)
	}
}

func TestServerLimits(t *testing.T) {
	e := newEnv(t, false)
	ctl := e.start("a")
	s := claim.NewServer(ctl)
	ts := httptest.NewServer(s)
	defer ts.Close()
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	post := func(body string) (int, string) {
		resp, err := http.Post(ts.URL+claim.MembersPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	big := `{"op":"claim","claim":"` + strings.Repeat("A", claim.MaxRequestBody) + `"}`
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"too large", big, http.StatusRequestEntityTooLarge, "too-large"},
		{"bad json", `{"op":`, http.StatusBadRequest, "malformed"},
		{"unknown field", `{"op":"epoch","vip":"fd7a::1","x":1}`, http.StatusBadRequest, "malformed"},
		{"trailing data", `{"op":"epoch","vip":"fd7a::1"}}`, http.StatusBadRequest, "malformed"},
		{"unknown op", `{"op":"steal"}`, http.StatusBadRequest, "malformed"},
		{"bad base64", `{"op":"claim","claim":"!!"}`, http.StatusBadRequest, "malformed"},
		{"garbage claim", `{"op":"claim","claim":"` + base64.StdEncoding.EncodeToString([]byte("nope")) + `"}`, http.StatusConflict, "version"},
		{"bad vip", `{"op":"epoch","vip":"nope"}`, http.StatusBadRequest, "malformed"},
	} {
		st, body := post(tc.body)
		if st != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
			t.Errorf("%s: %d %s", tc.name, st, body)
		}
	}
	resp, err := http.Get(ts.URL + claim.MembersPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", resp.StatusCode)
	}
	hs := s.HTTPServer("127.0.0.1:0")
	if hs.ReadHeaderTimeout == 0 || hs.ReadTimeout == 0 || hs.WriteTimeout == 0 || hs.MaxHeaderBytes == 0 {
		t.Fatalf("http server without limits: %+v", hs)
	}
}

func FuzzServer(f *testing.F) {
	fx := claimtest.NewFixture()
	f.Add([]byte(`{"op":"epoch","vip":"` + fx.VIP.String() + `"}`))
	f.Add([]byte(`{"op":"claim","claim":"` + base64.StdEncoding.EncodeToString(fx.Claim(fx.A, 2).Encode()) + `"}`))
	r, _ := claim.NewRelease(fx.B.Key, fx.Mesh, fx.VIP, fx.B.Addr, 2)
	f.Add([]byte(`{"op":"release","release":"` + base64.StdEncoding.EncodeToString(r.Encode()) + `"}`))
	e := newEnv(f, false)
	ctl := e.start("a")
	s := claim.NewServer(ctl)
	s.PeerAddr = func(*http.Request) (netip.Addr, error) { return fx.B.Addr, nil }
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, claim.MembersPath, bytes.NewReader(body))
		s.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusConflict, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
		default:
			t.Fatalf("status %d", rec.Code)
		}
	})
}
