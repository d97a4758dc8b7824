package hosting_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/zitifake"
	"github.com/vipkit/vipkit/transport/transporttest"
)

// gatherZiti holds the lookups it sees, once armed, until want of them are
// in flight together, and then lets them all go: lookups made one after
// the other never get there, and the first one fails at the context's
// deadline.
type gatherZiti struct {
	hosting.Ziti
	mu sync.Mutex
	// +checklocks:mu
	want int
	// +checklocks:mu
	arrived int
	// +checklocks:mu
	open chan struct{}
}

func (g *gatherZiti) arm(want int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.want, g.arrived, g.open = want, 0, make(chan struct{})
}

func (g *gatherZiti) gather(ctx context.Context) error {
	g.mu.Lock()
	if g.want == 0 {
		g.mu.Unlock()
		return nil
	}
	g.arrived++
	n, want, open := g.arrived, g.want, g.open
	if n == want {
		close(open)
		g.want = 0
	}
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		// Disarm, so that the compensation (on a context without a
		// deadline) goes through.
		g.mu.Lock()
		if g.want != 0 && g.open == open {
			close(open)
			g.want = 0
		}
		g.mu.Unlock()
		return fmt.Errorf("lookup %d of %d waited alone for the others: %w", n, want, ctx.Err())
	}
}

func (g *gatherZiti) ListServices(ctx context.Context, f string) ([]ziti.Service, error) {
	if err := g.gather(ctx); err != nil {
		return nil, err
	}
	return g.Ziti.ListServices(ctx, f)
}

func (g *gatherZiti) ListConfigs(ctx context.Context, f string) ([]ziti.Config, error) {
	if err := g.gather(ctx); err != nil {
		return nil, err
	}
	return g.Ziti.ListConfigs(ctx, f)
}

func (g *gatherZiti) ListServicePolicies(ctx context.Context, f string) ([]ziti.ServicePolicy, error) {
	if err := g.gather(ctx); err != nil {
		return nil, err
	}
	return g.Ziti.ListServicePolicies(ctx, f)
}

func (g *gatherZiti) ListIdentities(ctx context.Context, f string) ([]ziti.Identity, error) {
	if err := g.gather(ctx); err != nil {
		return nil, err
	}
	return g.Ziti.ListIdentities(ctx, f)
}

// An update's lookups (the share's services, configs and bind policy, the
// new passive's identity and the leaving passive's) are independent: they
// go to the controller at once, so that a request waits for one round trip
// before its writes, not five.
func TestUpdateSendsItsLookupsAtOnce(t *testing.T) {
	f := zitifake.Start(t, zititest.Options{})
	g := &gatherZiti{Ziti: f.Client()}
	p, err := hosting.NewProjection(g, hosting.ProjectionOptions{FrontdoorID: frontdoo, HealthCheck: testHC})
	if err != nil {
		t.Fatal(err)
	}
	st := hosting.NewMemStore()
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p, Clock: transporttest.NewManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, a := range []string{"a1", "p1"} {
		if err := st.PutAgent(ctx, hosting.Agent{ID: a, AccountID: account}); err != nil {
			t.Fatal(err)
		}
		f.AddIdentity(a)
	}
	s, err := svc.Create(ctx, hosting.Share{AccountID: account, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of("a1"), Passive: hosting.Of("p1")})
	if err != nil {
		t.Fatal(err)
	}
	g.arm(5)
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := svc.Update(uctx, s.ID, hosting.Update{Method: hosting.Patch, Active: hosting.Of("p1"), Passive: hosting.Of("a1")}); err != nil {
		t.Fatalf("the swap's lookups did not go at once: %v", err)
	}
}

// A create assigns each passive's override without listing the
// identity's overrides first: its service is new, so no identity holds the
// pair yet, and the list grows with every share the agent is passive on.
func TestCreateListsNoOverrides(t *testing.T) {
	e := newEnv(t, nil)
	e.agents(account, "a1", "p1", "p2")
	for i := 0; i < 3; i++ {
		e.create(fmt.Sprint("db", i), []string{"a1"}, []string{"p1", "p2"})
	}
	for _, c := range e.fake.Calls() {
		if c.OperationID == "listIdentitysServiceConfigs" {
			t.Fatalf("a create listed the overrides of an identity: %s %s", c.Method, c.Path)
		}
	}
	for i := 0; i < 3; i++ {
		e.checkModel(e.create(fmt.Sprint("again", i), []string{"p1"}, []string{"a1"}))
	}
}
