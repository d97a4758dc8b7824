// Command sharehosts is the reference daemon of share hosts on OpenZiti:
// see package github.com/vipkit/vipkit/examples/sharehosts.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/vipkit/vipkit/examples/sharehosts"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := sharehosts.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
