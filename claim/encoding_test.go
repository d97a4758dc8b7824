package claim_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
	"github.com/vipkit/vipkit/internal/testenv"
)

func golden(t testing.TB) map[string][]byte {
	f, err := os.Open("testdata/golden.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, h, _ := strings.Cut(line, " ")
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("golden %s: %v", name, err)
		}
		out[name] = b
	}
	return out
}

func TestGoldenVectors(t *testing.T) {
	g := golden(t)
	f := claimtest.NewFixture()
	pr, err := f.Pair.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pr, g["pair"]) {
		t.Errorf("pair record encoding changed:\n got %x\nwant %x", pr, g["pair"])
	}
	c := f.Claim(f.A, 1)
	if !bytes.Equal(c.Encode(), g["claim"]) {
		t.Errorf("claim encoding changed:\n got %x\nwant %x", c.Encode(), g["claim"])
	}
	r, _ := claim.NewRelease(f.B.Key, f.Mesh, f.VIP, f.B.Addr, 2)
	if !bytes.Equal(r.Encode(), g["release"]) {
		t.Errorf("release encoding changed:\n got %x\nwant %x", r.Encode(), g["release"])
	}
	pc, err := claim.ParseClaim(g["claim"])
	if err != nil || pc.Epoch != 1 || pc.Holder != f.A.Addr || pc.VIP != f.VIP || pc.Mesh != "home" || pc.HolderKey != f.A.Pub() {
		t.Fatalf("parse golden claim: %v %v", pc, err)
	}
	if !pc.Equal(c) {
		t.Fatal("parsed golden claim differs from the signed one")
	}
	pp, err := claim.ParsePairRecord(g["pair"])
	if err != nil || !pp.SameMembers(f.Pair) || len(pp.Sigs) != 2 {
		t.Fatalf("parse golden pair: %v", err)
	}
	pr2, err := claim.ParseRelease(g["release"])
	if err != nil || pr2.NextEpoch != 2 || pr2.From != f.B.Addr {
		t.Fatalf("parse golden release: %v", err)
	}
}

// TestEveryByteOfAClaimMatters changes each byte of a claim in turn: every
// change is refused, by the parser or by the acceptance rules.
func TestEveryByteOfAClaimMatters(t *testing.T) {
	f := claimtest.NewFixture()
	p := f.Policy()
	raw := f.Claim(f.A, 2).Encode()
	held := f.Claim(f.A, 1)
	if _, err := claim.ParseClaim(raw); err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			b := bytes.Clone(raw)
			b[i] ^= x
			c, err := claim.ParseClaim(b)
			if err == nil {
				err = p.Accept(held, f.Pair, c, f.A.Addr)
			}
			if err == nil {
				t.Fatalf("byte %d ^ %#x accepted", i, x)
			}
		}
	}
	// Truncations and extensions.
	for n := 0; n < len(raw); n++ {
		if _, err := claim.ParseClaim(raw[:n]); err == nil {
			t.Fatalf("truncated to %d accepted", n)
		}
	}
	if _, err := claim.ParseClaim(append(bytes.Clone(raw), 0)); !errors.Is(err, claim.ErrMalformed) {
		t.Fatalf("trailing byte: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	f := claimtest.NewFixture()
	raw := f.Claim(f.A, 1).Encode()
	ver := bytes.Clone(raw)
	ver[0] = 2
	kind := bytes.Clone(raw)
	kind[1] = 'P'
	sig := bytes.Clone(raw)
	sig[len(sig)-1] ^= 1
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, claim.ErrMalformed},
		{"version", ver, claim.ErrVersion},
		{"kind", kind, claim.ErrMalformed},
		{"signature", sig, claim.ErrBadSignature},
		{"huge", make([]byte, claim.MaxMessageSize+1), claim.ErrTooLarge},
	} {
		if _, err := claim.ParseClaim(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestNewerOrder(t *testing.T) {
	f := claimtest.NewFixture()
	a1, a2, b1 := f.Claim(f.A, 1), f.Claim(f.A, 2), f.Claim(f.B, 1)
	ka, kb := f.A.Pub(), f.B.Pub()
	lowA := bytes.Compare(ka[:], kb[:]) < 0
	if !a2.Newer(a1) || a1.Newer(a2) || !a1.Newer(nil) || a1.Newer(a1) {
		t.Fatal("epoch order broken")
	}
	if a1.Newer(b1) != lowA || b1.Newer(a1) == lowA {
		t.Fatal("equal epochs must go to the lower public key")
	}
}

func TestPairRecordRefusals(t *testing.T) {
	f := claimtest.NewFixture()
	a := claim.Member{Addr: f.A.Addr, Key: f.A.Pub()}
	b := claim.Member{Addr: f.B.Addr, Key: f.B.Pub()}
	far := netip.MustParseAddr("fd7a:115c:a1e0::2:100") // another /112
	for _, tc := range []struct {
		name string
		vip  netip.Addr
		x, y claim.Member
		want error
	}{
		{"vip is a member", f.A.Addr, a, b, claim.ErrVIPIsMember},
		{"vip outside region", far, a, b, claim.ErrVIPOutsideRegion},
		{"same member twice", f.VIP, a, a, claim.ErrMalformed},
		{"ipv4 vip", netip.MustParseAddr("10.0.0.1"), a, b, claim.ErrMalformed},
	} {
		if _, err := claim.NewPairRecord(f.Mesh, tc.vip, tc.x, tc.y); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	p := f.Policy()
	// Signatures: both members, a member and a root, not one member alone,
	// not an outsider.
	for _, tc := range []struct {
		name    string
		signers []claimtest.Node
		root    bool
		want    error
	}{
		{"both members", []claimtest.Node{f.A, f.B}, false, nil},
		{"member and root", []claimtest.Node{f.A}, true, nil},
		{"one member", []claimtest.Node{f.A}, false, claim.ErrPairSignatures},
		{"member and outsider", []claimtest.Node{f.A, f.D}, false, claim.ErrPairSignatures},
	} {
		pr := f.NewPair(f.VIP, f.A, f.B)
		for _, n := range tc.signers {
			pr.Sign(n.Key)
		}
		if tc.root {
			pr.Sign(f.Root)
		}
		p2 := f.Policy()
		if err := p2.CheckPair(nil, pr); !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// A record that names other members than the kept one.
	other := f.NewPair(f.VIP, f.A, f.C, f.A.Key, f.C.Key)
	if err := p.CheckPair(f.Pair, other); !errors.Is(err, claim.ErrPairChanged) {
		t.Errorf("changed members: %v", err)
	}
	// A tampered record: the signatures no longer verify.
	enc, _ := f.Pair.Encode()
	enc[20] ^= 1
	if _, err := claim.ParsePairRecord(enc); err == nil {
		t.Error("tampered pair record parsed")
	}
}

func FuzzParseClaim(f *testing.F) {
	g := golden(f)
	for _, b := range g {
		f.Add(b)
	}
	fx := claimtest.NewFixture()
	f.Add(fx.Claim(fx.B, 7).Encode())
	p := fx.Policy()
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := claim.ParseClaim(b)
		if err != nil {
			return
		}
		// A parsed claim re-encodes to the same bytes and is checkable.
		if !bytes.Equal(c.Encode(), b) {
			t.Fatalf("re-encoding differs")
		}
		_ = p.Accept(nil, nil, c, netip.Addr{})
	})
}

func FuzzParsePairRecord(f *testing.F) {
	g := golden(f)
	f.Add(g["pair"])
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := claim.ParsePairRecord(b)
		if err != nil {
			return
		}
		enc, err := p.Encode()
		if err != nil || !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

func FuzzParseRelease(f *testing.F) {
	g := golden(f)
	f.Add(g["release"])
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := claim.ParseRelease(b)
		if err != nil {
			return
		}
		if !bytes.Equal(r.Encode(), b) {
			t.Fatal("re-encoding differs")
		}
	})
}

func FuzzParseTrust(f *testing.F) {
	f.Add([]byte(`{"nodes":[{"id":"a","addr":"fd7a::1","key":"MeJrgF4siOM4/qxmIUyczE094tYgS3JkfVUTiYxAs3s="}],"roots":[]}`))
	f.Add([]byte(`{"nodes":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = claim.ParseTrust(bytes.NewReader(b))
	})
}

func FuzzUnmarshalState(f *testing.F) {
	fx := claimtest.NewFixture()
	good, _ := claim.MarshalState(claim.State{Held: fx.Claim(fx.A, 3), Pair: fx.Pair, Lease: 7})
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := claim.UnmarshalState(b)
		if err != nil {
			if !errors.Is(err, claim.ErrCorruptState) {
				t.Fatalf("error %v does not match ErrCorruptState", err)
			}
			return
		}
		if _, err := claim.MarshalState(s); err != nil {
			t.Fatal(err)
		}
	})
}

// TestNewerIsTotalOrder checks Newer against a naive model: sorting by
// (epoch descending, key ascending).
func TestNewerIsTotalOrder(t *testing.T) {
	f := claimtest.NewFixture()
	seed := testenv.Seed(t, 9)
	rng := rand.New(rand.NewPCG(seed, 2))
	var cs []*claim.Claim
	for i := 0; i < 40; i++ {
		n := []claimtest.Node{f.A, f.B}[rng.IntN(2)]
		cs = append(cs, f.Claim(n, 1+uint64(rng.IntN(8))))
	}
	model := func(x, y *claim.Claim) bool {
		if x.Epoch != y.Epoch {
			return x.Epoch > y.Epoch
		}
		kx, ky := x.HolderKey, y.HolderKey
		return bytes.Compare(kx[:], ky[:]) < 0
	}
	for _, x := range cs {
		for _, y := range cs {
			if x.Newer(y) != model(x, y) {
				t.Fatalf("Newer(%v, %v) = %v, model %v", x, y, x.Newer(y), model(x, y))
			}
			if x.Newer(y) && y.Newer(x) {
				t.Fatal("Newer is not antisymmetric")
			}
		}
	}
}
