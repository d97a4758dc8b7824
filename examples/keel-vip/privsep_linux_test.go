//go:build linux

package keelvip_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/internal/testenv"
)

// procStatus returns the fields of /proc/pid/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// pidsOfUID returns the processes whose real uid is uid.
func pidsOfUID(uid uint32) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" && f[1] == strconv.Itoa(int(uid)) {
				out = append(out, pid)
			}
		}
	}
	return out
}

func checkMode(t *testing.T, path string, mode os.FileMode, uid uint32) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != mode || st.Uid != uid {
		t.Errorf("%s: mode %v uid %d, want %v uid %d", path, fi.Mode().Perm(), st.Uid, mode, uid)
	}
}

// TestPrivilegeSplitNoEtcd runs the three processes of every node in three
// namespaces without etcd, and checks the split from the kernel's side:
// the controller and the listener run as their own unprivileged users
// with no capabilities at all (CapEff, CapPrm, CapBnd 0) and no_new_privs;
// the sockets are 0600 in 0700 directories; a process other than the
// controller is refused on the helper's socket (SO_PEERCRED). Then the
// no-etcd mode end to end: promote over the members' channel, C reaches
// the VIP, a stale claim and a claim from the wrong sender are refused by
// the helper's check, status and inspect, render with the holder, no
// drift, and stopping tend drops the VIP.
func TestPrivilegeSplitNoEtcd(t *testing.T) {
	seed := testenv.Seed(t, 75)
	inputs, err := os.MkdirTemp("", "keelvip-inputs-") // t.TempDir's parent is root's 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(inputs) })
	if err := os.Chmod(inputs, 0o1777); err != nil {
		t.Fatal(err)
	}
	t.Setenv(childInputEnv, inputs)
	c := newCluster(t, seed, false, nil, "a", "b", "c")
	A, B, C := c.node("a"), c.node("b"), c.node("c")
	// The members run a role-change hook, which records its role, epoch,
	// uid and capabilities: it runs as the controller's user, with none.
	hookDir := filepath.Join(inputs, "hooks")
	if err := os.Mkdir(hookDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(hookDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{A, B} {
		addHook(t, n, []string{"/bin/sh", "-c", `echo "$KEEL_ROLE $KEEL_EPOCH $(id -u) $(grep CapEff /proc/$$/status | tr -d '\t')" >> ` + filepath.Join(hookDir, n.name)})
	}
	c.start()
	c.serveNames()

	for _, n := range c.nodes {
		for _, who := range []struct {
			uid  uint32
			name string
		}{{n.ctlUID, "controller"}, {n.lisUID, "listener"}} {
			var pids []int
			waitFor(t, 30*time.Second, n.name+" "+who.name, func() bool { pids = pidsOfUID(who.uid); return len(pids) == 1 })
			st := procStatus(t, pids[0])
			uid := strconv.Itoa(int(who.uid))
			if st["Uid"] != strings.Join([]string{uid, uid, uid, uid}, "\t") {
				t.Errorf("%s %s: Uid %q, want %s everywhere", n.name, who.name, st["Uid"], uid)
			}
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if st[k] != "0000000000000000" {
					t.Errorf("%s %s: %s %s, want 0", n.name, who.name, k, st[k])
				}
			}
			if st["NoNewPrivs"] != "1" {
				t.Errorf("%s %s: NoNewPrivs %q", n.name, who.name, st["NoNewPrivs"])
			}
			if st["Groups"] != "" {
				t.Errorf("%s %s: supplementary groups %q", n.name, who.name, st["Groups"])
			}
		}
		run := n.mesh.RunDir
		checkMode(t, filepath.Join(run, "ctl"), 0o700, n.ctlUID)
		checkMode(t, filepath.Join(run, "members"), 0o700, n.lisUID)
		// The helper's sockets stay root's (no chown by path): the 0700
		// directory of the child's user is the barrier, SO_PEERCRED the
		// check.
		checkMode(t, filepath.Join(run, "ctl", "helper.sock"), 0o666, 0)
		checkMode(t, filepath.Join(run, "ctl", "control.sock"), 0o600, n.ctlUID)
		checkMode(t, filepath.Join(run, "members", "members.sock"), 0o666, 0)
		checkMode(t, keelvip.AdminSocket(n.mesh), 0o600, 0)
		checkMode(t, n.mesh.StateDir, 0o700, n.ctlUID)
		if n.member {
			checkMode(t, filepath.Join(n.mesh.StateDir, "pair.rec"), 0o644, 0)
		}
		checkListenerHasNoKey(t, n, inputs)
		// Readable process titles: "keel-vip control NODE".
		for _, who := range []struct {
			uid  uint32
			want string
		}{{n.ctlUID, "control " + n.name}, {n.lisUID, "listen " + n.name}} {
			for _, pid := range pidsOfUID(who.uid) {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				title := strings.ReplaceAll(string(b), "\x00", " ")
				if !strings.Contains(title, who.want) || strings.Contains(title, "-test.") {
					t.Errorf("%s: process title %q, want ... %s", n.name, title, who.want)
				}
			}
		}
	}

	// control.sock answers the helper (root) only: the controller's own
	// uid, the listener's and any other are refused, so none of them can
	// promote or clear the fence.
	setpriv := testenv.NeedBinary(t, "setpriv")
	for _, uid := range []uint32{A.ctlUID, A.lisUID, 64999} {
		u := strconv.Itoa(int(uid))
		cmd := exec.Command(setpriv, "--reuid="+u, "--regid="+u, "--clear-groups", "--", c.exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), dialEnv+"="+filepath.Join(A.mesh.RunDir, "ctl", "control.sock"),
			dialURLEnv+"=http://control/promote", dialBodyEnv+`={"old_primary_gone":true}`)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "refused:") {
			t.Errorf("uid %d on control.sock: %v %q, want refused", uid, err, out)
		}
	}

	// The helper's socket refuses anyone but the controller's pid.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(A.mesh.RunDir, "ctl", "helper.sock"))
	}}}
	resp, err := hc.Post("http://helper/carrier", "application/json", strings.NewReader(`{"op":"drop","vip":"`+testVIP.String()+`"}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("helper answered a process that is not its controller: %s", resp.Status)
	}

	// No etcd: promote A over the members' channel.
	waitFor(t, 30*time.Second, "promote A", func() bool {
		out, err := c.promote(A, false)
		if err != nil {
			t.Logf("promote a: %v", err)
		}
		return err == nil && strings.Contains(out, "epoch 1")
	})
	// C learns of the move from A's announcement (no etcd), retried every
	// tend tick until C answers; on a loaded CI machine the first
	// handshakes through the tunnel can take a while.
	waitFor(t, 45*time.Second, "C reaches the VIP at A", func() bool {
		n, err := reach(C, 2*time.Second)
		if err != nil || n != "a" {
			st, serr := c.status(C)
			t.Logf("c: reached %q (%v); status %+v %v", n, err, st, serr)
		}
		return err == nil && n == "a"
	})
	// A peer that did not answer A's promote (its WireGuard session still
	// handshaking) learns of the move from A's next announcement.
	for _, n := range []*node{B, C} {
		waitFor(t, 30*time.Second, n.name+" routes the VIP to a", func() bool {
			st, err := c.status(n)
			ok := err == nil && st.RoutedTo == "a" && st.Holder == "a" && st.Epoch == 1 && len(st.Drift) == 0 && !st.Carried
			if !ok {
				t.Logf("%s status %+v %v: want routed to a, epoch 1, no drift", n.name, st, err)
			}
			return ok
		})
	}
	stA, err := c.status(A)
	if err != nil || stA.Role != "primary" || !stA.Carried || stA.RoutedTo != "" || stA.Etcd {
		t.Errorf("a status %+v %v", stA, err)
	}
	var out, errb bytes.Buffer
	if code := keelvip.Main(context.Background(), []string{"inspect", "--mesh", C.meshPath}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "role=observer epoch=1 holder=a fenced=no carried=no routed-to=a") {
		t.Errorf("inspect on c: %d %q %s", code, out.String(), errb.String())
	}
	// inspect --spec against the running helper writes the spec with the
	// VIP it tends, and no private key.
	out.Reset()
	specPath := filepath.Join(A.dir, "a.spec.json")
	if code := keelvip.Main(context.Background(), []string{"inspect", "--mesh", A.meshPath, "--spec", specPath}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "role=primary epoch=1") {
		t.Errorf("inspect --spec on a: %d %q %s", code, out.String(), errb.String())
	}
	if raw, err := os.ReadFile(specPath); err != nil {
		t.Errorf("inspect --spec wrote no spec: %v", err)
	} else if sp, err := keelvip.ParseSpec(bytes.NewReader(raw)); err != nil || sp.Appliance.VIP != testVIP.String() || strings.Contains(string(raw), "private") {
		t.Errorf("the spec a emitted: %v %s", err, raw)
	}
	out.Reset()
	if code := keelvip.Main(context.Background(), []string{"render", "--mesh", C.meshPath}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), A.addr.String()+"/128, "+testVIP.String()+"/128") {
		t.Errorf("render on c does not route the VIP to a: %s", out.String())
	}

	// Planned promote to B (release, take, announce), then a stale claim
	// of A (epoch 1 < 2) is refused by C, and a claim posted from the wrong
	// address is refused by C's helper before the controller sees it.
	if _, err := c.promote(B, false); err != nil {
		t.Fatalf("promote b: %v", err)
	}
	waitFor(t, 20*time.Second, "C reaches the VIP at B", func() bool { n, err := reach(C, 2*time.Second); return err == nil && n == "b" })
	// The hooks ran for each role change: A from its start (fenced while
	// unchecked: a new node's state holds no claim) to holder at epoch 1,
	// then gave it up at 2 (released, then replica), B to holder at 2.
	for n, want := range map[*node][]string{A: {"fenced 0|replica 0", "holder 1", "released 1|replica 2|released 2"}, B: {"fenced 0|replica 0", "holder 2"}} {
		waitFor(t, 20*time.Second, n.name+"'s hook runs", func() bool {
			b, _ := os.ReadFile(filepath.Join(hookDir, n.name))
			suffix := fmt.Sprintf(" %d CapEff:0000000000000000", n.ctlUID)
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				r, ok := strings.CutSuffix(l, suffix)
				if !ok {
					t.Errorf("%s's hook ran as %q, want uid %d without capabilities", n.name, l, n.ctlUID)
					return true
				}
				got = append(got, r)
			}
			// want is a subsequence of got; an entry with | takes any of
			// its forms.
			i := 0
			for _, g := range got {
				if i < len(want) && slices.Contains(strings.Split(want[i], "|"), g) {
					i++
				}
			}
			if i < len(want) {
				t.Logf("%s's hook runs: %q, want in order %q", n.name, got, want)
				return false
			}
			return true
		})
	}
	stale, err := claim.NewClaim(A.sign, A.addr, 1, c.pair)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.postClaim(A, C, stale); !errors.Is(err, claim.ErrStale) {
		t.Errorf("stale claim: %v, want ErrStale", err)
	}
	fresh, err := claim.NewClaim(A.sign, A.addr, 3, c.pair)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.postClaim(B, C, fresh); !errors.Is(err, claim.ErrWrongSender) {
		t.Errorf("claim of a posted from b: %v, want ErrWrongSender", err)
	}
	if st, _ := c.status(C); st.Epoch != 2 || st.RoutedTo != "b" {
		t.Errorf("c after the refusals: %+v", st)
	}

	// Stopping tend on B drops the VIP.
	if !carriesAddr(B.h, testVIP) {
		t.Fatal("b does not carry the VIP")
	}
	before, _ := B.tend.Output()
	if err := B.tend.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = B.tend.Wait(ctx)
	// A clean stop logs no warning (the controller drops the VIP through
	// the helper, which still serves it).
	after, _ := B.tend.Output()
	if len(after) >= len(before) {
		for _, l := range strings.Split(string(after[len(before):]), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				t.Errorf("b's clean stop logged: %s", l)
			}
		}
	}
	if carriesAddr(B.h, testVIP) {
		t.Errorf("b still carries the VIP after tend stopped")
	}
	es := c.events()
	if len(es) == 0 || es[len(es)-1].Node != "b" || es[len(es)-1].Add {
		t.Errorf("last event %+v, want b's remove", es[len(es)-1:])
	}
	if err := checkTimeline(es); err != nil {
		t.Error(err)
	}
}

// checkListenerHasNoKey checks what n's listener was handed (its stdin,
// captured by the test binary, and its environment) for any private key of
// the node, in any encoding the mesh file uses.
func checkListenerHasNoKey(t *testing.T, n *node, inputs string) {
	t.Helper()
	in, err := os.ReadFile(filepath.Join(inputs, fmt.Sprintf("listen-%d.in", n.lisUID)))
	if err != nil {
		t.Fatalf("%s: the listener's input: %v", n.name, err)
	}
	if _, err := keelvip.ParseListenerConfig(bytes.NewReader(in)); err != nil {
		t.Errorf("%s: the listener's input is not its config: %v", n.name, err)
	}
	pids := pidsOfUID(n.lisUID)
	if len(pids) != 1 {
		t.Fatalf("%s: listener pids %v", n.name, pids)
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	for what, b := range map[string][]byte{"stdin": in, "environment": env} {
		for name, key := range map[string][]byte{"wireguard": n.wgKey[:], "signing": n.sign.Seed()} {
			for _, enc := range []string{base64.StdEncoding.EncodeToString(key), hex.EncodeToString(key), string(key)} {
				if bytes.Contains(b, []byte(enc)) {
					t.Errorf("%s: the listener's %s holds the %s private key", n.name, what, name)
				}
			}
		}
		if bytes.Contains(b, []byte("private")) {
			t.Errorf("%s: the listener's %s names a private key: %q", n.name, what, b)
		}
	}
}

// addHook rewrites n's mesh file with a hooks section running cmd.
func addHook(t *testing.T, n *node, cmd []string) {
	t.Helper()
	b, err := os.ReadFile(n.meshPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	doc["hooks"] = map[string]any{"command": cmd, "timeout_s": 5}
	if b, err = json.MarshalIndent(doc, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.meshPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if n.mesh, err = keelvip.LoadMesh(n.meshPath); err != nil {
		t.Fatal(err)
	}
}
