package keelvip

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/buildinfo"
	"github.com/vipkit/vipkit/internal/clihelp"
)

// commands are keel-vip's commands, in the order of its help.
var commands = []clihelp.Command{
	{Synopsis: "keygen --dir DIR --id ID --addr ADDR [--endpoint HOST:PORT]",
		Desc: "write a new node's WireGuard key and Ed25519 seed to DIR/wg.key and DIR/sign.key (mode 0600, never overwritten); print the public keys and the node's stanza for the other nodes' mesh files"},
	{Synopsis: "tend --mesh FILE [--children spawn|units]",
		Desc: "run the root helper (it starts the controller and the listener, or systemd does with --children units)"},
	{Synopsis: "check --mesh FILE", Desc: "validate the mesh file and the margins of its timings"},
	{Synopsis: "pair propose --mesh FILE --peer ADDR --out FILE",
		Desc: "build the pair record with the peer, signed by this node"},
	{Synopsis: "pair sign --mesh FILE --in FILE [--out FILE] [--root-key FILE]",
		Desc: "check and sign a proposed record (default out: appliance.pair_file)"},
	{Synopsis: "promote --mesh FILE [--old-primary-gone]", Desc: "make this node the holder of the VIP"},
	{Synopsis: "status --mesh FILE [--json]", Desc: "print the running controller's view of the VIP"},
	{Synopsis: "inspect --mesh FILE [--spec FILE]",
		Desc: "emit the node's spec with appliance.vip (to FILE, else stdout), then one line per VIP: role, epoch, holder, fenced, carried, routed-to"},
	{Synopsis: "allocate --mesh FILE [--from-spec FILE] [--reserve ADDR,...] [--pair-file FILE]",
		Desc: "write appliance.vip into the mesh file: a free /128 of this node's /112 (the primary), or the VIP of the primary's emitted spec"},
	{Synopsis: "render --mesh FILE [--holder ADDR] [--out FILE]",
		Desc: "write the wg-quick config, the VIP routed to its holder"},
	{Synopsis: "reload --mesh FILE", Desc: "have the running helper read etcd's TLS files now and hand new ones to the controller (ExecReload)"},
	{Synopsis: "drop-all --mesh FILE", Desc: "drop every VIP from the interface (ExecStopPost)"},
}

// Commands returns the names of keel-vip's commands ("pair propose" for a
// subcommand), in the order of its help.
func Commands() []string {
	var out []string
	for _, c := range commands {
		f := strings.Fields(c.Synopsis)
		if f[0] == "pair" {
			out = append(out, f[0]+" "+f[1])
		} else {
			out = append(out, f[0])
		}
	}
	return out
}

func commandOf(name string) (clihelp.Command, bool) {
	for _, c := range commands {
		if strings.HasPrefix(c.Synopsis+" ", name+" ") {
			return c, true
		}
	}
	return clihelp.Command{}, false
}

// usage is keel-vip's help, wrapped to 80 columns.
var usage = func() string {
	var b strings.Builder
	b.WriteString("usage: keel-vip <command> [flags]\n       keel-vip --help | --version\n\ncommands:\n")
	clihelp.WriteCommands(&b, commands)
	b.WriteString("\nRun 'keel-vip COMMAND --help' for a command's flags.\n")
	return b.String()
}()

func isHelp(a string) bool { return a == "-h" || a == "--help" || a == "-help" || a == "help" }

// Version returns "keel-vip MODULE VERSION (revision REV, ...; GOVERSION)"
// from the build info (internal/buildinfo, which tsng's --version uses
// too): the module's version and the VCS revision it was built from.
func Version() string {
	bi := buildinfo.Read()
	return "keel-vip " + bi.Module + " " + bi.String()
}

// Exit codes of Main.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// DispatchExec runs the subcommand named by ExecEnv and exits, when that
// variable is set (the helper re-executes its binary that way to start the
// controller and the listener); otherwise it returns at once. Call it first
// in main, or in TestMain of a test binary the helper re-executes.
func DispatchExec() {
	sub := os.Getenv(ExecEnv)
	if sub == "" {
		return
	}
	os.Unsetenv(ExecEnv)
	ctx, stop := signalContext()
	defer stop()
	// Under systemd (keel-vip-control.service, keel-vip-members.service)
	// the mesh file is a credential (LoadCredential=mesh:...); started by
	// the helper, it comes on stdin.
	var in io.Reader = os.Stdin
	var f *os.File
	var err error
	if p := os.Getenv(ListenConfigEnv); sub == "listen" && p != "" {
		// The listener's configuration, which the helper writes (no key).
		f, err = waitOpen(ctx, p)
	} else if sub != "listen" {
		f, err = openCredential("mesh")
	}
	if f != nil {
		defer f.Close()
		in = f
	}
	if err == nil {
		switch sub {
		case "control":
			err = RunController(ctx, in, os.Stderr)
		case "listen":
			err = RunListener(ctx, in, os.Stderr)
		default:
			err = fmt.Errorf("keelvip: unknown subcommand %q", sub)
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "keel-vip "+sub+":", err)
		os.Exit(ExitError)
	}
	os.Exit(ExitOK)
}

// ListenConfigEnv names the file the members' listener reads its
// ListenerConfig from under systemd (keel-vip-members.service sets it to
// /run/keel-vip/listen.json, which the helper writes). Without it the
// listener reads it on stdin, from the helper that started it.
const ListenConfigEnv = "KEELVIP_LISTEN_CONFIG"

// waitOpen opens path, waiting for it to appear until ctx ends (the
// listener's unit may start before the helper has written its file).
func waitOpen(ctx context.Context, path string) (*os.File, error) {
	for {
		f, err := os.Open(path)
		if err == nil || !errors.Is(err, os.ErrNotExist) {
			return f, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CredentialsEnv is systemd's variable that names the directory of a
// unit's credentials (LoadCredential=): the controller's and the listener's
// units get the mesh file ("mesh") and the pair record ("pair") that way,
// readable by their dynamic users only.
const CredentialsEnv = "CREDENTIALS_DIRECTORY"

// openCredential opens the credential name, or returns nil, nil when the
// process has no credentials directory or no such credential.
func openCredential(name string) (*os.File, error) {
	dir := os.Getenv(CredentialsEnv)
	if dir == "" {
		return nil, nil
	}
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("keelvip: credential %s: %w", name, err)
	}
	return f, nil
}

// Main runs the keel-vip command line with args (without the program
// name) and returns the exit code. ctx ends tend (SIGTERM in cmd/keel-vip).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	case "--version", "-version", "version":
		fmt.Fprintln(stdout, Version())
		return ExitOK
	}
	if cmd == "pair" {
		if len(rest) == 0 {
			fmt.Fprint(stderr, usage)
			return ExitUsage
		}
		if isHelp(rest[0]) {
			fmt.Fprint(stdout, usage)
			return ExitOK
		}
		cmd, rest = "pair "+rest[0], rest[1:]
	}
	if cmd == "keygen" {
		return runKeygen(rest, stdout, stderr)
	}
	fs := newFlagSet(cmd, stderr)
	meshPath := fs.String("mesh", "/etc/keel/mesh.json", "the mesh `FILE`")
	var (
		asJSON, gone                   *bool
		peer, in, out, rootKey         *string
		holder, exe, setprivPath       *string
		children, ctlCgroup, lisCgroup *string
		specOut, fromSpec, reserve     *string
		pairFile                       *string
	)
	switch cmd {
	case "tend":
		exe = fs.String("exe", "", "the `PROGRAM` to run as the controller and listener (default: this one)")
		setprivPath = fs.String("setpriv", "", "the setpriv `BINARY` (default: from PATH)")
		children = fs.String("children", "spawn", "`MODE`: spawn, the helper starts the controller and listener (setpriv); units, systemd starts them as their own units")
		ctlCgroup = fs.String("controller-cgroup", "", "with --children units: the controller unit's `CGROUP` (default "+DefaultControllerCgroup+")")
		lisCgroup = fs.String("listener-cgroup", "", "with --children units: the listener unit's `CGROUP` (default "+DefaultListenerCgroup+")")
	case "status":
		asJSON = fs.Bool("json", false, "print JSON")
	case "inspect":
		specOut = fs.String("spec", "", "write the emitted spec to `FILE` (default: stdout, before the VIP lines)")
	case "allocate":
		fromSpec = fs.String("from-spec", "", "take appliance.vip from the spec `FILE` the primary emitted (keel-vip inspect --spec)")
		reserve = fs.String("reserve", "", "keep the VIPs of other pairs clear (`ADDR,...`, comma-separated)")
		pairFile = fs.String("pair-file", "", "the appliance.pair_file `FILE` to write when the mesh file names none (default: pair.rec beside it)")
	case "drop-all", "check", "reload":
	case "promote":
		gone = fs.Bool("old-primary-gone", false, "the old primary is gone: wait for its lease instead of its release")
	case "pair propose":
		peer = fs.String("peer", "", "the other member's overlay `ADDR`")
		out = fs.String("out", "", "the `FILE` to write the proposal to")
	case "pair sign":
		in = fs.String("in", "", "the proposal `FILE` to sign")
		out = fs.String("out", "", "the `FILE` to write the record to (default: appliance.pair_file)")
		rootKey = fs.String("root-key", "", "sign with the trust root's key in `FILE` (base64 Ed25519 seed) in place of this node")
	case "render":
		holder = fs.String("holder", "", "route the VIP to the holder at `ADDR` (default: the running controller's holder)")
		out = fs.String("out", "", "the output `FILE` (default: stdout)")
	default:
		fmt.Fprintf(stderr, "keel-vip: unknown command %q\n%s", cmd, usage)
		return ExitUsage
	}
	if code, ok := parseFlags(fs, cmd, rest, stdout, stderr); !ok {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "keel-vip %s: %v\n", cmd, err)
		return ExitError
	}
	raw, err := readSmall(*meshPath, MaxMeshFileSize)
	if err != nil {
		return fail(err)
	}
	m, err := LoadMesh(*meshPath)
	if err != nil {
		return fail(err)
	}
	switch cmd {
	case "allocate":
		var vip netip.Addr
		if *fromSpec != "" {
			sp, err := readSpecFile(*fromSpec)
			if err != nil {
				return fail(err)
			}
			if vip, err = m.VIPFromSpec(sp); err != nil {
				return fail(err)
			}
		} else {
			var extra []netip.Addr
			for _, f := range strings.FieldsFunc(*reserve, func(r rune) bool { return r == ',' }) {
				a, err := netip.ParseAddr(strings.TrimSpace(f))
				if err != nil {
					fmt.Fprintf(stderr, "keel-vip allocate: --reserve %q: not an address\n", f)
					return ExitUsage
				}
				extra = append(extra, a)
			}
			if vip, err = m.AllocateVIP(nil, extra...); err != nil {
				return fail(err)
			}
		}
		if err := SetMeshVIP(*meshPath, vip, *pairFile); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "appliance.vip %v written to %s\n", vip, *meshPath)
		return ExitOK
	case "check":
		if err := m.CheckTimings(); err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout, "ok")
		return ExitOK
	case "tend":
		var units *Units
		switch *children {
		case "spawn":
		case "units":
			units = &Units{ControllerCgroup: *ctlCgroup, ListenerCgroup: *lisCgroup}
		default:
			fmt.Fprintf(stderr, "keel-vip tend: --children %q: want spawn or units\n", *children)
			return ExitUsage
		}
		return exitOf(fail, runHelper(ctx, HelperOptions{Mesh: m, MeshRaw: raw, Exe: *exe, Setpriv: *setprivPath, Log: stderr, Units: units}))
	case "drop-all":
		return exitOf(fail, dropAll(ctx, m))
	case "reload":
		if err := callJSON(ctx, adminHTTP(m), http.MethodPost, "http://admin"+reloadPath, struct{}{}, nil, nil); err != nil {
			return fail(notRunning(err))
		}
		fmt.Fprintln(stdout, "the helper reads etcd's TLS files now; its log says what the controller took")
		return ExitOK
	case "status", "inspect":
		s, err := adminStatus(ctx, m)
		if err != nil {
			return fail(err)
		}
		switch {
		case cmd == "inspect":
			vip, _ := netip.ParseAddr(s.VIP)
			spec := m.Spec(vip).Encode()
			if *specOut != "" {
				if err := writeFileAtomic(*specOut, spec, 0o644); err != nil {
					return fail(err)
				}
			} else if _, err := stdout.Write(spec); err != nil {
				return fail(err)
			}
			fmt.Fprintln(stdout, s.InspectLine())
		case *asJSON:
			return exitOf(fail, s.WriteJSON(stdout))
		default:
			return exitOf(fail, s.WriteText(stdout))
		}
		return ExitOK
	case "promote":
		var rep PromoteReply
		err := callJSON(ctx, adminHTTP(m), http.MethodPost, "http://admin"+promotePath, promoteRequest{OldPrimaryGone: *gone}, &rep, nil)
		if err != nil {
			// Whoever claimed, what counts is whether this node holds the
			// VIP now: a promote can fail its own step while the node's
			// controller claimed.
			if s, serr := adminStatus(ctx, m); serr == nil && s.Role == claim.RoleHolder.String() && s.Carried {
				fmt.Fprintf(stdout, "this node holds the VIP at epoch %d (%v; the promote reported: %v)\n", s.Epoch, m.VIP, err)
				return ExitOK
			}
			return fail(notRunning(err))
		}
		how := "promoted"
		switch {
		case rep.AlreadyHeld:
			how = "already held"
		case rep.ByController:
			how = "its controller claimed first"
		}
		fmt.Fprintf(stdout, "this node holds the VIP at epoch %d (%v, %s)\n", rep.Epoch, m.VIP, how)
		return ExitOK
	case "pair propose":
		p, err := netip.ParseAddr(*peer)
		if err != nil || *out == "" {
			fmt.Fprintln(stderr, "keel-vip pair propose: --peer ADDR and --out FILE are required")
			return ExitUsage
		}
		pr, err := ProposePair(m, p)
		if err != nil {
			return fail(err)
		}
		b, _ := EncodePairFile(pr)
		return exitOf(fail, writeFileAtomic(*out, b, 0o644))
	case "pair sign":
		b, err := readSmall(*in, MaxPairFileSize)
		if err != nil {
			return fail(err)
		}
		pr, err := ParsePairFile(b)
		if err != nil {
			return fail(err)
		}
		var root ed25519.PrivateKey
		if *rootKey != "" {
			kb, err := readSmall(*rootKey, 256)
			if err != nil {
				return fail(err)
			}
			seed, err := parseB64Key("root key", strings.TrimSpace(string(kb)))
			if err != nil {
				return fail(err)
			}
			root = ed25519.NewKeyFromSeed(seed[:])
		}
		if err := SignPair(m, pr, root); err != nil {
			return fail(err)
		}
		dst := *out
		if dst == "" {
			dst = m.PairFile
		}
		b, _ = EncodePairFile(pr)
		if err := writeFileAtomic(dst, b, 0o644); err != nil {
			return fail(err)
		}
		pol, _ := m.Policy()
		if err := pr.Complete(pol.Trust.IsRoot); err != nil {
			fmt.Fprintf(stdout, "signed; the record still needs the other member's signature (%v)\n", err)
		} else {
			fmt.Fprintln(stdout, "signed; the record is complete")
		}
		return ExitOK
	case "render":
		h := netip.Addr{}
		if *holder != "" {
			if h, err = netip.ParseAddr(*holder); err != nil {
				return fail(fmt.Errorf("%w: --holder: %v", ErrMesh, err))
			}
		} else if m.Tended().IsValid() {
			if s, err := adminStatus(ctx, m); err == nil && s.Holder != "" {
				h = m.addrOfID(s.Holder)
			}
		}
		var w io.Writer = stdout
		var sb strings.Builder
		if *out != "" {
			w = &sb
		}
		if err := m.Render(w, m.Tended(), h); err != nil {
			return fail(err)
		}
		if *out != "" {
			return exitOf(fail, writeFileAtomic(*out, []byte(sb.String()), 0o600))
		}
		return ExitOK
	}
	return ExitUsage
}

func (m *Mesh) addrOfID(id string) netip.Addr {
	if id == m.Self.ID {
		return m.Self.Addr
	}
	for _, p := range m.Peers {
		if p.ID == id {
			return p.Addr
		}
	}
	return netip.Addr{}
}

func exitOf(fail func(error) int, err error) int {
	if err != nil && !errors.Is(err, context.Canceled) {
		return fail(err)
	}
	return ExitOK
}

func adminHTTP(m *Mesh) *http.Client {
	hc := unixHTTP(AdminSocket(m), nil, 5*time.Minute)
	hc.Transport.(*http.Transport).DisableKeepAlives = true // one call per command
	return hc
}

func notRunning(err error) error {
	if err == nil {
		return nil
	}
	var oe interface{ Timeout() bool }
	if errors.Is(err, os.ErrNotExist) || errors.As(err, &oe) && strings.Contains(err.Error(), "dial") || strings.Contains(err.Error(), "connect:") {
		return fmt.Errorf("%w: %v", ErrNotRunning, err)
	}
	return err
}

func adminStatus(ctx context.Context, m *Mesh) (Status, error) {
	var s Status
	err := callJSON(ctx, adminHTTP(m), http.MethodGet, "http://admin"+statusPath, nil, &s, nil)
	return s, notRunning(err)
}

// newFlagSet makes the flag set of command cmd, whose --help prints the
// command's synopsis, its description and its flags, wrapped to 80
// columns.
func newFlagSet(cmd string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("keel-vip "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		w := fs.Output()
		if c, ok := commandOf(cmd); ok {
			io.WriteString(w, clihelp.Hang("usage: keel-vip ", c.Synopsis, 7, clihelp.Width))
			io.WriteString(w, "\n"+clihelp.Wrap(c.Desc, 0, clihelp.Width))
		}
		io.WriteString(w, "\nflags:\n")
		clihelp.WriteFlags(w, fs)
	}
	return fs
}

// parseFlags parses args into fs. It returns ok false with the exit code
// when the command should stop: ExitOK after --help (printed to stdout),
// ExitUsage for a bad flag or a stray argument.
func parseFlags(fs *flag.FlagSet, cmd string, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	// The flag package prints the usage itself on an error and on -h:
	// the help goes to stdout, an error and the usage to stderr.
	var msg strings.Builder
	fs.SetOutput(&msg)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		io.WriteString(stdout, msg.String())
		return ExitOK, false
	}
	if err != nil {
		io.WriteString(stderr, msg.String())
		return ExitUsage, false
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "keel-vip %s: unexpected arguments %q\n", cmd, fs.Args())
		return ExitUsage, false
	}
	return ExitOK, true
}

// runKeygen is `keel-vip keygen`.
func runKeygen(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("keygen", stderr)
	dir := fs.String("dir", "", "the `DIR` to write wg.key and sign.key to (made 0700 when missing)")
	id := fs.String("id", "", "the node's `ID` (node.id in its mesh file)")
	addr := fs.String("addr", "", "the node's IPv6 overlay `ADDR`")
	endpoint := fs.String("endpoint", "", "the node's underlay `HOST:PORT` the other nodes reach it at, if it has a fixed one")
	if code, ok := parseFlags(fs, "keygen", args, stdout, stderr); !ok {
		return code
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "keel-vip keygen: "+format+"\n", a...)
		return ExitUsage
	}
	if *dir == "" || *id == "" || *addr == "" {
		return usageErr("--dir, --id and --addr are required")
	}
	a, err := netip.ParseAddr(*addr)
	if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
		return usageErr("--addr %q: want the node's IPv6 overlay address", *addr)
	}
	if !validID(*id) {
		return usageErr("--id %q: a-z, 0-9, '-', '_' and '.' only, 1 to 63 bytes", *id)
	}
	var ep netip.AddrPort
	if *endpoint != "" {
		if ep, err = netip.ParseAddrPort(*endpoint); err != nil || ep.Port() == 0 || ep.Addr().IsUnspecified() || ep.Addr().IsMulticast() {
			return usageErr("--endpoint %q: want HOST:PORT with an IP address", *endpoint)
		}
	}
	st, err := Keygen(*dir, *id, a, ep)
	if err != nil {
		fmt.Fprintf(stderr, "keel-vip keygen: %v\n", err)
		return ExitError
	}
	printKeygen(stdout, *dir, st)
	return ExitOK
}
