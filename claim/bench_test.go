package claim_test

import (
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
)

// BenchmarkVerifyClaim measures what a node pays per claim it reads or
// receives: decoding, the holder's signature, and the acceptance rules with
// the pair record's two signatures (cold: a new policy each time) or with
// the record already verified (cached, the steady state).
func BenchmarkVerifyClaim(b *testing.B) {
	f := claimtest.NewFixture()
	held := f.Claim(f.A, 1)
	raw := f.Claim(f.B, 2).Encode()
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if _, err := claim.ParseClaim(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("accept-cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p := f.Policy()
			c, err := claim.ParseClaim(raw)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Accept(held, f.Pair, c, f.B.Addr); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("accept-cached", func(b *testing.B) {
		p := f.Policy()
		b.ReportAllocs()
		for b.Loop() {
			c, err := claim.ParseClaim(raw)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Accept(held, f.Pair, c, f.B.Addr); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkSignClaim(b *testing.B) {
	f := claimtest.NewFixture()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := claim.NewClaim(f.A.Key, f.A.Addr, 7, f.Pair); err != nil {
			b.Fatal(err)
		}
	}
}
