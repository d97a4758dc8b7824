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
//	sharehosts reconcile -config FILE [-dry-run] one reconciler pass
//	sharehosts demo                            everything in one process
//	sharehosts --help | --version
//
// --help (also after a command) prints the usage, wrapped to 80 columns,
// and exits 0; --version prints the module version and the VCS revision
// the binary was built from.
//
// The config file is YAML; keys may be nested or dotted. The health check
// and the cap on hosts are under frontdoor's property names:
//
//	frontdoor-id: fd-1
//	deployment-id: fd-1-prod               # tags Ziti objects; orphans are removed only with it
//	metrics.listen: 127.0.0.1:9446         # optional: GET /metrics (loopback only)
//	reconcile:                             # optional, the defaults shown
//	  interval: 5m
//	  orphan-grace: 10m
//	  max-repairs: 100
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
// or SIGINT. It runs the reconciler (docs/hosting-reconciler.md): on
// start, every reconcile.interval and after a failed compensation;
// reconcile makes one pass, and with -dry-run only lists the drift. demo needs no external Ziti and no broker: PostgreSQL started
// as the tests start it, the model controller (hosting/zititest) in
// process, and two simulated agents; its output shows a failover from the
// active to the passive. The model controller is the stand-in for a real
// OpenZiti controller, whose Go modules are not available here.
package sharehosts

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/vipkit/vipkit/internal/buildinfo"
	"github.com/vipkit/vipkit/internal/clihelp"
)

// commands are sharehosts' commands, in the order of its help.
var commands = []clihelp.Command{
	{Synopsis: "serve [-config FILE]",
		Desc: "run the daemon: the hosting REST API, the events on RabbitMQ and the Ziti projection, on PostgreSQL; SIGTERM or SIGINT shuts it down gracefully"},
	{Synopsis: "check-config [-config FILE]",
		Desc: "parse and check a config file and print a summary of it; exit 1 with the reason when it is not valid"},
	{Synopsis: "reconcile [-config FILE] [-dry-run]",
		Desc: "make one reconciler pass: compare every share's Ziti objects with the database and repair the drift; -dry-run lists it and repairs nothing"},
	{Synopsis: "demo",
		Desc: "run everything in one process (PostgreSQL as the tests start it, the model Ziti controller, two simulated tunnelers) and show a failover and the failback"},
}

// usage is sharehosts' help, wrapped to 80 columns.
var usage = func() string {
	var b strings.Builder
	b.WriteString("usage: sharehosts <command> [flags]\n       sharehosts --help | --version\n\ncommands:\n")
	clihelp.WriteCommands(&b, commands)
	b.WriteString("\nThe config file is YAML (default sharehosts.yaml); its keys are in\ndocs/hosting-api.md. Run 'sharehosts COMMAND --help' for a command's flags.\n")
	return b.String()
}()

// Version returns "sharehosts MODULE VERSION (revision REV, ...;
// GOVERSION)" from the build info (internal/buildinfo, as keel-vip's and
// tsng's --version).
func Version() string {
	bi := buildinfo.Read()
	return "sharehosts " + bi.Module + " " + bi.String()
}

// Main runs the command line and returns the exit code: 0 on success (and
// for --help and --version), 1 when the command fails, 2 for a bad
// command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "--version", "-version", "version":
		fmt.Fprintln(stdout, Version())
		return 0
	}
	var cmd clihelp.Command
	for _, c := range commands {
		if strings.Fields(c.Synopsis)[0] == args[0] {
			cmd = c
		}
	}
	if cmd.Synopsis == "" {
		fmt.Fprintf(stderr, "sharehosts: unknown command %q\n%s", args[0], usage)
		return 2
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		io.WriteString(w, clihelp.Hang("usage: sharehosts ", cmd.Synopsis, 7, clihelp.Width))
		io.WriteString(w, "\n"+clihelp.Wrap(cmd.Desc, 0, clihelp.Width))
		if args[0] != "demo" {
			io.WriteString(w, "\nflags:\n")
			clihelp.WriteFlags(w, fs)
		}
	}
	var cfgPath *string
	if args[0] != "demo" {
		cfgPath = fs.String("config", "sharehosts.yaml", "the config `FILE` (YAML)")
	}
	var dry *bool
	if args[0] == "reconcile" {
		dry = fs.Bool("dry-run", false, "list the drift and repair nothing")
	}
	// The flag package prints the usage itself on an error and on -h:
	// the help goes to stdout, an error and the usage to stderr.
	var msg strings.Builder
	fs.SetOutput(&msg)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			io.WriteString(stdout, msg.String())
			return 0
		}
		io.WriteString(stderr, msg.String())
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "sharehosts %s: unexpected arguments %q (see 'sharehosts %s --help')\n", args[0], fs.Args(), args[0])
		return 2
	}
	switch args[0] {
	case "reconcile":
		c, err := LoadConfig(*cfgPath)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if _, err := Reconcile(ctx, c, *dry, stdout); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
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
	return 2
}
