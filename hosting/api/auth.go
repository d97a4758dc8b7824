package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/vipkit/vipkit/hosting"
)

// Scope is the set of accounts a request may act on: every account
// (AllAccounts) or the listed ones (AccountScope). The zero Scope allows
// nothing; NewBearer refuses it.
type Scope struct {
	all      bool
	accounts []string // sorted, unique, none empty
}

// ErrScope means a scope is empty or names an empty account.
var ErrScope = errors.New("api: bad scope")

// AllAccounts returns the scope of every account.
func AllAccounts() Scope { return Scope{all: true} }

// AccountScope returns the scope of the given accounts. It refuses an
// empty list and an empty account id with ErrScope.
func AccountScope(accounts ...string) (Scope, error) {
	if len(accounts) == 0 {
		return Scope{}, fmt.Errorf("%w: no account", ErrScope)
	}
	ids := slices.Clone(accounts)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if ids[0] == "" {
		return Scope{}, fmt.Errorf("%w: an empty account id", ErrScope)
	}
	return Scope{accounts: ids}, nil
}

// All reports whether the scope is every account.
func (s Scope) All() bool { return s.all }

// Accounts returns the accounts of a listed scope, sorted (nil for
// AllAccounts and for the zero Scope).
func (s Scope) Accounts() []string { return slices.Clone(s.accounts) }

// Empty reports whether the scope allows nothing (the zero Scope).
func (s Scope) Empty() bool { return !s.all && len(s.accounts) == 0 }

// Allows reports whether the scope takes account.
func (s Scope) Allows(account string) bool {
	if s.all {
		return true
	}
	_, ok := slices.BinarySearch(s.accounts, account)
	return ok
}

// String returns "all" or the accounts, comma-separated.
func (s Scope) String() string {
	if s.all {
		return "all"
	}
	return strings.Join(s.accounts, ",")
}

type scopeKey struct{}

// WithScope returns ctx carrying the scope the handler enforces. Bearer
// sets it; another authentication middleware in front of the Handler
// sets it the same way.
func WithScope(ctx context.Context, s Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

// ScopeOf returns the scope in ctx and whether there is one. A request
// without one acts on every account: the Handler without an
// authentication middleware is open.
func ScopeOf(ctx context.Context) (Scope, bool) {
	s, ok := ctx.Value(scopeKey{}).(Scope)
	return s, ok
}

// allows reports whether the request's scope takes account.
func allows(r *http.Request, account string) bool {
	s, ok := ScopeOf(r.Context())
	return !ok || s.Allows(account)
}

// Token is a bearer token: its secret, the principal that the audit
// columns record, and the accounts it may act on. Its String and
// GoString never show the secret.
type Token struct {
	Secret    string
	Principal string
	Scope     Scope
}

// String returns the principal and the scope, never the secret.
func (t Token) String() string { return t.Principal + " (accounts: " + t.Scope.String() + ")" }

// GoString is String, so that %#v does not print the secret either.
func (t Token) GoString() string { return "api.Token{" + t.String() + "}" }

// Bearer is an authentication middleware: a request must carry
// "Authorization: Bearer <token>" with one of the tokens, and runs under
// that token's principal (hosting.WithPrincipal), which the audit columns
// record, and its scope (WithScope), which the Handler enforces. Anything
// else is answered 401 with a WWW-Authenticate challenge and reaches
// nothing.
type Bearer struct {
	tokens []bearerToken
}

type bearerToken struct {
	sum       [32]byte
	principal string
	scope     Scope
}

// ErrToken means a token is short, repeated, or lacks a principal or a
// scope, or there is no token.
var ErrToken = errors.New("api: bad bearer token")

// MinTokenLength is the shortest secret NewBearer takes.
const MinTokenLength = 16

// NewBearer returns the middleware for tokens. Each needs a secret of at
// least MinTokenLength characters, a principal and a scope that is not
// empty; no secret may repeat. Errors name the principal, never the
// secret.
func NewBearer(tokens []Token) (*Bearer, error) {
	b := &Bearer{}
	seen := map[[32]byte]bool{}
	for _, t := range tokens {
		switch {
		case t.Principal == "":
			return nil, fmt.Errorf("%w: a token without a principal", ErrToken)
		case len(t.Secret) < MinTokenLength:
			return nil, fmt.Errorf("%w: %s: a token needs at least %d characters", ErrToken, t.Principal, MinTokenLength)
		case t.Scope.Empty():
			return nil, fmt.Errorf("%w: %s: an empty scope; give accounts or AllAccounts", ErrToken, t.Principal)
		}
		sum := sha256.Sum256([]byte(t.Secret))
		if seen[sum] {
			return nil, fmt.Errorf("%w: %s: a token is given twice", ErrToken, t.Principal)
		}
		seen[sum] = true
		b.tokens = append(b.tokens, bearerToken{sum, t.Principal, t.Scope})
	}
	if len(b.tokens) == 0 {
		return nil, fmt.Errorf("%w: no token", ErrToken)
	}
	return b, nil
}

// find returns the token presented, comparing against every token in
// constant time (the loop neither stops early nor branches on a match).
func (b *Bearer) find(tok string) (bearerToken, bool) {
	sum := sha256.Sum256([]byte(tok))
	idx := -1
	for i, t := range b.tokens {
		eq := subtle.ConstantTimeCompare(sum[:], t.sum[:])
		idx = subtle.ConstantTimeSelect(eq, i, idx)
	}
	if idx < 0 {
		return bearerToken{}, false
	}
	return b.tokens[idx], true
}

// Wrap returns next behind the middleware.
func (b *Bearer) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			if t, ok := b.find(strings.TrimSpace(tok)); ok {
				ctx := WithScope(hosting.WithPrincipal(r.Context(), t.principal), t.scope)
				next.ServeHTTP(w, r.WithContext(ctx))
				return
			}
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="vipkit-hosting"`)
		writeProblem(w, r, Problem{Type: TypeUnauth, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "a valid bearer token is required"})
	})
}
