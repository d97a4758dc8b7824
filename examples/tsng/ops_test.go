package tsng

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

// TestVersion builds cmd/tsng with VCS stamping and checks that --version
// prints the revision git reports. The go command stamps only in a
// repository whose .git is a directory, not in a git worktree, so the
// test builds from a shared clone of this checkout's HEAD.
func TestVersion(t *testing.T) {
	gobin := testenv.NeedBinary(t, "go")
	git := testenv.NeedBinary(t, "git")
	top, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		testenv.Skip(t, "not a git checkout: %v", err)
	}
	src := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command(git, "clone", "--quiet", "--shared", strings.TrimSpace(string(top)), src).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	rev, err := exec.Command(git, "-C", src, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "tsng")
	build := exec.Command(gobin, "build", "-buildvcs=true", "-o", bin, "./cmd/tsng")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, arg := range []string{"--version", "version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("tsng %s: %v\n%s", arg, err, out)
		}
		if want := "revision " + string(rev[:12]); !strings.HasPrefix(string(out), "tsng ") || !strings.Contains(string(out), want) {
			t.Errorf("tsng %s: %q, want %q", arg, out, want)
		}
	}
}

// TestDataDirLock: a second agent on the same data_dir says who holds it.
func TestDataDirLock(t *testing.T) {
	d, _ := uiDaemon(t)
	cfg := *d.cfg
	cfg.Socket = filepath.Join(t.TempDir(), "other.sock")
	cfg.UI = "off"
	_, err := NewDaemon(context.Background(), &cfg, DaemonOptions{})
	want := fmt.Sprintf("another tsng is running (pid %d)", os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second agent on %s: %v, want %q", cfg.DataDir, err, want)
	}
	if strings.Contains(err.Error(), "tsng: tsng:") {
		t.Errorf("repeated prefix: %v", err)
	}
}

// TestStartupLog: the start-up log names the UI and metrics addresses
// and each network's public keys.
func TestStartupLog(t *testing.T) {
	dir := t.TempDir()
	k, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "tsng.json")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`{"data_dir": %q, "socket": %q, "metrics": "127.0.0.1:0",
 "networks": [{"name": "home", "overlay": "100.80.0.0/24", "dns_port": 5353,
  "node": {"name": "n1", "address": "100.80.0.1", "identity_key": %q, "wireguard_key": %q}}]}`,
		filepath.Join(dir, "data"), filepath.Join(dir, "api.sock"), k.IdentityKey, k.WireGuardKey)), 0o600)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunDaemonLog(ctx, cfgPath, &logs) }()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "tsng running") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l := logs.String()
	for _, want := range []string{`"ui":"127.0.0.1:`, `"metrics":"127.0.0.1:`, `"identity":"` + k.Identity + `"`, `"wireguard_public_key":"` + k.WireGuardPublicKey.String() + `"`, `"version":`} {
		if !strings.Contains(l, want) {
			t.Errorf("start-up log lacks %s:\n%s", want, l)
		}
	}
	if strings.Contains(l, "token=") {
		t.Errorf("the log carries the editor's token:\n%s", l)
	}
}

// TestSystemdUnits verifies tsng's unit and its tun-mode drop-in with
// systemd-analyze, and checks the hardening that matters: no capability
// in netstack mode, CAP_NET_ADMIN only with the drop-in.
func TestSystemdUnits(t *testing.T) {
	sa := testenv.NeedBinary(t, "systemd-analyze")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(b), "/usr/bin/tsng", exe)
	}
	unit := read("systemd/tsng.service")
	dropin := read("systemd/tsng.service.d/tun.conf")
	reloadDropin := read("systemd/tsng.service.d/reload-credentials.conf")
	if !strings.Contains(reloadDropin, "\nRefreshOnReload=credentials\n") {
		t.Errorf("reload-credentials.conf lacks RefreshOnReload=credentials")
	}
	for _, want := range []string{"CapabilityBoundingSet=\n", "AmbientCapabilities=\n", "NoNewPrivileges=yes", "DynamicUser=yes", "ProtectSystem=strict", "PrivateDevices=yes", "SystemCallFilter=@system-service", "LoadCredential=tsng.json:/etc/tsng/tsng.json",
		"ExecReload=" + exe + " reload\n"} {
		if !strings.Contains(unit, want) {
			t.Errorf("tsng.service lacks %q", strings.TrimSpace(want))
		}
	}
	for _, want := range []string{"CapabilityBoundingSet=CAP_NET_ADMIN", "AmbientCapabilities=CAP_NET_ADMIN", "DeviceAllow=/dev/net/tun rw"} {
		if !strings.Contains(dropin, want) {
			t.Errorf("tun.conf lacks %q", want)
		}
	}
	for _, line := range strings.Split(unit, "\n") {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, "CAP_") {
			t.Errorf("the netstack unit grants a capability: %s", line)
		}
	}
	// systemd-analyze verify on the unit, then on the unit with the
	// drop-in, then (on systemd 260 and later, which knows its setting)
	// with the reload drop-in.
	dropins := []map[string]string{nil, {"tun.conf": dropin}}
	if v := systemdVersion(t, sa); v >= 260 {
		dropins = append(dropins, map[string]string{"reload-credentials.conf": reloadDropin})
	} else {
		t.Logf("systemd %d: reload-credentials.conf (RefreshOnReload=, systemd 260) not verified", v)
	}
	for i, ds := range dropins {
		withDropin := fmt.Sprint(slices.Collect(maps.Keys(ds)))
		root := filepath.Join(dir, fmt.Sprint(i))
		os.MkdirAll(filepath.Join(root, "tsng.service.d"), 0o755)
		os.WriteFile(filepath.Join(root, "tsng.service"), []byte(unit), 0o644)
		for name, text := range ds {
			os.WriteFile(filepath.Join(root, "tsng.service.d", name), []byte(text), 0o644)
		}
		cmd := exec.Command(sa, "verify", filepath.Join(root, "tsng.service"))
		cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=notice", "SYSTEMD_UNIT_PATH="+root+":")
		out, err := cmd.CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Fatalf("systemd-analyze verify (drop-ins %v): %v\n%s", withDropin, err, out)
		}
	}
}

// systemdVersion returns the version systemd-analyze reports ("systemd
// 252 (...)").
func systemdVersion(t *testing.T, sa string) int {
	out, err := exec.Command(sa, "--version").Output()
	if err != nil {
		t.Fatalf("systemd-analyze --version: %v", err)
	}
	var v int
	if _, err := fmt.Sscanf(string(out), "systemd %d", &v); err != nil {
		t.Fatalf("systemd-analyze --version: %q: %v", out, err)
	}
	return v
}
