package tsng

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/wg"
)

// TestKeygenInitCheckDaemon follows a new user: keygen, init, config check,
// then a daemon starting from the file init wrote, with a peer whose
// identity is in the other (hex) encoding, accepted with a warning.
func TestKeygenInitCheckDaemon(t *testing.T) {
	dir := socketDir(t, "tsngkeys")
	f := &apiFixture{t: t, socket: filepath.Join(dir, "api.sock")}

	// keygen: four keys, each 32 bytes of base64, the public halves
	// matching the private ones.
	out := f.must("keygen")
	kv := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("keygen line %q", line)
		}
		kv[k] = strings.TrimSpace(v)
	}
	priv, err := wg.ParseKey(kv["wireguard_key"])
	if err != nil {
		t.Fatalf("keygen wireguard_key: %v\n%s", err, out)
	}
	if priv.PublicKey().String() != kv["wireguard_public_key"] {
		t.Fatalf("keygen: public key does not match the private key\n%s", out)
	}
	seed, err := base64.StdEncoding.DecodeString(kv["identity_key"])
	if err != nil || len(seed) != ed25519.SeedSize {
		t.Fatalf("keygen identity_key %q: %v", kv["identity_key"], err)
	}
	if base64.StdEncoding.EncodeToString(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)) != kv["identity"] {
		t.Fatalf("keygen: identity does not match identity_key\n%s", out)
	}
	if again := f.must("keygen"); again == out {
		t.Fatal("keygen printed the same keys twice")
	}

	// init writes a 0600 config with fresh keys, and never overwrites.
	cfgPath := filepath.Join(dir, "etc", "tsng.json")
	out = f.must("init", "--network", "home", "--overlay", "100.80.0.0/24", "--address", "100.80.0.1", "--name", "server1",
		"--config", cfgPath, "--data-dir", filepath.Join(dir, "data"), "--socket", f.socket, "--listen-port", "0")
	fi, err := os.Stat(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("init wrote mode %v, want 0600", fi.Mode().Perm())
	}
	if !strings.Contains(out, cfgPath) || !strings.Contains(out, `"identity"`) {
		t.Fatalf("init should name the file and print this node's peer entry:\n%s", out)
	}
	if code, _, errs := f.run(nil, "init", "--network", "home", "--overlay", "100.80.0.0/24", "--address", "100.80.0.1", "--config", cfgPath); code == 0 || !strings.Contains(errs, "exists") {
		t.Fatalf("init over an existing file: exit %d %q", code, errs)
	}
	cfg, err := LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	// The peer entry init printed is one another member pastes as is.
	var entry PeerConfig
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):strings.LastIndex(out, "}")+1]), &entry); err != nil {
		t.Fatalf("peer entry: %v\n%s", err, out)
	}
	self, _ := cfg.Networks[0].Self()
	if entry.Identity != base64.StdEncoding.EncodeToString(self.ID[:]) || entry.WireGuardKey != cfg.Networks[0].Node.WireGuardKey.PublicKey() || entry.Address != "100.80.0.1" {
		t.Fatalf("peer entry %+v does not match the config", entry)
	}

	// Add a peer whose identity is hex, the other encoding, then check.
	peerPub := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32)).Public().(ed25519.PublicKey)
	cfg.Networks[0].Peers = []PeerConfig{{Name: "server2", Address: "100.80.0.2", Identity: hexOf(peerPub), WireGuardKey: wg.GeneratePrivateKey().PublicKey()}}
	cfg.UI = "off"
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := f.run(nil, "config", "check", cfgPath)
	if code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("config check: exit %d %q %q", code, out, errs)
	}
	canon := base64.StdEncoding.EncodeToString(peerPub)
	if !strings.Contains(errs, "warning") || !strings.Contains(errs, "peers[0].identity") || !strings.Contains(errs, canon) {
		t.Fatalf("config check: no warning naming the canonical form %s: %q", canon, errs)
	}
	// A broken file: the error names the line and column, once prefixed.
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte("{\n  \"data_dir\": \"/x\",\n  \"networks\": [,]\n}\n"), 0o600)
	code, _, errs = f.run(nil, "config", "check", bad)
	if code != ExitInvalid || !strings.Contains(errs, "line 3, column 16") || strings.Count(errs, "tsng:") != 1 {
		t.Fatalf("config check of a broken file: exit %d %q", code, errs)
	}

	// The daemon starts from the file.
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"daemon", "--config", cfgPath}, &Env{Stdout: &logs, Stderr: &logs, Getenv: func(string) string { return "" },
			Daemon: func(ctx context.Context, p string) error { return RunDaemonLog(ctx, p, &logs) }})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, out, _ := f.run(nil, "network", "list")
		if code == 0 && strings.Contains(out, "home") && strings.Contains(out, "up") {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the daemon did not come up from the init file: %s\n%s", out, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("daemon exit %d:\n%s", code, logs.String())
	}
	if l := logs.String(); !strings.Contains(l, canon) || !strings.Contains(l, "peers[0].identity") {
		t.Fatalf("the daemon's log lacks the encoding warning:\n%s", l)
	}
}
