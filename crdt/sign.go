package crdt

import (
	"crypto/ed25519"
	"fmt"
	"runtime"
	"sync"

	"github.com/hdevalence/ed25519consensus"
)

// Sign sets f.Author to priv's public key and f.Signature to priv's
// Ed25519 signature over f's signing message (AppendSigningMessage).
func Sign(priv ed25519.PrivateKey, f *Field) {
	copy(f.Author[:], priv.Public().(ed25519.PublicKey))
	msg := f.AppendSigningMessage(make([]byte, 0, len(Domain)+f.encodedLenSig(0)))
	f.Signature = ed25519.Sign(priv, msg)
}

// VerifySignature checks f's signature by f.Author under ZIP-215 rules (the
// rules every replica applies, single or batched; see the package doc). It
// returns nil, or an error wrapping ErrSignatureLength, ErrWrongDomain or
// ErrBadSignature. Membership and network are the Replica's checks.
func VerifySignature(f *Field) error {
	if len(f.Signature) != SignatureSize {
		return fmt.Errorf("%w: %d bytes", ErrSignatureLength, len(f.Signature))
	}
	raw := f.Encode()
	return verifyOne(raw[:len(raw)-1-SignatureSize], f.Author, f.Signature, nil)
}

// otherDomains are signing domains tried after a signature has failed, to
// tell a field signed for another purpose (ErrWrongDomain) from a forged
// or altered one (ErrBadSignature). Only failures pay for them.
var otherDomains = []string{
	"",
	"tsunagi-vip-field/v1",
	"tsunagi-vip-field/v0\x00",
	"tsunagi-vip-field/v2\x00",
}

// verifyOne checks sig over Domain, unsigned and an empty signature vector.
// buf is scratch space (may be nil).
func verifyOne(unsigned []byte, author AuthorID, sig []byte, buf []byte) error {
	msg := signingMessage(buf[:0], Domain, unsigned)
	if ed25519consensus.Verify(author[:], msg, sig) {
		return nil
	}
	for _, d := range otherDomains {
		if ed25519consensus.Verify(author[:], signingMessage(msg[:0], d, unsigned), sig) {
			return ErrWrongDomain
		}
	}
	return ErrBadSignature
}

func signingMessage(b []byte, domain string, unsigned []byte) []byte {
	b = append(b, domain...)
	b = append(b, unsigned...)
	return append(b, 0)
}

// parallelMin is the number of signatures below which verification stays
// on the calling goroutine.
const parallelMin = 384

// verifyParsed verifies the signatures of ps under ZIP-215. Batches of up
// to batchMax fields are verified together, split over GOMAXPROCS
// goroutines when there are many; a batch that fails is verified field by
// field to name the bad ones. errs[i] is set for each bad field; it
// returns whether any was bad. All goroutines have returned when it does.
func verifyParsed(ps []*parsed, errs []error) bool {
	workers := runtime.GOMAXPROCS(0)
	if workers > 1 && len(ps) >= parallelMin {
		if workers > len(ps)/(parallelMin/2) {
			workers = len(ps) / (parallelMin / 2)
		}
		chunk := (len(ps) + workers - 1) / workers
		var wg sync.WaitGroup
		bad := make([]bool, workers)
		for w := 0; w < workers; w++ {
			lo, hi := w*chunk, min((w+1)*chunk, len(ps))
			if lo >= hi {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				bad[w] = verifyRange(ps[lo:hi], errs[lo:hi])
			}()
		}
		wg.Wait()
		for _, b := range bad {
			if b {
				return true
			}
		}
		return false
	}
	return verifyRange(ps, errs)
}

// batchMax bounds one batch, so that a single bad field costs a bounded
// number of single verifications.
const batchMax = 1024

func verifyRange(ps []*parsed, errs []error) bool {
	bad := false
	var buf []byte
	for lo := 0; lo < len(ps); lo += batchMax {
		hi := min(lo+batchMax, len(ps))
		if hi-lo == 1 {
			p := ps[lo]
			if err := verifyOne(p.raw[:p.sigOff], p.author, p.sig, buf); err != nil {
				errs[lo] = err
				bad = true
			}
			continue
		}
		bv := ed25519consensus.NewPreallocatedBatchVerifier(hi - lo)
		for _, p := range ps[lo:hi] {
			buf = signingMessage(buf[:0], Domain, p.raw[:p.sigOff])
			bv.Add(p.author[:], buf, p.sig)
		}
		if bv.Verify() {
			continue
		}
		for i := lo; i < hi; i++ {
			p := ps[i]
			if err := verifyOne(p.raw[:p.sigOff], p.author, p.sig, buf); err != nil {
				errs[i] = err
				bad = true
			}
		}
	}
	return bad
}
