package hosting_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/internal/testenv"
)

// reentrantZiti is a Ziti whose ListConfigTypes calls back into the
// projection (as a client that logs through, or retries via, the
// application might). Every other method is absent: the test never
// reaches them.
type reentrantZiti struct {
	hosting.Ziti
	p     *hosting.Projection
	calls int
	inner error
}

var (
	errInner = errors.New("inner lookup refused")
	errOuter = errors.New("outer lookup refused")
)

func (z *reentrantZiti) ListConfigTypes(ctx context.Context, _ string) ([]ziti.ConfigType, error) {
	z.calls++
	if z.calls > 1 {
		return nil, errInner
	}
	z.inner = z.p.Project(ctx, hosting.Share{ID: "inner", Name: "db"})
	return nil, errOuter
}

// TestProjectionCallsZitiUnlocked pins that the projection calls Ziti with
// no lock held: a Ziti call that re-enters the projection (here the host.v1
// config type lookup) completes instead of deadlocking on the projection's
// lock.
func TestProjectionCallsZitiUnlocked(t *testing.T) {
	z := &reentrantZiti{}
	p, err := hosting.NewProjection(z, hosting.ProjectionOptions{FrontdoorID: frontdoo, HealthCheck: testHC})
	if err != nil {
		t.Fatal(err)
	}
	z.p = p
	testenv.Within(t, "Project with a Ziti that re-enters the projection", func() {
		err = p.Project(context.Background(), hosting.Share{ID: "outer", Name: "db"})
	})
	if !errors.Is(err, errOuter) {
		t.Fatalf("outer Project: %v, want %v", err, errOuter)
	}
	if !errors.Is(z.inner, errInner) {
		t.Fatalf("inner Project: %v, want %v", z.inner, errInner)
	}
}
