package testenv

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// OtherUID is the unprivileged uid (and gid) that tests run a local
// adversary as: a user of the same machine who is not root and not the
// agent. It is in no group and owns no file.
const OtherUID = 64170

// otherRoleEnv names the role a test binary plays when AsOtherUser started
// it.
const otherRoleEnv = "VIPKIT_OTHER_USER_ROLE"

// OtherUserRole returns the role this test binary was started for by
// AsOtherUser, or "" in the normal run. A test that AsOtherUser names
// checks it first and returns at once when it is "".
func OtherUserRole() string { return os.Getenv(otherRoleEnv) }

// AsOtherUser returns a command that runs this test binary again as
// OtherUID (setpriv, no supplementary groups, no capabilities), running
// only the test named test with OtherUserRole() == role and the extra
// environment env ("K=V"). The binary is copied to a directory the uid may
// read, removed when t ends. It skips (or, under RequireAll, fails) t
// unless the test runs as root with setpriv installed.
func AsOtherUser(t testing.TB, test, role string, env ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root to start a process as another uid")
	}
	setpriv := NeedBinary(t, "setpriv")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vipkit-other-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(exe))
	if err := copyFile(bin, exe); err != nil {
		t.Fatal(err)
	}
	uid := strconv.Itoa(OtherUID)
	cmd := exec.Command(setpriv, "--reuid="+uid, "--regid="+uid, "--clear-groups", "--inh-caps=-all", "--", bin, "-test.run=^"+test+"$", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), otherRoleEnv+"="+role, "HOME="+dir, "GOCOVERDIR="), env...)
	return cmd
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
