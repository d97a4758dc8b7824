package keelvip_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/internal/testenv"
)

// unitDirectives reads a unit file's Key=Value lines (the last wins, as in
// systemd, except for repeated list settings, which are joined).
func unitDirectives(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l[0] == '#' || l[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("%s: bad line %q", path, l)
		}
		if (k == "SystemCallFilter" || k == "LoadCredential") && out[k] != "" {
			v = out[k] + " | " + v
		}
		out[k] = v
	}
	return out
}

// TestUnitHardening checks the hardening of every shipped unit
// (docs/security.md).
func TestUnitHardening(t *testing.T) {
	common := map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
		"RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
		"MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native", "StartLimitIntervalSec": "0",
		"AmbientCapabilities": "",
	}
	for unit, want := range map[string]map[string]string{
		"keel-vip.service": {
			// The helper holds CAP_NET_ADMIN and
			// CAP_DAC_OVERRIDE, nothing else (systemd starts the units).
			"CapabilityBoundingSet": "CAP_NET_ADMIN CAP_DAC_OVERRIDE",
			"ExecStart":             "/usr/bin/keel-vip tend --children units --mesh /etc/keel/mesh.json",
			"ExecStopPost":          "/usr/bin/keel-vip drop-all --mesh /etc/keel/mesh.json",
			"Wants":                 "network-online.target keel-vip-control.service keel-vip-members.service",
			"RuntimeDirectory":      "keel-vip", "RuntimeDirectoryPreserve": "yes",
			"DeviceAllow": "/dev/net/tun rw", "DevicePolicy": "closed",
		},
		"keel-vip-control.service": {
			"CapabilityBoundingSet": "", "DynamicUser": "yes", "PrivateDevices": "yes", "BindsTo": "keel-vip.service",
			"RuntimeDirectory": "keel-vip/ctl", "RuntimeDirectoryMode": "0700", "StateDirectory": "keel/vip",
			"Environment": "KEELVIP_EXEC=control", "LoadCredential": "mesh:/etc/keel/mesh.json | pair:/etc/keel/pair.rec",
		},
		"keel-vip-members.service": {
			"CapabilityBoundingSet": "", "DynamicUser": "yes", "PrivateDevices": "yes", "BindsTo": "keel-vip.service",
			"RuntimeDirectory": "keel-vip/members", "RuntimeDirectoryMode": "0700",
			"Environment": "KEELVIP_EXEC=listen KEELVIP_LISTEN_CONFIG=/run/keel-vip/listen.json",
		},
	} {
		got := unitDirectives(t, filepath.Join("systemd", unit))
		if unit == "keel-vip-members.service" {
			// The network-facing listener gets no key, as no credential.
			if v, ok := got["LoadCredential"]; ok {
				t.Errorf("%s: LoadCredential=%s, want none", unit, v)
			}
		}
		for k, v := range common {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s: %s=%q, want %q", unit, k, g, v)
			}
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s: %s=%q, want %q", unit, k, g, v)
			}
		}
	}
}

// TestUnitsVerify runs systemd-analyze verify on the units, with the
// binary path pointed at an executable that exists.
func TestUnitsVerify(t *testing.T) {
	sa := testenv.NeedBinary(t, "systemd-analyze")
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, u := range []string{"keel-vip.service", "keel-vip-control.service", "keel-vip-members.service"} {
		b, err := os.ReadFile(filepath.Join("systemd", u))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, u)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/bin/keel-vip", exe)), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	cmd := exec.Command(sa, append([]string{"verify"}, args...)...)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=notice")
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
