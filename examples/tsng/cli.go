package tsng

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/vip"
)

// Exit statuses of the tsng command. Scripts can rely on them.
const (
	ExitOK          = 0  // success
	ExitError       = 1  // any other failure
	ExitUsage       = 2  // bad command line
	ExitNotFound    = 3  // no network, service, listener, backend or node matches
	ExitAmbiguous   = 4  // a selector matched several candidates (listed on stderr)
	ExitConflict    = 5  // a stale draft: the service changed since it was read
	ExitInvalid     = 6  // invalid configuration (each bad field on stderr)
	ExitLimit       = 7  // a limit would be exceeded
	ExitExists      = 8  // the service, listener or backend already exists
	ExitNetworkDown = 9  // the network is not up locally
	ExitAgent       = 10 // the agent's local API is not reachable
)

// DefaultSocket is the local API's socket when neither --socket nor
// TSNG_SOCKET is given and the config file names none.
const DefaultSocket = "/run/tsng/tsng.sock"

// DefaultConfig is the config file of `tsng daemon` and `tsng init`, and
// the one the CLI reads the agent's socket from, when --config is not
// given.
const DefaultConfig = "/etc/tsng/tsng.json"

// maxSocketConfig bounds what the CLI reads of a config file to find the
// socket; a longer file is reported, not read.
const maxSocketConfig = 4 << 20

// findSocket is the agent's socket: flag (--socket), else $TSNG_SOCKET,
// else the socket field of the config file (config, else env's default),
// else DefaultSocket. Only the socket field is kept from the file, which
// holds private keys; when the file exists but cannot be read or parsed,
// note says so, naming no content of it. A missing default config file
// is no note: the CLI may run where no agent's config is.
func findSocket(env *Env, flag, config string) (socket, note string) {
	if flag != "" {
		return flag, ""
	}
	if s := env.Getenv("TSNG_SOCKET"); s != "" {
		return s, ""
	}
	explicit := config != ""
	if !explicit {
		config = nonEmpty(env.DefaultConfig, DefaultConfig)
	}
	using := fmt.Sprintf("; using %s (give --socket or set TSNG_SOCKET)", DefaultSocket)
	f, err := os.Open(config)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return DefaultSocket, ""
	}
	var b []byte
	if err == nil {
		b, err = jsonx.ReadAll(f, maxSocketConfig)
		f.Close()
	}
	if err != nil {
		why := err
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			why = pe.Err
		}
		return DefaultSocket, fmt.Sprintf("cannot read %s for the agent's socket (%v)%s", config, why, using)
	}
	// Decoding into a struct of the socket field alone keeps nothing else;
	// the decoder's error is not printed, as a syntax error quotes input.
	var only struct {
		Socket string `json:"socket"`
	}
	if err := json.Unmarshal(b, &only); err != nil {
		return DefaultSocket, fmt.Sprintf("cannot read the socket from %s (not a valid config; `tsng config check %s` names the problem)%s", config, config, using)
	}
	return nonEmpty(only.Socket, DefaultSocket), ""
}

// Env is what a CLI invocation runs with; tests replace its parts.
type Env struct {
	Stdout, Stderr io.Writer
	Stdin          io.Reader
	Getenv         func(string) string
	// RunEditor runs the user's editor on path; nil runs $VISUAL or $EDITOR
	// (or vi) with the terminal attached.
	RunEditor func(ctx context.Context, path string) error
	// Sleep waits between watch samples; nil uses a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Daemon, Demo and UI run the long-lived commands; cmd/tsng wires them.
	Daemon func(ctx context.Context, configPath string) error
	Demo   func(ctx context.Context, out io.Writer) error
	// OpenBrowser opens a file or URL in the user's browser (`tsng ui`
	// gives it the path of its sign-in page); nil only prints it.
	OpenBrowser func(target string) error
	// DefaultConfig is the config file the CLI reads the agent's socket
	// from when --config is not given; empty means DefaultConfig.
	DefaultConfig string
}

type cliCtx struct {
	env    *Env
	client *Client
	json   bool
	config string // the global --config, if given
}

// usageError is a bad command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

type command struct {
	name  string
	args  string // synopsis of positional arguments
	short string
	long  string
	min   int
	max   int // -1: any
	flags func(fs *flag.FlagSet, o *opts)
	run   func(ctx context.Context, c *cliCtx, o *opts, args []string) error
	sub   []*command
}

// opts holds every flag a command may define.
type opts struct {
	json      bool
	watch     bool
	interval  time.Duration
	count     int
	backends  multiFlag
	portCheck string
	checkIv   int64
	checkTo   int64
	failures  int
	successes int
	idle      int64
	config    string
	open      bool
	yes       bool
	discard   bool
	listen    string
	set       map[string]bool // the flags given on the command line
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func jsonFlag(fs *flag.FlagSet, o *opts) { fs.BoolVar(&o.json, "json", false, "print JSON") }

// Main runs the tsng command line and returns its exit status.
func Main(ctx context.Context, args []string, env *Env) int {
	if env.Getenv == nil {
		env.Getenv = os.Getenv
	}
	root := rootCommand()
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		args = []string{"version"}
	}
	// Global flags, before the command: --socket PATH and --config FILE.
	var socket, config string
	for len(args) > 0 {
		flagName, val, hasVal := strings.Cut(args[0], "=")
		name := strings.TrimPrefix(strings.TrimPrefix(flagName, "-"), "-")
		if !strings.HasPrefix(flagName, "-") || name != "socket" && name != "config" {
			break
		}
		if !hasVal {
			if len(args) < 2 {
				fmt.Fprintf(env.Stderr, "tsng: --%s needs a %s\n", name, map[string]string{"socket": "path", "config": "file"}[name])
				return ExitUsage
			}
			val, args = args[1], args[1:]
		}
		args = args[1:]
		if name == "socket" {
			socket = val
		} else {
			config = val
		}
	}
	socket, note := findSocket(env, socket, config)
	c := &cliCtx{env: env, client: NewClient(socket), config: config}
	if note != "" {
		c.client.notice = func() { fmt.Fprintln(env.Stderr, "tsng: note:", note) }
	}
	err := root.exec(ctx, c, nil, args)
	return report(env.Stderr, err)
}

// configFile is a command's config file: its own --config, else the
// global one, else DefaultConfig.
func (c *cliCtx) configFile(o *opts) string {
	if o.config != "" {
		return o.config
	}
	return nonEmpty(c.config, DefaultConfig)
}

func report(w io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(w, "tsng:", ue.msg)
		return ExitUsage
	}
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if errors.Is(err, ErrAgentUnreachable) {
		fmt.Fprintln(w, err)
		return ExitAgent
	}
	var ee *editError
	if errors.As(err, &ee) {
		fmt.Fprintln(w, "tsng:", printable(ee.Error()))
		return ee.code
	}
	var ae *APIError
	if errors.As(err, &ae) {
		fmt.Fprintln(w, "tsng:", printable(ae.Message))
		for _, c := range ae.Candidates {
			fmt.Fprintln(w, "  candidate:", printable(c))
		}
		if ae.Current != "" {
			fmt.Fprintln(w, "  current revision:", ae.Current)
		}
		return ExitCode(ae.Code)
	}
	// Errors from this package already carry the "tsng: " prefix.
	fmt.Fprintln(w, "tsng:", printable(strings.TrimPrefix(err.Error(), "tsng: ")))
	if errors.Is(err, ErrConfig) {
		return ExitInvalid
	}
	return ExitError
}

func (cmd *command) path(parents []string) string {
	return strings.TrimSpace(strings.Join(append(append([]string{}, parents...), cmd.name), " "))
}

func (cmd *command) usage(w io.Writer, parents []string) {
	p := cmd.path(parents)
	if len(cmd.sub) > 0 {
		fmt.Fprintf(w, "Usage: %s COMMAND\n\n%s\n\nCommands:\n", p, wrapText(cmd.short, helpWrap))
		writeCommandList(w, cmd.sub)
		if cmd.long != "" {
			fmt.Fprintf(w, "\n%s\n", wrapText(cmd.long, helpWrap))
		}
		fmt.Fprintf(w, "\n%s\n", wrapText(fmt.Sprintf("Run '%s COMMAND --help' for a command's options.", p), helpWrap))
		return
	}
	fmt.Fprintf(w, "%s\n\n%s\n", wrapLine(strings.TrimSpace("Usage: "+p+" "+cmd.args), helpWrap, strings.Repeat(" ", len("Usage: "+p+" "))), wrapText(cmd.short, helpWrap))
	if cmd.long != "" {
		fmt.Fprintf(w, "\n%s\n", wrapText(cmd.long, helpWrap))
	}
}

func (cmd *command) exec(ctx context.Context, c *cliCtx, parents []string, args []string) error {
	if len(cmd.sub) > 0 {
		if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
			cmd.usage(c.env.Stdout, parents)
			if len(args) == 0 {
				return usageError{fmt.Sprintf("%s needs a command", cmd.path(parents))}
			}
			return nil
		}
		for _, s := range cmd.sub {
			if s.name == args[0] {
				return s.exec(ctx, c, append(parents, cmd.name), args[1:])
			}
		}
		return usageError{fmt.Sprintf("unknown command %q for %s (see '%s --help')", args[0], cmd.path(parents), cmd.path(parents))}
	}
	fs := flag.NewFlagSet(cmd.path(parents), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o opts
	if cmd.flags != nil {
		cmd.flags(fs, &o)
	}
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		cmd.usage(c.env.Stdout, parents)
		if hasFlags(fs) {
			fmt.Fprintln(c.env.Stdout, "\nOptions:")
			writeFlags(c.env.Stdout, fs)
		}
		return nil
	}
	if err != nil {
		return usageError{fmt.Sprintf("%s: %v", cmd.path(parents), err)}
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if len(pos) < cmd.min || (cmd.max >= 0 && len(pos) > cmd.max) {
		return usageError{fmt.Sprintf("usage: %s %s", cmd.path(parents), cmd.args)}
	}
	c.json = o.json
	return cmd.run(ctx, c, &o, pos)
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parseInterleaved lets flags stand anywhere among the positional
// arguments ("--" ends them).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) > 0 && len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return pos, nil
}

func rootCommand() *command {
	root := &command{name: "tsng", short: "tsng is vipkit's reference agent: named virtual services (VIPs) on a WireGuard mesh.",
		long: "Global options, before the command:\n" +
			"  --socket PATH  the agent's local API socket\n" +
			"  --config FILE  the agent's config file (default " + DefaultConfig + ")\n" +
			"  --version      print the version\n\n" +
			"The socket is --socket, else $TSNG_SOCKET, else the \"socket\" field of the\n" +
			"config file (only that field is read), else " + DefaultSocket + ".\n\n" +
			"The config file: docs/tsng-config.md (`tsng init` writes one).", sub: []*command{
			vipCommand(),
			{name: "network", short: "List, start and stop networks.", sub: []*command{
				{name: "list", args: "[--json]", short: "List the configured networks and whether each is up.", max: 0, flags: jsonFlag, run: runNetworkList},
				{name: "up", args: "NET", short: "Start a network on this node.", min: 1, max: 1, run: runUpDown("up")},
				{name: "down", args: "NET", short: "Stop a network on this node; its saved configuration stays readable.", min: 1, max: 1, run: runUpDown("down")},
			}},
			{name: "reload", args: "[--json]", short: "Make the agent re-read its config file and apply the changed peers (also: SIGHUP, systemctl reload).", max: 0, flags: jsonFlag,
				long: "Added peers join, removed peers leave (their backends show as departed), changed endpoints and keys take effect;\n" +
					"unchanged peers keep their sessions and bindings. A config that is invalid, or changes anything but peers, is refused\n" +
					"with the field named, and the running config stays. See docs/tsng-config.md.",
				run: runReload},
			{name: "daemon", args: "--config FILE", short: "Run the agent: join the networks of a config file and serve the local API.", min: 0, max: 0,
				flags: func(fs *flag.FlagSet, o *opts) {
					fs.StringVar(&o.config, "config", "", "config `file` (default: the global --config, else "+DefaultConfig+")")
				},
				run: func(ctx context.Context, c *cliCtx, o *opts, _ []string) error {
					if c.env.Daemon == nil {
						return errors.New("tsng: daemon is not available in this build")
					}
					return c.env.Daemon(ctx, c.configFile(o))
				}},
			{name: "demo", short: "Run three in-process nodes (no root, no files): create api.home, send traffic, fail a backend over, print status.", max: 0,
				run: func(ctx context.Context, c *cliCtx, _ *opts, _ []string) error {
					if c.env.Demo == nil {
						return errors.New("tsng: demo is not available in this build")
					}
					return c.env.Demo(ctx, c.env.Stdout)
				}},
			{name: "ui", short: "Open the VIP editor (served by the agent on loopback), signed in by a one-time page.", max: 0,
				long: fmt.Sprintf("Prints the editor's address, which carries no secret, and writes a sign-in page (mode 0600, in a\n"+
					"fresh 0700 directory) that signs one browser on this machine in, once, within %s; a browser\n"+
					"opens it (xdg-open, unless --open=false). The command waits until the page was used or expired,\n"+
					"then removes it.", UIHandoffTTL),
				flags: func(fs *flag.FlagSet, o *opts) {
					fs.BoolVar(&o.open, "open", true, "open the sign-in page in a browser (xdg-open)")
				},
				run: func(ctx context.Context, c *cliCtx, o *opts, _ []string) error { return runUI(ctx, c, o.open) }},
			{name: "completion", args: "bash|zsh", short: "Print a shell completion script.", min: 1, max: 1,
				run: func(_ context.Context, c *cliCtx, _ *opts, args []string) error {
					return completion(c.env.Stdout, args[0])
				}},
		}}
	root.sub = append(root.sub, overviewCommand())
	root.sub = append(root.sub, keysCommands()...)
	root.sub = append(root.sub, peerCommands()...)
	root.sub = append(root.sub, opsCommands()...)
	for _, c := range root.sub {
		if c.name == "vip" {
			c.sub = append(c.sub, forwardCommand())
		}
	}
	return root
}

func vipCommand() *command {
	portFlags := func(fs *flag.FlagSet, o *opts) {
		jsonFlag(fs, o)
		fs.StringVar(&o.portCheck, "port-check", "", "TCP connect checks `on|off`")
		fs.Int64Var(&o.checkIv, "check-interval-ms", 0, "check interval in `ms` (default 3000)")
		fs.Int64Var(&o.checkTo, "check-timeout-ms", 0, "check timeout in `ms` (default 2000)")
		fs.IntVar(&o.failures, "failures", 0, "failed checks that exclude a backend (default 2)")
		fs.IntVar(&o.successes, "successes", 0, "passed checks that bring it back (default 1)")
		fs.Int64Var(&o.idle, "idle-timeout", 0, "flow idle timeout in `seconds` (default 7200 TCP, 120 UDP)")
	}
	return &command{name: "vip", short: "Create, edit and watch named virtual services.", sub: []*command{
		{name: "list", args: "[NET] [--json]", short: "List the VIPs of a network, or of every network.", max: 1, flags: jsonFlag, run: runList,
			long: "With --json, one JSON object per service (configuration, revision, counters, observations)."},
		{name: "create", args: "NET NAME", short: "Create an empty VIP (it resolves, but accepts no traffic until it has a listener).", min: 2, max: 2, flags: jsonFlag,
			run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
				var d ServiceDoc
				if err := c.client.Do(ctx, http.MethodPost, "/v1/networks/"+url.PathEscape(a[0])+"/vips", CreateRequest{Name: a[1]}, &d); err != nil {
					return err
				}
				return printDoc(c, d)
			}},
		{name: "port", short: "Add, change or remove a VIP's listeners.", sub: []*command{
			{name: "add", args: "NET VIP PROTO/PORT --backend NODE:PORT...", short: "Add a listener with its full initial backend set, atomically.", min: 3, max: 3,
				long: backendWhere,
				flags: func(fs *flag.FlagSet, o *opts) {
					jsonFlag(fs, o)
					fs.Var(&o.backends, "backend", "a backend `NODE:PORT` (repeat for more)")
				},
				run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
					return mutateDoc(ctx, c, http.MethodPost, vipPath(a[0], a[1])+"/ports", PortAddRequest{Listener: a[2], Backends: o.backends})
				}},
			{name: "set", args: "NET VIP PROTO/PORT [--port-check on|off] [--check-interval-ms N] [--check-timeout-ms N] [--failures N] [--successes N] [--idle-timeout S]",
				short: "Change a listener's checks and idle timeout.", min: 3, max: 3, flags: portFlags, run: runPortSet},
			{name: "remove", args: "NET VIP PROTO/PORT", short: "Remove a listener; its bindings drain until idle expiry.", min: 3, max: 3, flags: jsonFlag,
				run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
					p, err := listenerPath(a[0], a[1], a[2])
					if err != nil {
						return err
					}
					return mutateDoc(ctx, c, http.MethodDelete, p, nil)
				}},
		}},
		{name: "backend", short: "Add, remove, drain or undrain one backend of a listener.", sub: []*command{
			{name: "add", args: "NET VIP PROTO/PORT NODE:PORT", short: "Add a backend.", min: 4, max: 4, flags: jsonFlag, long: backendWhere,
				run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
					p, err := listenerPath(a[0], a[1], a[2])
					if err != nil {
						return err
					}
					return mutateDoc(ctx, c, http.MethodPost, p+"/backends", BackendRequest{Backend: a[3]})
				}},
			{name: "remove", args: "NET VIP PROTO/PORT NODE:PORT", short: "Remove a backend; its bindings drain until idle expiry.", min: 4, max: 4, flags: jsonFlag,
				run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
					p, err := listenerPath(a[0], a[1], a[2])
					if err != nil {
						return err
					}
					return mutateDoc(ctx, c, http.MethodDelete, p+"/backends/"+url.PathEscape(a[3]), nil)
				}},
			backendDrainCommand(true), backendDrainCommand(false),
		}},
		{name: "show", args: "NET VIP [--json]", short: "Show a VIP's configuration, revision, address and ids.", min: 2, max: 2, flags: jsonFlag,
			run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
				var d ServiceDoc
				if err := c.client.Do(ctx, http.MethodGet, vipPath(a[0], a[1]), nil, &d); err != nil {
					return err
				}
				return printDoc(c, d)
			}},
		{name: "status", args: "NET VIP [--watch] [--interval D] [--json]", short: "Show this node's observation: selected backend, health, RTT, bindings, counters.", min: 2, max: 2,
			long: "Each listener has a row of its own counters (BACKEND -), then one per backend. RTT is - for a backend that failed or is excluded; " +
				"AGE is the time since its last probe answer. DROPS and FAILOVERS (UDP only) are cumulative, per listener, backend and VIP. " +
				"A departed backend is shown by its node id, in full under the table with its former name.\n" +
				"With --watch, print a sample every --interval, with rates derived from the cumulative counters; with --json, one JSON object per sample.",
			flags: func(fs *flag.FlagSet, o *opts) {
				jsonFlag(fs, o)
				fs.BoolVar(&o.watch, "watch", false, "keep printing samples")
				fs.DurationVar(&o.interval, "interval", time.Second, "time between samples")
				fs.IntVar(&o.count, "count", 0, "stop after N samples (0: until interrupted)")
			}, run: runStatus},
		{name: "edit", args: "NET VIP [--discard]", short: "Edit a VIP as JSON in $VISUAL/$EDITOR and save it as one version-checked draft.", min: 2, max: 2,
			long: "An invalid or rejected file is kept and its path printed; running the edit again reopens it, brought up to date\n" +
				"if the service changed meanwhile, or lists what conflicts. --discard drops a kept edit.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.discard, "discard", false, "drop the kept edit of this service and edit the current configuration")
			}, run: runEdit},
		{name: "remove", args: "NET VIP [--yes]", short: "Delete a VIP (a permanent signed tombstone; recreating gives a new id).", min: 2, max: 2,
			long: "On a terminal it asks first. Without one (a script, a pipe) it refuses unless given --yes, which removes without asking.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.yes, "yes", false, "remove without asking (needed without a terminal)")
			},
			run: func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
				if !o.yes {
					if err := confirmRemove(ctx, c, a[0], a[1]); err != nil {
						return err
					}
				}
				return c.client.Do(ctx, http.MethodDelete, vipPath(a[0], a[1]), nil, nil)
			}},
	}}
}

func listenerPath(network, sel, listener string) (string, error) {
	k, err := vip.ParsePortKey(listener)
	if err != nil {
		return "", usageError{err.Error()}
	}
	return vipPath(network, sel) + "/ports/" + k.Proto.String() + "/" + strconv.Itoa(int(k.Port)), nil
}

// backendWhere says where a backend's application listens.
const backendWhere = "The application behind NODE:PORT listens, on a tun-mode node, on the node's overlay address (or any);\n" +
	"on a netstack-mode node, on 127.0.0.1:PORT, and only if that node's own config lists the port in backend_ports.\n" +
	"The node that will not serve a backend says so (a warning here, not-allowed in its vip status). See docs/tsng-config.md."

func mutateDoc(ctx context.Context, c *cliCtx, method, path string, body any) error {
	var d ServiceDoc
	if err := c.client.Do(ctx, method, path, body, &d); err != nil {
		return err
	}
	return printDoc(c, d)
}

func runPortSet(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	var req PortSetRequest
	switch o.portCheck {
	case "":
	case "on", "off":
		v := o.portCheck == "on"
		req.PortCheck = &v
	default:
		return usageError{fmt.Sprintf("--port-check %q: want on or off", o.portCheck)}
	}
	// A flag given is a value given, zero included: zero is outside every
	// range, so it is refused with the range rather than ignored.
	ranges := []struct {
		flag   string
		lo, hi int64
		def    string
		set    func()
		value  int64
	}{
		{"check-interval-ms", vip.MinCheckInterval.Milliseconds(), vip.MaxCheckInterval.Milliseconds(), "3000", func() { req.CheckIntervalMS = &o.checkIv }, o.checkIv},
		{"check-timeout-ms", vip.MinCheckTimeout.Milliseconds(), vip.MaxCheckInterval.Milliseconds(), "2000, at most the interval", func() { req.CheckTimeoutMS = &o.checkTo }, o.checkTo},
		{"failures", 1, vip.MaxCheckCount, "2", func() { req.Failures = &o.failures }, int64(o.failures)},
		{"successes", 1, vip.MaxCheckCount, "1", func() { req.Successes = &o.successes }, int64(o.successes)},
		{"idle-timeout", int64(vip.MinIdleTimeout.Seconds()), int64(vip.MaxIdleTimeout.Seconds()), "7200 for TCP, 120 for UDP", func() { req.IdleTimeoutS = &o.idle }, o.idle},
	}
	set := o.set["port-check"]
	for _, r := range ranges {
		if !o.set[r.flag] {
			continue
		}
		if r.value < r.lo || r.value > r.hi {
			return usageError{fmt.Sprintf("--%s %d: want %d-%d (default %s)", r.flag, r.value, r.lo, r.hi, r.def)}
		}
		r.set()
		set = true
	}
	if !set {
		return usageError{"port set needs at least one of --port-check, --check-interval-ms, --check-timeout-ms, --failures, --successes, --idle-timeout"}
	}
	p, err := listenerPath(a[0], a[1], a[2])
	if err != nil {
		return err
	}
	return mutateDoc(ctx, c, http.MethodPatch, p, req)
}

func runNetworkList(ctx context.Context, c *cliCtx, o *opts, _ []string) error {
	var all []NetworkSummary
	if err := c.client.Do(ctx, http.MethodGet, "/v1/networks", nil, &all); err != nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(c.env.Stdout)
		for _, n := range all {
			if err := enc.Encode(n); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tID\tSTATE\tVIPS")
	for _, n := range all {
		st := "down"
		if n.Up {
			st = "up"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", printable(n.Name), n.ID[:12], st, n.Services)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range all {
		for _, msg := range n.AddrCollisions {
			fmt.Fprintf(c.env.Stderr, "tsng: warning: network %s: %s\n", n.Name, msg)
		}
	}
	return nil
}

func runReload(ctx context.Context, c *cliCtx, _ *opts, _ []string) error {
	var res ReloadResult
	if err := c.client.Do(ctx, http.MethodPost, "/v1/reload", nil, &res); err != nil {
		return err
	}
	if c.json {
		return json.NewEncoder(c.env.Stdout).Encode(res)
	}
	for _, n := range res.Networks {
		var parts []string
		if len(n.Added) > 0 {
			parts = append(parts, "added "+strings.Join(n.Added, ", "))
		}
		if len(n.Removed) > 0 {
			parts = append(parts, "removed "+strings.Join(n.Removed, ", "))
		}
		if len(n.Changed) > 0 {
			parts = append(parts, "changed "+strings.Join(n.Changed, "; "))
		}
		if n.BackendPortsChanged {
			ports := "none"
			if len(n.BackendPorts) > 0 {
				ports = strings.Join(n.BackendPorts, ", ")
			}
			parts = append(parts, "backend_ports now "+ports)
		}
		if len(parts) == 0 {
			parts = []string{"no change"}
		}
		fmt.Fprintf(c.env.Stdout, "network %s: %s\n", printable(n.Network), printable(strings.Join(parts, "; ")))
	}
	if res.Note != "" {
		fmt.Fprintln(c.env.Stderr, "tsng: note:", printable(res.Note))
	}
	return nil
}

func runUpDown(verb string) func(context.Context, *cliCtx, *opts, []string) error {
	return func(ctx context.Context, c *cliCtx, _ *opts, a []string) error {
		var n NetworkSummary
		if err := c.client.Do(ctx, http.MethodPost, "/v1/networks/"+url.PathEscape(a[0])+"/"+verb, nil, &n); err != nil {
			return err
		}
		fmt.Fprintf(c.env.Stdout, "network %s is %s\n", printable(n.Name), map[bool]string{true: "up", false: "down"}[n.Up])
		return nil
	}
}

func runList(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	var nets []string
	if len(a) == 1 {
		nets = a
	} else {
		var all []NetworkSummary
		if err := c.client.Do(ctx, http.MethodGet, "/v1/networks", nil, &all); err != nil {
			return err
		}
		for _, n := range all {
			nets = append(nets, n.ID)
		}
	}
	var docs []ServiceDoc
	for _, n := range nets {
		var ds []ServiceDoc
		if err := c.client.Do(ctx, http.MethodGet, "/v1/networks/"+url.PathEscape(n)+"/vips", nil, &ds); err != nil {
			return err
		}
		docs = append(docs, ds...)
	}
	if c.json {
		enc := json.NewEncoder(c.env.Stdout)
		for _, d := range docs {
			if err := enc.Encode(d); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tNAME\tADDRESS\tLISTENERS\tREVISION\tSTATE")
	for _, d := range docs {
		var ls []string
		for _, l := range d.Listeners {
			ls = append(ls, fmt.Sprintf("%s(%d)", l.Key(), len(l.Backends)))
		}
		if len(ls) == 0 {
			ls = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(d.Network), printable(d.Name), d.Addr, strings.Join(ls, ","), d.Revision, docState(d))
	}
	return tw.Flush()
}

// state describes a service's state; member-written parts are escaped.
func state(v vip.ServiceView) string {
	switch {
	case v.Err != "":
		return "error: " + printable(v.Err)
	case v.NameConflict != "":
		return "name conflict: " + printable(v.NameConflict)
	case v.AddrMoved:
		return "routed (address moved)"
	case v.Routable:
		return "routed"
	}
	return "not routed"
}

func printDoc(c *cliCtx, d ServiceDoc) error {
	for _, w := range d.Warnings {
		fmt.Fprintln(c.env.Stderr, "tsng: warning:", printable(w))
	}
	if c.json {
		enc := json.NewEncoder(c.env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(d)
	}
	w := c.env.Stdout
	fmt.Fprintf(w, "%s.%s  %s  revision %s  %s\n", printable(d.Name), printable(d.Network), d.Addr, d.Revision, docState(d))
	for _, l := range d.Listeners {
		ck := l.Check.Effective()
		checks := "off"
		if l.Proto == vip.UDP {
			checks = "udp: path probes + ICMP"
		} else if ck.Enabled() {
			checks = fmt.Sprintf("every %v, timeout %v, %d fail / %d ok", time.Duration(ck.Interval), time.Duration(ck.Timeout), ck.Failures, ck.Successes)
		}
		fmt.Fprintf(w, "  %s  gen %d  idle %v  checks %s\n", l.Key(), l.Generation, l.EffectiveIdleTimeout(), checks)
		for _, b := range l.Backends {
			fmt.Fprintf(w, "    → %s:%d%s\n", d.nodeName(b.Node), b.Port, drainMark(l, b))
		}
	}
	fmt.Fprintf(w, "  id %s\n", d.ID)
	return nil
}

func completion(w io.Writer, shell string) error {
	root := rootCommand()
	var words []string
	var walk func(cmd *command, prefix string)
	walk = func(cmd *command, prefix string) {
		for _, s := range cmd.sub {
			words = append(words, prefix+s.name)
			walk(s, prefix+s.name+" ")
		}
	}
	walk(root, "")
	sort.Strings(words)
	switch shell {
	case "bash":
		fmt.Fprintln(w, "# tsng bash completion: source <(tsng completion bash)")
		fmt.Fprintln(w, "_tsng() {")
		fmt.Fprintln(w, `  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[*]:1:COMP_CWORD-1}"`)
		fmt.Fprintln(w, "  case \"$prev\" in")
		children := map[string][]string{}
		for _, wd := range words {
			parent := ""
			name := wd
			if i := strings.LastIndexByte(wd, ' '); i >= 0 {
				parent, name = wd[:i], wd[i+1:]
			}
			children[parent] = append(children[parent], name)
		}
		keys := make([]string, 0, len(children))
		for k := range children {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "    %q) COMPREPLY=($(compgen -W %q -- \"$cur\"));;\n", k, strings.Join(children[k], " "))
		}
		fmt.Fprintln(w, "    *) COMPREPLY=($(compgen -W \"--json --help --backend --watch\" -- \"$cur\"));;")
		fmt.Fprintln(w, "  esac")
		fmt.Fprintln(w, "}")
		fmt.Fprintln(w, "complete -F _tsng tsng")
		return nil
	case "zsh":
		fmt.Fprintln(w, "#compdef tsng")
		fmt.Fprintln(w, "# tsng zsh completion: tsng completion zsh > \"${fpath[1]}/_tsng\"")
		fmt.Fprintln(w, "autoload -U bashcompinit && bashcompinit")
		return completion(w, "bash")
	}
	return usageError{fmt.Sprintf("completion %q: want bash or zsh", shell)}
}
