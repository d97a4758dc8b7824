package hosting

import "context"

// SystemPrincipal is the principal of a change made without one in its
// context (an event consumer, a migration).
const SystemPrincipal = "system"

type principalKey struct{}

// WithPrincipal returns ctx carrying the principal (a user or client name)
// that the audit columns record for the writes made under it.
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// PrincipalOf returns the principal in ctx, or SystemPrincipal.
func PrincipalOf(ctx context.Context) string {
	if p, _ := ctx.Value(principalKey{}).(string); p != "" {
		return p
	}
	return SystemPrincipal
}

// NetworkAvailability decides whether a deleted share's Ziti objects are
// removed: a network that is gone (its controller decommissioned) has
// nothing to clean up, and asking it would fail the delete forever. Only
// the share delete asks; updates always write Ziti, so a network that is
// gone fails them.
type NetworkAvailability interface {
	ShouldCleanupZiti(ctx context.Context, s Share) (bool, error)
}

// Ingress is a TCP share's public ingress (a cloud load balancer in front
// of the overlay). The cascade tears it down before its transaction, from
// an unlocked read, for the shares the deleted agent hosts alone; inside
// the transaction it refuses to delete a share whose ingress is still up
// (ErrIngressUp), and the retry of the whole handler tears that one down
// first.
type Ingress interface {
	// TearDown removes the share's ingress; removing one that is gone is
	// not an error.
	TearDown(ctx context.Context, s Share) error
	// Up reports whether the share's ingress still exists.
	Up(ctx context.Context, s Share) (bool, error)
}
