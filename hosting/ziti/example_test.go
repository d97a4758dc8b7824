package ziti_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/vipkit/vipkit/hosting/ziti"
)

func ExampleClient_DeleteConfig() {
	ctx := context.Background()
	c, err := ziti.New("https://ctrl.example:1280", ziti.Options{Session: "token"})
	if err != nil {
		panic(err)
	}
	err = c.DeleteConfig(ctx, "cfg-1")
	switch {
	case errors.Is(err, ziti.ErrConfigInUse):
		// An override still names the config: remove it first, do not retry.
	case errors.Is(err, ziti.ErrNotFound):
		// Already gone.
	}
	fmt.Println(err)
}

func ExampleEq() {
	fmt.Println(ziti.And(ziti.Eq("tags.frontdoorShareId", "s-1"), ziti.AnyOfEq("roleAttributes", "agent | a-1")))
	// Output: tags.frontdoorShareId = "s-1" and anyOf(roleAttributes) = "agent | a-1"
}

// The client logs in itself and renews its session.
func ExamplePasswordLogin() {
	c, err := ziti.New("https://ctrl.example:1280", ziti.Options{Login: ziti.PasswordLogin("hosting", "secret")})
	if err != nil {
		panic(err)
	}
	_, err = c.ListConfigTypes(context.Background(), ziti.Eq("name", "host.v1"))
	fmt.Println(err)
}
