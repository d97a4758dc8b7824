//go:build linux

package keelvip

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

// racerEnv makes the test binary a racer: "DIR,DIR,...|TARGET|STOPFILE".
// Running as a child's uid, it swaps every name the helper writes in those
// directories for a symlink to TARGET, as fast as it can, until STOPFILE
// exists.
const racerEnv = "KEELVIP_TEST_RACER"

func init() {
	spec := os.Getenv(racerEnv)
	if spec == "" {
		return
	}
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		os.Exit(2)
	}
	dirs, target, stop := strings.Split(parts[0], ","), parts[1], parts[2]
	names := []string{"helper.sock", "members.sock", "pair.rec", "control.sock"}
	for i := 0; ; i++ {
		if i%64 == 0 {
			if _, err := os.Stat(stop); err == nil {
				os.Exit(0)
			}
		}
		for _, d := range dirs {
			ents, _ := os.ReadDir(d)
			for _, e := range ents { // the helper's temporary names too
				if strings.HasPrefix(e.Name(), ".") {
					names = append(names[:4], e.Name())
				}
			}
			for _, n := range names {
				p := filepath.Join(d, n)
				_ = os.Remove(p)
				_ = os.Symlink(target, p)
			}
		}
	}
}

// TestSymlinkRace: racers running as the children's uids swap every name
// the helper creates in their directories for a symlink to a root-only
// file, while the helper sets up its children's directories, sockets and
// pair copy, 1,000 times. The file's owner, mode and contents never change,
// and the helper's own directories stay root's.
func TestSymlinkRace(t *testing.T) {
	testenv.NeedRoot(t)
	setpriv := testenv.NeedBinary(t, "setpriv")
	h, _, _, _ := testHelper(t)
	base, err := os.MkdirTemp("", "keelvip-race-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	const ctlUID, lisUID = 64150, 64151
	m := *h.m
	m.RunDir, m.StateDir = filepath.Join(base, "run"), filepath.Join(base, "state")
	m.ControllerUID, m.ControllerGID, m.ListenerUID, m.ListenerGID = ctlUID, ctlUID, lisUID, lisUID
	h.m = &m
	target := filepath.Join(base, "secret")
	secret := []byte("root's only\n")
	if err := os.WriteFile(target, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := prepareRunDir(&m); err != nil {
		t.Fatal(err)
	}
	if err := raceSetup(h); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The racers run the test binary, which the children's users must be
	// able to read.
	bin := filepath.Join(base, "race.test")
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	stop := filepath.Join(base, "stop")
	var racers []*exec.Cmd
	for uid, dirs := range map[int][]string{ctlUID: {ctlDir(&m), m.StateDir}, lisUID: {membersDir(&m)}} {
		u := strconv.Itoa(uid)
		cmd := exec.Command(setpriv, "--reuid="+u, "--regid="+u, "--clear-groups", "--", bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), racerEnv+"="+strings.Join(dirs, ",")+"|"+target+"|"+stop)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		racers = append(racers, cmd)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(stop, nil, 0o644)
		for _, r := range racers {
			done := make(chan struct{})
			go func() { _ = r.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = r.Process.Kill()
				<-done
			}
		}
	})
	time.Sleep(50 * time.Millisecond) // the racers running (they only make the race harder)
	const rounds = 1000
	failed := 0
	for i := 0; i < rounds; i++ {
		if err := raceSetup(h); err != nil {
			failed++ // a refusal is fine: the racer broke a name it owns
		}
		fi, err := os.Lstat(target)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		got, _ := os.ReadFile(target)
		if st.Uid != 0 || st.Gid != 0 || fi.Mode().Perm() != 0o600 || !bytes.Equal(got, secret) {
			t.Fatalf("round %d: the root-only file is now mode %v owner %d:%d, contents %q", i, fi.Mode(), st.Uid, st.Gid, got)
		}
		for _, d := range []string{base, m.RunDir, stageDir(&m)} {
			if err := checkRootDir(d, 0o755); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	}
	t.Logf("%d rounds, %d refused by a broken name", rounds, failed)
	if failed == rounds {
		t.Error(fmt.Errorf("every round failed: the setup never ran to the end"))
	}
}

// TestRunDirChecked: a run_dir the children cannot enter (0700), or that
// others may write, is refused at start with the mode needed.
func TestRunDirChecked(t *testing.T) {
	testenv.NeedRoot(t)
	for _, mode := range []os.FileMode{0o700, 0o777, 0o775} {
		dir := filepath.Join(t.TempDir(), "run")
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		err := prepareRunDir(&Mesh{RunDir: dir})
		if !errors.Is(err, ErrRunDir) || !strings.Contains(err.Error(), "0755") {
			t.Errorf("run_dir %v: %v, want ErrRunDir naming 0755", mode, err)
		}
	}
	dir := filepath.Join(t.TempDir(), "run")
	if err := prepareRunDir(&Mesh{RunDir: dir}); err != nil {
		t.Fatalf("a new run_dir: %v", err)
	}
	if err := checkRootDir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
