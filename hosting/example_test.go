package hosting_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
)

func ExampleHosts_Apply() {
	h := hosting.NewHosts([]string{"a1"}, []string{"p1"})
	// A PATCH that names only the actives leaves the passives alone.
	u, _ := hosting.DecodeUpdate([]byte(`{"activeAgentIds":["a2","a1"]}`), hosting.Patch)
	h, _ = h.Apply(u)
	fmt.Println(h.Active, h.Passive)
	// null on passiveAgentIds clears them.
	u, _ = hosting.DecodeUpdate([]byte(`{"passiveAgentIds":null}`), hosting.Patch)
	h, _ = h.Apply(u)
	fmt.Println(h.Active, h.Passive)
	// Output:
	// [a1 a2] [p1]
	// [a1 a2] []
}

func ExampleHosts_Without() {
	h := hosting.NewHosts([]string{"a1"}, []string{"p1", "p2"})
	rest, promoted := h.Without("a1")
	fmt.Println(rest.Active, rest.Passive, promoted)
	// Output: [p1 p2] [] true
}

func ExampleValidator_Validate() {
	ctx := context.Background()
	st := hosting.NewMemStore()
	_ = st.PutAgent(ctx, hosting.Agent{ID: "a1", AccountID: "acct"})
	s := hosting.Share{AccountID: "acct", Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432,
		Hosts: hosting.NewHosts([]string{"a1"}, []string{"a1"})}
	fmt.Println(hosting.Validator{}.Validate(ctx, s, st))
	// Output: hosting: invalid share: passiveAgentIds: agent a1 cannot be both active and passive
}

func ExampleDeriveStatus() {
	h := hosting.NewHosts([]string{"a1"}, []string{"p1"})
	st := hosting.DeriveStatus(h, map[string]string{"a1": "id-a1", "p1": "id-p1"}, []ziti.Terminator{
		{HostID: "id-a1", Precedence: ziti.PrecedenceFailed},
		{HostID: "id-p1", Precedence: ziti.PrecedenceDefault},
	})
	fmt.Println(st.State)
	for _, hs := range st.Hosts {
		fmt.Println(hs.AgentID, hs.Role, hs.Bound, hs.Precedence)
	}
	// Output:
	// FAILED_OVER
	// a1 ACTIVE true failed
	// p1 PASSIVE true default
}

func ExampleNewService() {
	ctx := context.Background()
	client, _ := ziti.New("https://ctrl.example:1280", ziti.Options{Session: "token"})
	proj, err := hosting.NewProjection(client, hosting.ProjectionOptions{
		FrontdoorID: "fd-1",
		HealthCheck: hosting.HealthCheck{Interval: 5 * time.Second, Timeout: 2 * time.Second, Failures: 3},
	})
	if err != nil {
		panic(err)
	}
	svc, _ := hosting.NewService(hosting.Options{Store: hosting.NewMemStore(), Projection: proj})
	share, err := svc.Create(ctx, hosting.Share{AccountID: "acct", Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
		hosting.Update{Active: hosting.Of("agent-1"), Passive: hosting.Of("agent-2")})
	fmt.Println(share.ID, err)
}
