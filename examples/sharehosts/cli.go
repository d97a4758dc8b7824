// Package sharehosts is the reference daemon of share hosts: it serves the
// hosting API (hosting/api) behind bearer tokens, consumes agent DELETED
// events and publishes share events through the outbox on RabbitMQ
// (hosting/events), and projects hosts onto an OpenZiti controller, on
// PostgreSQL (hosting/pgstore).
//
// Commands (cmd/sharehosts):
//
//	sharehosts serve -config sharehosts.yaml   run the daemon
//	sharehosts check-config -config FILE       parse and check a config
//	sharehosts demo                            everything in one process
//
// The config file is YAML; keys may be nested or dotted. The health check
// and the cap on hosts are under frontdoor's property names:
//
//	frontdoor-id: fd-1
//	api:
//	  listen: 127.0.0.1:8080
//	  tokens:
//	    ops: "a-long-random-token"        # principal: token
//	postgres:
//	  dsn: "host=127.0.0.1 dbname=hosting user=hosting"
//	amqp:
//	  url: amqp://hosting:secret@127.0.0.1:5672/
//	ziti:
//	  url: https://ctrl.example:1280
//	  username: hosting                    # or cert-file and key-file
//	  password: secret
//	  ca-file: /etc/sharehosts/ziti-ca.pem
//	io.netfoundry.frontdoor.share:
//	  max-hosts: 8
//	  health-check:
//	    interval: 5s
//	    timeout: 2s
//	    failures: 3
//
// serve runs the migrations on start and shuts down gracefully on SIGTERM
// or SIGINT. demo needs no external Ziti and no broker: PostgreSQL started
// as the tests start it, the model controller (hosting/zititest) in
// process, and two simulated agents; its output shows a failover from the
// active to the passive. The model controller is the stand-in for a real
// OpenZiti controller, whose Go modules are not available here.
package sharehosts

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// Main runs the command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, "usage: sharehosts serve -config FILE | check-config -config FILE | demo")
		return 2
	}
	if len(args) == 0 {
		return usage()
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "sharehosts.yaml", "the config file")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	switch args[0] {
	case "serve", "check-config":
		c, err := LoadConfig(*cfgPath)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if args[0] == "check-config" {
			fmt.Fprintf(stdout, "%s: ok (health check %v/%v/%d, max hosts %d)\n", *cfgPath, c.HealthCheck.Interval, c.HealthCheck.Timeout, c.HealthCheck.Failures, c.MaxHosts)
			return 0
		}
		if err := Serve(ctx, c, nil, stderr); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	case "demo":
		if err := Demo(ctx, stdout); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	}
	return usage()
}
