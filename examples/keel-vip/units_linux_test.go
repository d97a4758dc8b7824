//go:build linux

package keelvip_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
)

// cgroup2Root returns where the unified cgroup hierarchy is mounted.
func cgroup2Root(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 && f[3] == "/" {
			return f[4]
		}
	}
	testenv.Skip(t, "no cgroup2 hierarchy mounted at its root")
	return ""
}

// unitCgroups makes the cgroups systemd would give a node's two units,
// under a test-owned subtree, and removes them at cleanup (after the
// processes in them are gone). It returns the directories and the paths
// /proc/PID/cgroup shows for them.
func unitCgroups(t *testing.T, root, node string) (ctlDir, lisDir, ctlPath, lisPath string) {
	t.Helper()
	base := fmt.Sprintf("/vipkit-%d-%s", os.Getpid(), node)
	ctlPath, lisPath = base+keelvip.DefaultControllerCgroup, base+keelvip.DefaultListenerCgroup
	ctlDir, lisDir = filepath.Join(root, ctlPath), filepath.Join(root, lisPath)
	for _, d := range []string{ctlDir, lisDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		dirs := []string{ctlDir, lisDir, filepath.Dir(ctlDir), filepath.Join(root, base)}
		deadline := time.Now().Add(10 * time.Second)
		for _, d := range dirs {
			for {
				err := os.Remove(d)
				if err == nil || os.IsNotExist(err) || time.Now().After(deadline) {
					if err != nil && !os.IsNotExist(err) {
						t.Errorf("remove cgroup %s: %v", d, err)
					}
					break
				}
				time.Sleep(50 * time.Millisecond) // the killed processes leave the cgroup asynchronously
			}
		}
	})
	return ctlDir, lisDir, ctlPath, lisPath
}

// ownedDir makes dir with mode perm owned by uid, as systemd's
// RuntimeDirectory= and StateDirectory= do for a dynamic user.
func ownedDir(t *testing.T, dir string, perm os.FileMode, uid uint32) {
	t.Helper()
	if err := os.MkdirAll(dir, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
}

// credential writes a 0400 file owned by uid into the credentials
// directory dir, as LoadCredential= does.
func credential(t *testing.T, dir, name string, b []byte, uid uint32) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
}

// startUnits starts every node the way the shipped units run it: the
// helper with only CAP_NET_ADMIN and CAP_DAC_OVERRIDE in its bounding set
// (`tend --children units`), and the controller and the listener started
// "by systemd": in their units' cgroups, as their own users with no
// capability, with the directories systemd makes and the mesh file and
// pair record as credentials.
func (c *cluster) startUnits() {
	t := c.t
	t.Helper()
	root := cgroup2Root(t)
	for _, n := range c.nodes {
		ctlCg, lisCg, ctlPath, lisPath := unitCgroups(t, root, n.name)
		n.ctlCgroup, n.lisCgroup = ctlPath, lisPath
		run := n.mesh.RunDir
		ownedDir(t, run, 0o755, 0)
		ownedDir(t, filepath.Join(run, "ctl"), 0o700, n.ctlUID)
		ownedDir(t, filepath.Join(run, "members"), 0o700, n.lisUID)
		ownedDir(t, n.mesh.StateDir, 0o700, n.ctlUID)
		mesh, err := os.ReadFile(n.meshPath)
		if err != nil {
			t.Fatal(err)
		}
		ctlCreds, lisCreds := filepath.Join(n.dir, "creds-control"), filepath.Join(n.dir, "creds-members")
		ownedDir(t, ctlCreds, 0o500, n.ctlUID)
		ownedDir(t, lisCreds, 0o500, n.lisUID)
		credential(t, ctlCreds, "mesh", mesh, n.ctlUID)
		if n.member {
			pair, err := os.ReadFile(n.mesh.PairFile)
			if err != nil {
				t.Fatal(err)
			}
			credential(t, ctlCreds, "pair", pair, n.ctlUID)
		}
		n.tend = netns.StartChildT(t, n.h, "keel-tend-units", n.meshPath, c.exe, ctlPath, lisPath)
		n.ctl = netns.StartChildT(t, n.h, "keel-unit", ctlCg, strconv.Itoa(int(n.ctlUID)), ctlCreds, c.exe, "control")
		n.lis = netns.StartChildT(t, n.h, "keel-unit", lisCg, strconv.Itoa(int(n.lisUID)), lisCreds, c.exe, "listen")
	}
	for _, n := range c.nodes {
		waitFor(t, 60*time.Second, "helper of "+n.name, func() bool {
			_, err1 := os.Stat(keelvip.AdminSocket(n.mesh))
			_, err2 := os.Stat(filepath.Join(n.mesh.RunDir, "ctl", "control.sock"))
			_, err3 := os.Stat(filepath.Join(n.mesh.RunDir, "ctl", "helper.sock"))
			return err1 == nil && err2 == nil && err3 == nil && carriesAddr(n.h, n.addr)
		})
	}
}

// TestPrivilegeSplitUnits runs every node as the shipped systemd units
// have it, with plain processes standing in for systemd (no systemd as PID
// 1 here): the helper's bounding set is CAP_NET_ADMIN|CAP_DAC_OVERRIDE and
// nothing else (docs/security.md), and it starts no process; the
// controller and the listener are found by their units' cgroups. The
// kernel's view is checked from /proc, a process with the controller's
// uid outside its unit is refused on the helper's socket, and a promote
// over the members' channel moves the VIP, which C then reaches.
func TestPrivilegeSplitUnits(t *testing.T) {
	seed := testenv.Seed(t, 76)
	c := newCluster(t, seed, false, nil, "a", "b", "c")
	A, C := c.node("a"), c.node("c")
	c.startUnits()
	c.serveNames()

	const netAdmin, dacOverride = 12, 1
	wantHelperCaps := fmt.Sprintf("%016x", 1<<netAdmin|1<<dacOverride)
	for _, n := range c.nodes {
		st := procStatus(t, n.tend.Pid())
		for _, k := range []string{"CapBnd", "CapPrm", "CapEff"} {
			if st[k] != wantHelperCaps {
				t.Errorf("%s helper: %s %s, want %s (CAP_NET_ADMIN|CAP_DAC_OVERRIDE)", n.name, k, st[k], wantHelperCaps)
			}
		}
		if !strings.HasPrefix(st["Uid"], "0\t") {
			t.Errorf("%s helper: Uid %q, want root", n.name, st["Uid"])
		}
		for _, who := range []struct {
			p      *netns.Process
			uid    uint32
			cgroup string
			name   string
		}{{n.ctl, n.ctlUID, n.ctlCgroup, "controller"}, {n.lis, n.lisUID, n.lisCgroup, "listener"}} {
			st := procStatus(t, who.p.Pid())
			uid := strconv.Itoa(int(who.uid))
			if st["Uid"] != strings.Join([]string{uid, uid, uid, uid}, "\t") || st["NoNewPrivs"] != "1" {
				t.Errorf("%s %s: Uid %q NoNewPrivs %q", n.name, who.name, st["Uid"], st["NoNewPrivs"])
			}
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if st[k] != "0000000000000000" {
					t.Errorf("%s %s: %s %s, want 0", n.name, who.name, k, st[k])
				}
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", who.p.Pid()))
			if err != nil || !strings.Contains(string(b), "0::"+who.cgroup+"\n") {
				t.Errorf("%s %s: cgroup %q %v, want %s", n.name, who.name, b, err, who.cgroup)
			}
		}
	}

	// The listener's unit holds no key: no credential, nothing in its
	// environment, and the listen.json it reads is a ListenerConfig.
	for _, n := range c.nodes {
		ents, err := os.ReadDir(filepath.Join(n.dir, "creds-members"))
		if err != nil || len(ents) != 0 {
			t.Errorf("%s: the listener's credentials: %v %v, want none", n.name, ents, err)
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", n.lis.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := os.ReadFile(filepath.Join(n.mesh.RunDir, "listen.json"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := keelvip.ParseListenerConfig(bytes.NewReader(cfg)); err != nil {
			t.Errorf("%s: listen.json: %v", n.name, err)
		}
		for what, b := range map[string][]byte{"environment": env, "listen.json": cfg} {
			for _, key := range [][]byte{n.wgKey[:], n.sign.Seed()} {
				if bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString(key))) || bytes.Contains(b, key) {
					t.Errorf("%s: the listener's %s holds a private key", n.name, what)
				}
			}
		}
		checkMode(t, filepath.Join(n.mesh.RunDir, "listen.json"), 0o644, 0)
	}

	// The controller's uid alone is not enough: a process running as it
	// outside the unit's cgroup is refused by the helper.
	setpriv := testenv.NeedBinary(t, "setpriv")
	uid := strconv.Itoa(int(A.ctlUID))
	cmd := exec.Command(setpriv, "--reuid="+uid, "--regid="+uid, "--clear-groups", "--", c.exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), dialEnv+"="+filepath.Join(A.mesh.RunDir, "ctl", "helper.sock"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "refused:") {
		t.Errorf("a process with the controller's uid outside its unit: %v %q, want refused", err, out)
	}

	waitFor(t, 45*time.Second, "promote A", func() bool {
		out, err := c.promote(A, false)
		if err != nil {
			t.Logf("promote a: %v", err)
		}
		return err == nil && strings.Contains(out, "epoch 1")
	})
	waitFor(t, 45*time.Second, "C reaches the VIP at A", func() bool { n, err := reach(C, 2*time.Second); return err == nil && n == "a" })
	st, err := c.status(A)
	if err != nil || st.Role != "primary" || !st.Carried || st.Epoch != 1 {
		t.Errorf("a status %+v %v", st, err)
	}
}
