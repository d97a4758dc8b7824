// Command tsng is vipkit's reference agent for named virtual services on a
// WireGuard mesh. Everything it does lives in examples/tsng; see its package
// documentation for the commands and exit statuses.
//
//	go run ./cmd/tsng demo
package main

import (
	"context"
	"os"

	"github.com/vipkit/vipkit/examples/tsng"
)

func main() {
	os.Exit(tsng.Main(context.Background(), os.Args[1:], tsng.DefaultEnv()))
}
