// Command keel-vip is the reference pair controller for a service VIP on a
// WireGuard mesh: see package github.com/vipkit/vipkit/examples/keel-vip.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

func main() {
	keelvip.DispatchExec()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := keelvip.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
