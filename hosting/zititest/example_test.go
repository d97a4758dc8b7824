package zititest_test

import (
	"context"
	"fmt"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/hosting/zititest"
)

func ExampleStart() {
	f, err := zititest.Start(zititest.Options{})
	if err != nil {
		fmt.Println(err) // management.yml not found
		return
	}
	defer f.Close()
	c := f.Client()
	ident := f.AddIdentity("agent-1")
	_, err = c.ListServiceConfigs(context.Background(), ident)
	fmt.Println(err)
	_ = ziti.PrecedenceRequired
}

// A simulated tunneler binds what its bind policies give it and runs the
// host.v1 port checks; Dial routes a new circuit by precedence band.
func ExampleFake_StartAgent() {
	f, err := zititest.Start(zititest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	ident := f.AddIdentity("agent-1")
	a, err := f.StartAgent(zititest.AgentOptions{Identity: ident, Resolve: func(string) string { return "127.0.0.1:5432" }})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Stop()
	// ... create a service whose bind policy names "#agent | agent-1" ...
	_, host, err := f.Dial(context.Background(), "svc-id")
	fmt.Println(host, err)
}
