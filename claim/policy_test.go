package claim_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/internal/testenv"
)

func TestAcceptRules(t *testing.T) {
	f := claimtest.NewFixture()
	a1, a3, b2 := f.Claim(f.A, 1), f.Claim(f.A, 3), f.Claim(f.B, 2)
	// A claim signed by a member for the pair, but for another mesh.
	otherMeshPair := func() *claim.PairRecord {
		p, _ := claim.NewPairRecord("work", f.VIP, claim.Member{Addr: f.A.Addr, Key: f.A.Pub()}, claim.Member{Addr: f.B.Addr, Key: f.B.Pub()})
		p.Sign(f.A.Key)
		p.Sign(f.B.Key)
		return p
	}()
	wrongMesh, _ := claim.NewClaim(f.A.Key, f.A.Addr, 5, otherMeshPair)
	// D (trusted, not a member) signs a claim under a pair naming it.
	dPair := f.NewPair(f.VIP, f.A, f.D, f.A.Key, f.D.Key)
	byOutsider, _ := claim.NewClaim(f.D.Key, f.D.Addr, 5, dPair)
	// An unknown node: its address is not in the trust store.
	ghost := claimtest.Node{Name: "g", Addr: netip.MustParseAddr("fd7a:115c:a1e0::1:9"), Key: claimtest.KeyFor("g")}
	gPair, _ := claim.NewPairRecord(f.Mesh, f.VIP, claim.Member{Addr: f.A.Addr, Key: f.A.Pub()}, claim.Member{Addr: ghost.Addr, Key: ghost.Pub()})
	gPair.Sign(f.A.Key)
	gPair.Sign(ghost.Key)
	byGhost, _ := claim.NewClaim(ghost.Key, ghost.Addr, 5, gPair)
	// B's address with another key (a stolen address).
	imp := claimtest.Node{Name: "imp", Addr: f.B.Addr, Key: claimtest.KeyFor("imp")}
	iPair := f.NewPair(f.VIP, f.A, imp, f.A.Key, imp.Key)
	byImpostor, _ := claim.NewClaim(imp.Key, imp.Addr, 5, iPair)
	// A pair signed by A alone.
	half := f.NewPair(f.VIP, f.A, f.B, f.A.Key)
	byHalf, _ := claim.NewClaim(f.A.Key, f.A.Addr, 5, half)
	// A pair completed by the trust root.
	rooted := f.NewPair(f.VIP, f.A, f.B, f.A.Key, f.Root)
	byRooted, _ := claim.NewClaim(f.B.Key, f.B.Addr, 4, rooted)
	// A pair for another VIP of the region, with the same members.
	vip2 := netip.MustParseAddr("fd7a:115c:a1e0::1:200")
	p2 := f.NewPair(vip2, f.A, f.B, f.A.Key, f.B.Key)
	forVIP2, _ := claim.NewClaim(f.A.Key, f.A.Addr, 5, p2)

	for _, tc := range []struct {
		name string
		held *claim.Claim
		kept *claim.PairRecord
		c    *claim.Claim
		from netip.Addr
		want error
	}{
		{"first claim", nil, nil, a1, f.A.Addr, nil},
		{"newer epoch", a1, f.Pair, b2, f.B.Addr, nil},
		{"from the kv (no sender)", a1, f.Pair, b2, netip.Addr{}, nil},
		{"pair completed by a root", b2, f.Pair, byRooted, f.B.Addr, nil},
		{"replay of the held claim", a1, f.Pair, a1, f.A.Addr, claim.ErrStale},
		{"replay of an old claim", b2, f.Pair, a1, f.A.Addr, claim.ErrStale},
		{"equal epoch, higher key", tieLoser(f, 2), f.Pair, tieWinner(f, 2), netip.Addr{}, nil},
		{"equal epoch, lower key held", tieWinner(f, 2), f.Pair, tieLoser(f, 2), netip.Addr{}, claim.ErrStale},
		{"jump of 64", a1, f.Pair, f.Claim(f.B, 65), f.B.Addr, nil},
		{"jump of 65", a1, f.Pair, f.Claim(f.B, 66), f.B.Addr, claim.ErrEpochJump},
		{"wrong mesh", a1, nil, wrongMesh, f.A.Addr, claim.ErrWrongMesh},
		{"wrong sender", a1, f.Pair, b2, f.C.Addr, claim.ErrWrongSender},
		{"unknown node", a1, nil, byGhost, ghost.Addr, claim.ErrUnknownNode},
		{"key not the trust store's", a1, nil, byImpostor, f.B.Addr, claim.ErrUntrustedKey},
		{"pair not signed by both", a1, nil, byHalf, f.A.Addr, claim.ErrPairSignatures},
		{"members other than kept", a1, f.Pair, byOutsider, f.D.Addr, claim.ErrPairChanged},
		{"pair for another vip than kept", a1, f.Pair, forVIP2, f.A.Addr, claim.ErrPairChanged},
		{"held a3, newer b2? no", a3, f.Pair, b2, f.B.Addr, claim.ErrStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := f.Policy().Accept(tc.held, tc.kept, tc.c, tc.from)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Accept = %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				code, ok := claim.RefusalCode(err)
				if !ok || code == "" {
					t.Fatalf("refusal %v has no wire code", err)
				}
			}
		})
	}
	// Outside the overlay prefix.
	p := f.Policy()
	p.Overlay = netip.MustParsePrefix("fd00::/16")
	if err := p.Accept(nil, nil, a1, f.A.Addr); !errors.Is(err, claim.ErrVIPOutsidePrefix) {
		t.Fatalf("vip outside overlay: %v", err)
	}
}

func tieWinner(f *claimtest.Fixture, e uint64) *claim.Claim {
	a, b := f.Claim(f.A, e), f.Claim(f.B, e)
	if a.Newer(b) {
		return a
	}
	return b
}

func tieLoser(f *claimtest.Fixture, e uint64) *claim.Claim {
	a, b := f.Claim(f.A, e), f.Claim(f.B, e)
	if a.Newer(b) {
		return b
	}
	return a
}

func TestValidateVIP(t *testing.T) {
	f := claimtest.NewFixture()
	peerNet := netip.MustParsePrefix("fd7a:115c:a1e0::1:180/121")
	for _, tc := range []struct {
		name string
		vip  netip.Addr
		want error
	}{
		{"ok", f.VIP, nil},
		{"outside prefix", netip.MustParseAddr("fd00::1:100"), claim.ErrVIPOutsidePrefix},
		{"own address", f.A.Addr, claim.ErrVIPIsMember},
		{"outside region", netip.MustParseAddr("fd7a:115c:a1e0::2:100"), claim.ErrVIPOutsideRegion},
		{"in a peer's allowed ips", netip.MustParseAddr("fd7a:115c:a1e0::1:181"), claim.ErrVIPInPeerAllowedIPs},
		{"ipv4", netip.MustParseAddr("192.0.2.1"), claim.ErrMalformed},
	} {
		err := claim.ValidateVIP(tc.vip, f.Overlay, f.A.Addr, []netip.Prefix{peerNet, netip.PrefixFrom(f.B.Addr, 128)})
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestAllocateModel checks Allocate against a naive model: the result is
// in the holder's /112, not reserved, not in a peer's allowed IPs, not the
// region's first address, and ErrRegionFull exactly when the model finds
// nothing free.
func TestAllocateModel(t *testing.T) {
	seed := testenv.Seed(t, 6)
	rng := rand.New(rand.NewPCG(seed, 1))
	f := claimtest.NewFixture()
	region := claim.Region(f.A.Addr)
	for i := 0; i < 200; i++ {
		var reserved []netip.Addr
		base := region.Addr().As16()
		for j := rng.IntN(50); j > 0; j-- {
			a := base
			a[14], a[15] = 0, byte(rng.IntN(256))
			reserved = append(reserved, netip.AddrFrom16(a))
		}
		var peers []netip.Prefix
		if rng.IntN(2) == 0 {
			a := base
			a[14] = byte(rng.IntN(256))
			peers = append(peers, netip.PrefixFrom(netip.AddrFrom16(a), 120+rng.IntN(9)).Masked())
		}
		got, err := claim.Allocate(f.Overlay, f.A.Addr, reserved, peers, rng)
		if err != nil {
			t.Fatalf("allocate %d: %v", i, err)
		}
		if !region.Contains(got) || got == region.Addr() || got == f.A.Addr {
			t.Fatalf("allocated %v outside the region or on a reserved address", got)
		}
		for _, r := range reserved {
			if r == got {
				t.Fatalf("allocated reserved %v", got)
			}
		}
		for _, p := range peers {
			if p.Contains(got) {
				t.Fatalf("allocated %v inside peer %v", got, p)
			}
		}
		if err := claim.ValidateVIP(got, f.Overlay, f.A.Addr, peers); err != nil {
			t.Fatalf("allocated vip fails validation: %v", err)
		}
	}
	// A full region: every address but the holder's is in a peer's range.
	_, err := claim.Allocate(f.Overlay, f.A.Addr, nil, []netip.Prefix{region}, nil)
	if !errors.Is(err, claim.ErrRegionFull) {
		t.Fatalf("full region: %v", err)
	}
	// Without rng, the first free address from the bottom.
	got, _ := claim.Allocate(f.Overlay, f.A.Addr, []netip.Addr{f.B.Addr}, nil, nil)
	if got != netip.MustParseAddr("fd7a:115c:a1e0::1:3") {
		t.Fatalf("first free = %v", got)
	}
}

func TestTrustFile(t *testing.T) {
	dir := t.TempDir()
	good := `{"nodes":[{"id":"a","addr":"fd7a::1","key":"MeJrgF4siOM4/qxmIUyczE094tYgS3JkfVUTiYxAs3s="}],"roots":["DqxevuuZmuMkymOlu8NPtl3OleOXBVDYAPZqw20o0TfA"]}`
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"good", strings.Replace(good, `"DqxevuuZmuMkymOlu8NPtl3OleOXBVDYAPZqw20o0TfA"`, `"DqxevuuZmuMkymOlu8NPtl3OleOXBVDYAPZqw20o0Tc="`, 1), true},
		{"bad root", good, false},
		{"dup addr", `{"nodes":[{"id":"a","addr":"fd7a::1","key":"MeJrgF4siOM4/qxmIUyczE094tYgS3JkfVUTiYxAs3s="},{"id":"b","addr":"fd7a::1","key":"MeJrgF4siOM4/qxmIUyczE094tYgS3JkfVUTiYxAs3s="}]}`, false},
		{"unknown field", `{"nodes":[],"extra":1}`, false},
		{"trailing data", `{"nodes":[]} {"nodes":[]}`, false},
		{"ipv4", `{"nodes":[{"id":"a","addr":"10.0.0.1","key":"MeJrgF4siOM4/qxmIUyczE094tYgS3JkfVUTiYxAs3s="}]}`, false},
		{"short key", `{"nodes":[{"id":"a","addr":"fd7a::1","key":"AAAA"}]}`, false},
	} {
		p := filepath.Join(dir, tc.name+".json")
		os.WriteFile(p, []byte(tc.body), 0o600)
		tr, err := claim.LoadTrustFile(p)
		if tc.ok != (err == nil) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !tc.ok && !errors.Is(err, claim.ErrTrust) {
			t.Errorf("%s: %v does not match ErrTrust", tc.name, err)
		}
		if tc.ok {
			if _, ok := tr.KeyByAddr(netip.MustParseAddr("fd7a::1")); !ok {
				t.Error("node not found by address")
			}
			if _, ok := tr.KeyByID("a"); !ok {
				t.Error("node not found by id")
			}
		}
	}
}
