package hosting_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

const (
	account  = "acct-1"
	other    = "acct-2"
	frontdoo = "fd-1"
)

var testHC = hosting.HealthCheck{Interval: 5 * time.Second, Timeout: 2 * time.Second, Failures: 3}

type recPub struct{ evs []hosting.Event }

func (p *recPub) Publish(ctx context.Context, e hosting.Event) error {
	p.evs = append(p.evs, e)
	return nil
}

type env struct {
	t     testing.TB
	fake  *zititest.Fake
	proj  *hosting.Projection
	svc   *hosting.Service
	store hosting.Store
	pub   *recPub
	ident map[string]string // agent → identity
	ctx   context.Context
}

func newEnv(t *testing.T, st hosting.Store) *env { return newEnvTB(t, st) }

func newEnvB(b *testing.B) *env { return newEnvTB(b, nil) }

func newEnvTB(t testing.TB, st hosting.Store) *env { return newEnvWithTB(t, st, nil) }

// newEnvWith is newEnv with the service options amended by opt.
func newEnvWith(t *testing.T, st hosting.Store, opt func(*hosting.Options)) *env {
	return newEnvWithTB(t, st, opt)
}

func newEnvWithTB(t testing.TB, st hosting.Store, opt func(*hosting.Options)) *env {
	t.Helper()
	f := zitifake.Start(t, zititest.Options{})
	if st == nil {
		st = hosting.NewMemStore()
	}
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: frontdoo, HealthCheck: testHC})
	if err != nil {
		t.Fatal(err)
	}
	pub := &recPub{}
	o := hosting.Options{Store: st, Projection: p, Publisher: pub, Clock: transporttest.NewManualClock()}
	if opt != nil {
		opt(&o)
	}
	svc, err := hosting.NewService(o)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, fake: f, proj: p, svc: svc, store: st, pub: pub, ident: map[string]string{}, ctx: context.Background()}
}

// agents creates live agents of acct with identities.
func (e *env) agents(acct string, ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		if err := e.store.PutAgent(e.ctx, hosting.Agent{ID: id, AccountID: acct}); err != nil {
			e.t.Fatal(err)
		}
		e.ident[id] = e.fake.AddIdentity(id)
	}
}

// deleteAgent deletes an agent and its identity (and so its overrides).
func (e *env) deleteAgent(id string) {
	e.t.Helper()
	if err := e.store.PutAgent(e.ctx, hosting.Agent{ID: id, AccountID: account, Deleted: true}); err != nil {
		e.t.Fatal(err)
	}
	e.fake.DeleteIdentity(e.ident[id])
}

func (e *env) create(name string, active, passive []string) hosting.Share {
	e.t.Helper()
	s, err := e.svc.Create(e.ctx, hosting.Share{AccountID: account, Name: name, Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of(active...), Passive: hosting.Of(passive...)})
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return s
}

func (e *env) patch(id string, active, passive *[]string) hosting.Share {
	e.t.Helper()
	u := hosting.Update{Method: hosting.Patch}
	if active != nil {
		u.Active = hosting.Of(*active...)
	}
	if passive != nil {
		u.Passive = hosting.Of(*passive...)
	}
	s, err := e.svc.Update(e.ctx, id, u)
	if err != nil {
		e.t.Fatalf("update: %v", err)
	}
	return s
}

func list(ids ...string) *[]string { return &ids }

// zitiOf is what the fake holds for one share.
type zitiOf struct {
	service  ziti.Service
	host     *ziti.Config
	standby  *ziti.Config
	policy   *ziti.ServicePolicy
	override map[string]string // identity → config, for the service
}

func (e *env) zitiOf(shareID string) zitiOf {
	e.t.Helper()
	st := e.fake.Snapshot()
	var z zitiOf
	n := 0
	for _, s := range st.Services {
		if s.Tags[hosting.TagShare] == shareID {
			z.service = s
			n++
		}
	}
	if n != 1 {
		e.t.Fatalf("share %s has %d services", shareID, n)
	}
	for _, c := range st.Configs {
		if c.Tags[hosting.TagShare] != shareID {
			continue
		}
		c := c
		if c.Tags[hosting.TagObject] == hosting.TagStandbyHost {
			z.standby = &c
		} else {
			z.host = &c
		}
	}
	for _, p := range st.Policies {
		if p.Tags[hosting.TagShare] == shareID {
			p := p
			z.policy = &p
		}
	}
	z.override = map[string]string{}
	for ident, ovs := range st.Overrides {
		for _, ov := range ovs {
			if ov.ServiceID == z.service.ID {
				if _, dup := z.override[ident]; dup {
					e.t.Fatalf("identity %s has two overrides for the service", ident)
				}
				z.override[ident] = ov.ConfigID
			}
		}
	}
	return z
}

func precedenceOf(c *ziti.Config) string {
	lo, _ := c.Data["listenOptions"].(map[string]any)
	p, _ := lo["precedence"].(string)
	return p
}

// writes returns the write calls (not GET) recorded since the last reset.
func (e *env) writes() []zititest.Call {
	var out []zititest.Call
	for _, c := range e.fake.Calls() {
		if c.Method != "GET" {
			out = append(out, c)
		}
	}
	return out
}

func (e *env) no500() {
	e.t.Helper()
	for _, c := range e.fake.Calls() {
		if c.Status >= 500 {
			e.t.Fatalf("controller answered %d to %s %s", c.Status, c.OperationID, c.Path)
		}
	}
}
