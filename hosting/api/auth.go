package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/vipkit/vipkit/hosting"
)

// Bearer is an authentication middleware: a request must carry
// "Authorization: Bearer <token>" with one of the tokens, and runs under
// that token's principal (hosting.WithPrincipal), which the audit columns
// record. Anything else is answered 401 with a WWW-Authenticate challenge
// and reaches nothing.
type Bearer struct {
	tokens []bearerToken
}

type bearerToken struct {
	sum       [32]byte
	principal string
}

// ErrToken means a token or principal is empty, or a token is repeated.
var ErrToken = errors.New("api: bad bearer token")

// NewBearer returns the middleware for tokens (token → principal).
func NewBearer(tokens map[string]string) (*Bearer, error) {
	b := &Bearer{}
	seen := map[[32]byte]bool{}
	for tok, p := range tokens {
		if len(tok) < 16 || p == "" {
			return nil, errors.Join(ErrToken, errors.New("api: a token needs at least 16 characters and a principal"))
		}
		sum := sha256.Sum256([]byte(tok))
		if seen[sum] {
			return nil, ErrToken
		}
		seen[sum] = true
		b.tokens = append(b.tokens, bearerToken{sum, p})
	}
	if len(b.tokens) == 0 {
		return nil, errors.Join(ErrToken, errors.New("api: no token"))
	}
	return b, nil
}

// principal returns the principal of a presented token, comparing against
// every token in constant time.
func (b *Bearer) principal(tok string) (string, bool) {
	sum := sha256.Sum256([]byte(tok))
	found := ""
	for _, t := range b.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
			found = t.principal
		}
	}
	return found, found != ""
}

// Wrap returns next behind the middleware.
func (b *Bearer) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			if p, ok := b.principal(strings.TrimSpace(tok)); ok {
				next.ServeHTTP(w, r.WithContext(hosting.WithPrincipal(r.Context(), p)))
				return
			}
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="vipkit-hosting"`)
		writeProblem(w, r, Problem{Type: TypeUnauth, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "a valid bearer token is required"})
	})
}
