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
