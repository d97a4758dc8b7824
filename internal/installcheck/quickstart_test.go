package installcheck

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

// quickStart returns the shell lines of the README's quick start: every
// ```sh block between the <!-- quickstart --> markers, in order.
func quickStart(readme string) (string, error) {
	_, rest, ok := strings.Cut(readme, "<!-- quickstart -->")
	if !ok {
		return "", os.ErrNotExist
	}
	section, _, ok := strings.Cut(rest, "<!-- /quickstart -->")
	if !ok {
		return "", os.ErrNotExist
	}
	var b strings.Builder
	for {
		_, after, ok := strings.Cut(section, "```sh\n")
		if !ok {
			break
		}
		block, tail, ok := strings.Cut(after, "```")
		if !ok {
			return "", os.ErrInvalid
		}
		b.WriteString(block)
		section = tail
	}
	return b.String(), nil
}

// TestREADMEQuickStart runs the README's quick start as written, from a
// fresh clone's point of view: make install into a DESTDIR, tsng init for
// two nodes, peer add, config check, two agents in network namespaces
// (tun and netstack), a VIP in front of a web server, curl through the
// client's HTTP proxy, and the clean-up. The page must come back.
func TestREADMEQuickStart(t *testing.T) {
	skipLockOrder(t)
	testenv.NeedRoot(t)
	for _, b := range []string{"make", "ip", "curl", "python3", "go"} {
		testenv.NeedBinary(t, b)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := quickStart(string(readme))
	if err != nil || !strings.Contains(script, "curl") {
		t.Fatalf("README.md: no quick start between the markers (%v)", err)
	}
	for _, ns := range []string{"vkqs-a", "vkqs-b"} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			t.Fatalf("namespace %s exists already: another run, or a leftover (ip netns del %s)", ns, ns)
		}
	}
	path := filepath.Join(t.TempDir(), "quickstart.sh")
	if err := os.WriteFile(path, []byte("set -euo pipefail\n"+script), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", path)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t.Cleanup(func() {
		// A failed run leaves its agents and namespaces: end them.
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		for _, ns := range []string{"vkqs-a", "vkqs-b"} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	t0 := time.Now()
	err = cmd.Run()
	t.Logf("quick start ran in %v", time.Since(t0).Round(100*time.Millisecond))
	if err != nil {
		t.Fatalf("the README's quick start failed: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "hello from server1") {
		t.Fatalf("the quick start's curl did not print the page:\n%s", out.String())
	}
	for _, ns := range []string{"vkqs-a", "vkqs-b"} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			t.Errorf("the quick start's clean-up left namespace %s", ns)
		}
	}
}
