//go:build linux

package keelvip

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/claim"
)

// testHelper builds a helper for node a of pair a/b (no interface: every
// request here is refused before the carrier is touched).
func testHelper(t *testing.T) (*helper, ed25519.PrivateKey, ed25519.PrivateKey, *claim.PairRecord) {
	ka, kb := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32)), ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, 32))
	a, b := netip.MustParseAddr("fd00:1::1:1"), netip.MustParseAddr("fd00:1::1:2")
	vip := netip.MustParseAddr("fd00:1::1:100")
	m := &Mesh{ID: "m1", Overlay: netip.MustParsePrefix("fd00:1::/64"), Self: Node{ID: "a", Addr: a, SignKey: ka}, VIP: vip,
		Peers: []Peer{{ID: "b", Addr: b, SignKey: claim.KeyOf(kb)}}}
	pol, err := m.Policy()
	if err != nil {
		t.Fatal(err)
	}
	pr, err := claim.NewPairRecord("m1", vip, claim.Member{Addr: a, Key: claim.KeyOf(ka)}, claim.Member{Addr: b, Key: claim.KeyOf(kb)})
	if err != nil {
		t.Fatal(err)
	}
	if err := pr.Sign(ka); err != nil {
		t.Fatal(err)
	}
	if err := pr.Sign(kb); err != nil {
		t.Fatal(err)
	}
	return &helper{m: m, pol: pol, pair: pr, log: slog.New(slog.DiscardHandler)}, ka, kb, pr
}

func post(h http.HandlerFunc, path string, body any, from string) *httptest.ResponseRecorder {
	b, _ := json.Marshal(body)
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(b))
	if from != "" {
		r.Header.Set(fromHeader, from)
	}
	w := httptest.NewRecorder()
	h(w, r)
	return w
}

// TestHelperRefusesCarrierRequests: the helper changes the interface only
// for a valid claim of the pair that justifies the change.
func TestHelperRefusesCarrierRequests(t *testing.T) {
	h, ka, kb, pr := testHelper(t)
	vip := h.m.VIP
	a, b := h.m.Self.Addr, h.m.Peers[0].Addr
	cb2, _ := claim.NewClaim(kb, b, 2, pr)
	ca1, _ := claim.NewClaim(ka, a, 1, pr)
	for _, tc := range []struct {
		name string
		req  carrierRequest
		code string
	}{
		{"carry without claim", carrierRequest{Op: "carry", VIP: vip.String()}, "malformed"},
		{"carry another node's claim", carrierRequest{Op: "carry", VIP: vip.String(), Claim: b64Claim(cb2)}, "not-holder"},
		{"carry another vip", carrierRequest{Op: "carry", VIP: "fd00:1::1:101", Claim: b64Claim(ca1)}, "unknown-vip"},
		{"route to a holder the claim does not name", carrierRequest{Op: "route", VIP: vip.String(), Holder: b.String(), Claim: b64Claim(ca1)}, "pair-mismatch"},
		{"carry a stale claim", carrierRequest{Op: "carry", VIP: vip.String(), Claim: b64Claim(ca1)}, "stale"},
		{"unknown op", carrierRequest{Op: "flush", VIP: vip.String()}, "malformed"},
		{"bad signature", carrierRequest{Op: "carry", VIP: vip.String(), Claim: b64(flipLast(ca1.Encode()))}, "bad-signature"},
	} {
		h.newest = nil // +checklocksignore: no request runs concurrently
		if tc.name == "carry a stale claim" {
			// The helper saw b's epoch 2 (a route request), so a's epoch 1 is stale.
			h.newest = cb2 // +checklocksignore: no request runs concurrently
		}
		w := post(h.serveCarrier, carrierPath, tc.req, "")
		if w.Code == http.StatusOK {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if tc.code != "" && !strings.Contains(w.Body.String(), `"code":"`+tc.code+`"`) {
			t.Errorf("%s: %d %s, want code %s", tc.name, w.Code, w.Body.String(), tc.code)
		}
	}
}

// TestHelperChecksMembers: the members' channel requests the listener
// forwards are verified before the controller sees them.
func TestHelperChecksMembers(t *testing.T) {
	h, ka, kb, pr := testHelper(t)
	a, b := h.m.Self.Addr, h.m.Peers[0].Addr
	cb2, _ := claim.NewClaim(kb, b, 2, pr)
	relB, _ := claim.NewRelease(kb, "m1", h.m.VIP, b, 2)
	relA, _ := claim.NewRelease(ka, "m1", h.m.VIP, a, 2)
	enc := func(v any) []byte { x, _ := json.Marshal(v); return x }
	for _, tc := range []struct {
		name string
		body []byte
		from netip.Addr
		want error
	}{
		{"claim from its holder", enc(map[string]string{"op": "claim", "claim": b64Claim(cb2)}), b, nil},
		{"claim from elsewhere", enc(map[string]string{"op": "claim", "claim": b64Claim(cb2)}), netip.MustParseAddr("fd00:1::2:3"), claim.ErrWrongSender},
		{"release from the other member", enc(map[string]string{"op": "release", "release": b64(relB.Encode())}), b, nil},
		{"release from self", enc(map[string]string{"op": "release", "release": b64(relA.Encode())}), a, claim.ErrNotPairMember},
		{"release relayed", enc(map[string]string{"op": "release", "release": b64(relB.Encode())}), netip.MustParseAddr("fd00:1::2:3"), claim.ErrWrongSender},
		{"hand-over from the other member", enc(map[string]string{"op": "handover", "vip": h.m.VIP.String()}), b, nil},
		{"hand-over from elsewhere", enc(map[string]string{"op": "handover", "vip": h.m.VIP.String()}), netip.MustParseAddr("fd00:1::2:3"), claim.ErrNotPairMember},
		{"hand-over for another vip", enc(map[string]string{"op": "handover", "vip": "fd00:1::1:101"}), b, claim.ErrUnknownVIP},
		{"unknown field", []byte(`{"op":"epoch","x":1}`), b, claim.ErrMalformed},
		{"trailing data", append(enc(map[string]string{"op": "claim", "claim": b64Claim(cb2)}), '}'), b, claim.ErrMalformed},
		{"unknown op", enc(map[string]string{"op": "take"}), b, claim.ErrMalformed},
		{"bad base64", enc(map[string]string{"op": "claim", "claim": "%%%"}), b, claim.ErrMalformed},
	} {
		err := h.checkMembers(tc.body, tc.from)
		if tc.want == nil && err != nil || tc.want != nil && !errorsIs(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func errorsIs(err, target error) bool { return err != nil && errorsIsStd(err, target) }

func flipLast(b []byte) []byte {
	b = bytes.Clone(b)
	b[len(b)-1] ^= 1
	return b
}

// FuzzCheckMembers: whatever the listener forwards, the helper's check
// never panics, and a refusal is one of the channel's sentinels.
func FuzzCheckMembers(f *testing.F) {
	h, _, kb, pr := testHelper(&testing.T{})
	cb2, _ := claim.NewClaim(kb, h.m.Peers[0].Addr, 2, pr)
	relB, _ := claim.NewRelease(kb, "m1", h.m.VIP, h.m.Peers[0].Addr, 2)
	for _, s := range []string{
		`{"op":"claim","claim":"` + b64Claim(cb2) + `"}`,
		`{"op":"release","release":"` + b64(relB.Encode()) + `"}`,
		`{"op":"epoch","vip":"fd00:1::1:100"}`, `{"op":"handover","vip":"fd00:1::1:100"}`, `{"op":"x"}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	from := h.m.Peers[0].Addr
	f.Fuzz(func(t *testing.T, body []byte) {
		err := h.checkMembers(body, from)
		if err == nil {
			return
		}
		if _, ok := claim.RefusalCode(err); !ok {
			t.Fatalf("refusal without a channel code: %v", err)
		}
	})
}

func BenchmarkHelperVerify(b *testing.B) {
	h, ka, _, pr := testHelper(&testing.T{})
	c, _ := claim.NewClaim(ka, h.m.Self.Addr, 1, pr)
	raw := b64Claim(c)
	b.ReportAllocs()
	for b.Loop() {
		h.newest = nil // +checklocksignore: no request runs concurrently
		if _, err := h.verify(h.m.VIP, raw); err != nil {
			b.Fatal(err)
		}
	}
}
