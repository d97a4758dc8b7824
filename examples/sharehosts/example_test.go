package sharehosts_test

import (
	"context"
	"os"

	"github.com/vipkit/vipkit/examples/sharehosts"
)

// The command line: serve, check-config or demo.
func ExampleMain() {
	os.Exit(sharehosts.Main(context.Background(), []string{"check-config", "-config", "/etc/sharehosts.yaml"}, os.Stdout, os.Stderr))
}
