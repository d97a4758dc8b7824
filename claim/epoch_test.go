package claim_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
)

// TestEpochBoundaries: every epoch operation is checked. A claim or
// release whose epoch cannot be followed (above claim.MaxEpoch, so
// MaxUint64-1 and MaxUint64 among them) is refused with
// ErrEpochExhausted, also by a node that holds no claim yet, and the
// freshness window never wraps.
func TestEpochBoundaries(t *testing.T) {
	f := claimtest.NewFixture()
	p := f.Policy()
	for _, tc := range []struct {
		held, next uint64 // held 0: none
		want       error
	}{
		{0, math.MaxUint64, claim.ErrEpochExhausted},
		{0, math.MaxUint64 - 1, claim.ErrEpochExhausted},
		{0, claim.MaxEpoch + 1, claim.ErrEpochExhausted},
		{0, claim.MaxEpoch, nil},
		{math.MaxUint64 - 1, math.MaxUint64, claim.ErrEpochExhausted},
		{claim.MaxEpoch - 1, claim.MaxEpoch, nil},
		{claim.MaxEpoch - claim.MaxEpochJump, claim.MaxEpoch, nil},
		{claim.MaxEpoch - claim.MaxEpochJump - 1, claim.MaxEpoch, claim.ErrEpochJump},
		{1, 1 + claim.MaxEpochJump, nil},
		{1, 2 + claim.MaxEpochJump, claim.ErrEpochJump},
	} {
		var held *claim.Claim
		if tc.held != 0 {
			held = f.Claim(f.A, tc.held)
		}
		c := f.Claim(f.B, tc.next)
		if err := p.Accept(held, nil, c, f.B.Addr); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("claim %d over held %d: %v, want %v", tc.next, tc.held, err, tc.want)
		}
		if held == nil {
			continue
		}
		r, err := claim.NewRelease(f.B.Key, f.Mesh, f.VIP, f.B.Addr, tc.next)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AcceptRelease(f.A.Addr, held, f.Pair, r, f.B.Addr); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("release for %d over held %d: %v, want %v", tc.next, tc.held, err, tc.want)
		}
	}
}

// TestClaimAfterLastEpochRefused: a counter at an epoch that cannot be
// followed makes a promote fail with ErrEpochExhausted (the next epoch
// would wrap to 0) and writes nothing.
func TestClaimAfterLastEpochRefused(t *testing.T) {
	for _, top := range []uint64{math.MaxUint64, math.MaxUint64 - 1, claim.MaxEpoch} {
		e := newEnv(t, true)
		e.start("a")
		e.start("b")
		e.advance(100 * time.Millisecond)
		keys := claim.KeysFor(e.f.Mesh, e.f.VIP)
		last := e.f.Claim(e.f.A, top)
		if _, err := e.mkv.Txn(context.Background(), claim.Txn{Then: []claim.Op{claim.Put(keys.Epoch, last.Encode(), 0)}}); err != nil {
			t.Fatal(err)
		}
		e.advance(3 * time.Second)
		_, err := e.m("b").Ctl().Promote(context.Background(), claim.PromoteOptions{OldPrimaryGone: true})
		if !errors.Is(err, claim.ErrEpochExhausted) {
			t.Errorf("counter at %d: promote %v, want ErrEpochExhausted", top, err)
		}
		g, err := e.mkv.Get(context.Background(), keys.Epoch, false)
		if err != nil || len(g.KVs) != 1 || string(g.KVs[0].Value) != string(last.Encode()) {
			t.Errorf("counter at %d changed: %v %v", top, g.KVs, err)
		}
		if e.m("b").Carrier.Carried(e.f.VIP) {
			t.Errorf("counter at %d: b carries", top)
		}
	}
}

// TestClientFollowsNoRedirect: a peer that answers with a redirect gets an
// error, and the client never calls where it points.
func TestClientFollowsNoRedirect(t *testing.T) {
	var hit atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit.Add(1) }))
	defer target.Close()
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+claim.MembersPath, code)
		}))
		f := claimtest.NewFixture()
		for _, hc := range []*http.Client{nil, {Timeout: 5 * time.Second}} {
			cl := &claim.Client{HTTP: hc, URL: func(netip.Addr) string { return redirect.URL + claim.MembersPath }}
			err := cl.Announce(context.Background(), f.B.Addr, f.Claim(f.A, 1))
			if !errors.Is(err, claim.ErrRedirect) {
				t.Errorf("status %d: %v, want ErrRedirect", code, err)
			}
		}
		redirect.Close()
	}
	if n := hit.Load(); n != 0 {
		t.Errorf("the redirect's target was called %d times", n)
	}
}
