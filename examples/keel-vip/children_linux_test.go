//go:build linux

package keelvip_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/transport/netns"
)

func registerChildren() {
	runTestMain()
	netns.RegisterChild("keel-tend", tendChild)
	netns.RegisterChild("etcd", etcdChild)
	netns.RegisterChild("keel-unit", unitChild)
	netns.RegisterChild("keel-tend-units", unitHelperChild)
	netns.RegisterChild("http-server", httpServerChild)
	netns.DispatchChild()
}

// tendChild runs `keel-vip tend --mesh args[0] --exe args[1]` in its
// namespace.
func tendChild(ctx context.Context, args []string) error {
	if code := keelvip.Main(ctx, []string{"tend", "--mesh", args[0], "--exe", args[1]}, os.Stdout, os.Stderr); code != 0 {
		return fmt.Errorf("tend exited %d", code)
	}
	return nil
}

// etcdChild runs one embedded etcd member: name dir initial-cluster
// peer-url client-url tick-ms election-ms.
func etcdChild(ctx context.Context, args []string) error {
	if len(args) != 7 {
		return fmt.Errorf("etcd child: %d args", len(args))
	}
	name, dir, cluster := args[0], args[1], args[2]
	pu, err := url.Parse(args[3])
	if err != nil {
		return err
	}
	cu, err := url.Parse(args[4])
	if err != nil {
		return err
	}
	tick, _ := strconv.Atoi(args[5])
	elect, _ := strconv.Atoi(args[6])
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = cluster
	cfg.InitialClusterToken = "keel-vip-e2e"
	cfg.TickMs, cfg.ElectionMs = uint(tick), uint(elect)
	cfg.UnsafeNoFsync = true
	// The member logs at info to etcd.log beside its data directory
	// (appended across restarts): the tests show it when a run fails.
	lc := zap.NewProductionConfig()
	lc.OutputPaths = []string{filepath.Join(filepath.Dir(dir), "etcd.log")}
	lc.ErrorOutputPaths = lc.OutputPaths
	lc.Sampling = nil
	lg, err := lc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = lg.Sync() }()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd %s ready (%s)\n", name, strings.Join([]string{cu.String(), pu.String()}, " "))
	case err := <-e.Err():
		return err
	case <-ctx.Done():
		return nil
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("etcd %s not ready after 2 minutes", name)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}

// unitChild plays systemd starting one of the helper's units: it moves
// itself into the unit's cgroup, then execs the test binary as the
// unit's user with no capability at all and no_new_privs (setpriv), with
// the subcommand and the credentials directory in its environment. args:
// cgroup directory, uid, credentials directory, executable, subcommand.
func unitChild(ctx context.Context, args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("unit child: %d args", len(args))
	}
	cg, uid, creds, exe, sub := args[0], args[1], args[2], args[3], args[4]
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return err
	}
	argv := []string{setpriv, "--reuid=" + uid, "--regid=" + uid, "--clear-groups",
		"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs",
		"--pdeathsig=KILL", "--", exe, sub}
	env := append(os.Environ(), keelvip.ExecEnv+"="+sub, keelvip.CredentialsEnv+"="+creds)
	if sub == "listen" {
		// As keel-vip-members.service: the helper's listen.json (the
		// node's run directory is beside its credentials here).
		env = append(env, keelvip.ListenConfigEnv+"="+filepath.Join(filepath.Dir(creds), "run", "listen.json"))
	}
	return syscall.Exec(setpriv, argv, env)
}

// unitHelperChild plays systemd starting keel-vip.service: the helper as
// root with its bounding set cut to CAP_NET_ADMIN and CAP_DAC_OVERRIDE
// (CapabilityBoundingSet=), running `tend --children units`. args: mesh
// file, executable, controller cgroup, listener cgroup.
func unitHelperChild(ctx context.Context, args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("unit helper child: %d args", len(args))
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return err
	}
	main, _ := json.Marshal([]string{"tend", "--children", "units", "--mesh", args[0],
		"--controller-cgroup", args[2], "--listener-cgroup", args[3]})
	argv := []string{setpriv, "--bounding-set=-all,+net_admin,+dac_override", "--inh-caps=-all", "--ambient-caps=-all",
		"--pdeathsig=KILL", "--", args[1], "-test.run=^$"}
	return syscall.Exec(setpriv, argv, append(os.Environ(), testMainEnv+"="+string(main)))
}

// testMainEnv makes TestMain run keelvip.Main with the JSON array of
// arguments it holds (how unitHelperChild runs tend after its exec).
const testMainEnv = "KEELVIP_TEST_MAIN"

// dialEnv makes TestMain dial the unix socket it names, post one carrier
// request, print the outcome and exit: a process that is not the
// controller knocking on the helper's socket.
const dialEnv = "KEELVIP_TEST_DIAL"

// dialURLEnv and dialBodyEnv, with dialEnv, name the URL and the body of
// the request posted (default: a carrier drop).
const (
	dialURLEnv  = "KEELVIP_TEST_DIAL_URL"
	dialBodyEnv = "KEELVIP_TEST_DIAL_BODY"
)

// runTestMain handles testMainEnv and dialEnv; it returns when neither is
// set.
func runTestMain() {
	if args := os.Getenv(testMainEnv); args != "" {
		var a []string
		if err := json.Unmarshal([]byte(args), &a); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		code := keelvip.Main(ctx, a, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if path := os.Getenv(dialEnv); path != "" {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
		url, body := "http://helper/carrier", `{"op":"drop","vip":"fd00::1"}`
		if u := os.Getenv(dialURLEnv); u != "" {
			url, body = u, os.Getenv(dialBodyEnv)
		}
		resp, err := hc.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			fmt.Println("refused:", err)
			os.Exit(0)
		}
		resp.Body.Close()
		fmt.Println("answered:", resp.Status)
		os.Exit(0)
	}
}

// childInputEnv names a directory (mode 1777) where a child the helper
// starts writes what it got on stdin, before running as usual: the tests
// check that the listener is handed no key.
const childInputEnv = "KEELVIP_TEST_CHILD_INPUT"

// captureChildInput handles childInputEnv in a child the helper started.
func captureChildInput() {
	dir, sub := os.Getenv(childInputEnv), os.Getenv(keelvip.ExecEnv)
	if dir == "" || sub == "" || os.Getenv(keelvip.ListenConfigEnv) != "" || os.Getenv(keelvip.CredentialsEnv) != "" {
		return
	}
	b, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capture stdin:", err)
		os.Exit(2)
	}
	p := filepath.Join(dir, fmt.Sprintf("%s-%d.in", sub, os.Getuid()))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "capture stdin:", err)
		os.Exit(2)
	}
	r, w, err := os.Pipe()
	if err != nil {
		os.Exit(2)
	}
	go func() { _, _ = w.Write(b); w.Close() }()
	os.Stdin = r
}
