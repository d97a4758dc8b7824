package installcheck

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/internal/testenv"
)

var (
	binaries = []string{"tsng", "keel-vip", "sharehosts"}
	units    = []string{"tsng.service", "keel-vip.service", "keel-vip-control.service", "keel-vip-members.service"}
)

// runMake runs make in the repository's root with args and returns its
// output and error.
func runMake(makeBin string, args ...string) (string, error) {
	cmd := exec.Command(makeBin, append([]string{"-C", "../.."}, args...)...)
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// makeInstall runs `make install` with the extra variables vars, the
// build in a directory of the test's, and returns the staging directory
// (DESTDIR).
func makeInstall(t *testing.T, makeBin string, vars ...string) string {
	t.Helper()
	dest := t.TempDir()
	args := append([]string{"install", "DESTDIR=" + dest}, vars...)
	if !slices.ContainsFunc(vars, func(v string) bool { return strings.HasPrefix(v, "BUILDDIR=") }) {
		args = append(args, "BUILDDIR="+t.TempDir())
	}
	if out, err := runMake(makeBin, args...); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return dest
}

// skipLockOrder skips in the lock-order build: nothing here takes a
// lock, and the same test runs in make test.
func skipLockOrder(t *testing.T) {
	if syncx.LockOrderChecked {
		t.Skip("not in the lock-order build")
	}
}

// hostUnits copies the host's own systemd units (sysinit.target and the
// rest that every service depends on) into root, which verify --root
// needs; it skips when the host has none.
func hostUnits(t *testing.T, root string) {
	t.Helper()
	var src string
	for _, d := range []string{"/usr/lib/systemd/system", "/lib/systemd/system"} {
		if _, err := os.Stat(filepath.Join(d, "sysinit.target")); err == nil {
			src = d
			break
		}
	}
	if src == "" {
		testenv.Skip(t, "no systemd units on this host (sysinit.target) for verify --root")
	}
	dst := filepath.Join(root, "usr/lib/systemd/system")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, to)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// verify runs systemd-analyze verify --root=root on the named units and
// returns its output and error; a clean verify prints nothing.
func verify(sa, root string, names ...string) (string, error) {
	cmd := exec.Command(sa, append([]string{"verify", "--root=" + root}, names...)...)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=notice")
	out, err := cmd.CombinedOutput()
	if err == nil && len(strings.TrimSpace(string(out))) > 0 {
		err = fmt.Errorf("verify printed warnings")
	}
	return string(out), err
}

// TestMakeInstall: `make install DESTDIR=…` with the default PREFIX
// (/usr/local) installs the three binaries, executable, each answering
// --help and --version with exit 0, and the four units in
// /usr/local/lib/systemd/system with every Exec line pointing at
// /usr/local/bin. systemd-analyze verify --root finds the units by name
// there and passes them clean, with tsng's tun drop-in installed as its
// comment says, too; without an installed binary it fails, so the check
// is of the installed paths. tsng's optional drop-ins are installed
// beside the docs, not where systemd would apply them.
func TestMakeInstall(t *testing.T) {
	skipLockOrder(t)
	makeBin := testenv.NeedBinary(t, "make")
	sa := testenv.NeedBinary(t, "systemd-analyze")
	testenv.NeedBinary(t, "go")
	root := makeInstall(t, makeBin)
	bindir := filepath.Join(root, "usr/local/bin")
	for _, b := range binaries {
		p := filepath.Join(bindir, b)
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("installed %s: %v, %v; want mode 0755", b, fi, err)
		}
		for _, arg := range []string{"--help", "--version"} {
			out, err := exec.Command(p, arg).Output()
			if err != nil || len(out) == 0 {
				t.Errorf("%s %s: %v, %q; want exit 0 and output", b, arg, err, out)
			}
		}
	}
	unitdir := filepath.Join(root, "usr/local/lib/systemd/system")
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(unitdir, u))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "Exec") {
				n++
				if _, v, _ := strings.Cut(line, "="); !strings.HasPrefix(v, "/usr/local/bin/") {
					t.Errorf("%s: %q does not run the installed binary", u, line)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no Exec line", u)
		}
	}
	if _, err := os.Stat(filepath.Join(unitdir, "tsng.service.d")); err == nil {
		t.Error("make install put tsng.service.d beside the unit, where systemd applies its drop-ins without asking")
	}
	tun := filepath.Join(root, "usr/local/share/vipkit/systemd/tsng.service.d/tun.conf")
	if _, err := os.Stat(tun); err != nil {
		t.Errorf("tun drop-in not installed: %v", err)
	}

	hostUnits(t, root)
	if out, err := verify(sa, root, units...); err != nil {
		t.Fatalf("systemd-analyze verify --root (the installed units): %v\n%s", err, out)
	}
	// tsng in tun mode, with the drop-in where its comment says.
	d := filepath.Join(root, "etc/systemd/system/tsng.service.d")
	b, err := os.ReadFile(tun)
	if err == nil {
		err = os.MkdirAll(d, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(d, "tun.conf"), b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, err := verify(sa, root, "tsng.service"); err != nil {
		t.Fatalf("systemd-analyze verify --root (tsng.service with tun.conf): %v\n%s", err, out)
	}
	// The check is of the installed binary: without it, verify fails.
	if err := os.Remove(filepath.Join(bindir, "keel-vip")); err != nil {
		t.Fatal(err)
	}
	if out, err := verify(sa, root, "keel-vip.service"); err == nil || !strings.Contains(out, "/usr/local/bin/keel-vip") {
		t.Fatalf("verify without the installed keel-vip: %v, %q; want it to name the missing binary", err, out)
	}
}

// TestMakeInstallPrefix: `make build`, then `make install NOBUILD=1
// PREFIX=/usr` (as a root without Go would) installs what the build made
// to /usr/bin and /usr/lib/systemd/system, and the units are the tree's,
// unchanged (they name /usr/bin). NOBUILD=1 with nothing built fails,
// naming the missing binary.
func TestMakeInstallPrefix(t *testing.T) {
	skipLockOrder(t)
	makeBin := testenv.NeedBinary(t, "make")
	testenv.NeedBinary(t, "go")
	empty := t.TempDir()
	if out, err := runMake(makeBin, "install", "NOBUILD=1", "BUILDDIR="+empty, "DESTDIR="+t.TempDir()); err == nil || !strings.Contains(out, empty+"/tsng is missing (run make build first)") {
		t.Errorf("make install NOBUILD=1 with nothing built: %v\n%s", err, out)
	}
	build := t.TempDir()
	if out, err := runMake(makeBin, "build", "BUILDDIR="+build); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	root := makeInstall(t, makeBin, "NOBUILD=1", "BUILDDIR="+build, "PREFIX=/usr")
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(root, "usr/bin", b)); err != nil {
			t.Errorf("PREFIX=/usr: %v", err)
		}
	}
	src := map[string]string{"tsng.service": "../../examples/tsng/systemd/tsng.service"}
	for _, u := range units[1:] {
		src[u] = "../../examples/keel-vip/systemd/" + u
	}
	for u, p := range src {
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", u))
		if err != nil || string(got) != string(want) {
			t.Errorf("PREFIX=/usr: %s differs from the tree's (%v)", u, err)
		}
	}
}
