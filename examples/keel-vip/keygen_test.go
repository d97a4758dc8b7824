package keelvip_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/transport/wg"
)

// keygen runs `keel-vip keygen` with args and returns its exit code,
// stdout and stderr.
func keygen(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := keelvip.Main(context.Background(), append([]string{"keygen"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// readKey reads a key file keygen wrote: one line of base64, 32 bytes.
func readKey(t *testing.T, path string) (string, [32]byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 {
		t.Fatalf("%s: %q, want one line of base64", path, s)
	}
	s = strings.TrimSuffix(s, "\n")
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 32 {
		t.Fatalf("%s: %q is not 32 bytes of base64 (%v)", path, s, err)
	}
	return s, [32]byte(raw)
}

// TestKeygen: keygen writes the WireGuard key and the Ed25519 seed as the
// mesh file holds them, in files created with mode 0600 (whatever the
// umask lets through beyond that), prints the public keys and a peers
// stanza that match them, and no private key in any encoding.
func TestKeygen(t *testing.T) {
	old := syscall.Umask(0) // nothing masked: the mode is keygen's alone
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "keys")
	code, out, errs := keygen(t, "--dir", dir, "--id", "a", "--addr", "fd7a::1:1", "--endpoint", "192.0.2.1:51820")
	if code != keelvip.ExitOK {
		t.Fatalf("keygen: exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("key directory: %v, %v; want 0700", fi, err)
	}
	wgPath, signPath := filepath.Join(dir, "wg.key"), filepath.Join(dir, "sign.key")
	for _, p := range []string{wgPath, signPath} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o600 {
			t.Errorf("%s: mode %v, want -rw-------", p, fi.Mode())
		}
	}
	wgB64, wgRaw := readKey(t, wgPath)
	signB64, seed := readKey(t, signPath)
	wgPub := wg.Key(wgRaw).PublicKey()
	signPub := ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey)

	printed := out + errs
	for _, secret := range []string{wgB64, signB64, base64.RawStdEncoding.EncodeToString(wgRaw[:]), base64.RawStdEncoding.EncodeToString(seed[:]),
		base64.URLEncoding.EncodeToString(wgRaw[:]), base64.URLEncoding.EncodeToString(seed[:]),
		hex.EncodeToString(wgRaw[:]), hex.EncodeToString(seed[:]), string(wgRaw[:]), string(seed[:]),
		base64.StdEncoding.EncodeToString(ed25519.NewKeyFromSeed(seed[:]))} {
		if strings.Contains(printed, secret) || strings.Contains(strings.ToLower(printed), strings.ToLower(secret)) {
			t.Fatalf("keygen printed a private key:\n%s", printed)
		}
	}
	if !strings.Contains(out, "wg_public_key: "+base64.StdEncoding.EncodeToString(wgPub[:])) ||
		!strings.Contains(out, "sign_public_key: "+base64.StdEncoding.EncodeToString(signPub)) {
		t.Errorf("keygen does not print the public keys of the files it wrote:\n%s", out)
	}
	i := strings.Index(out, "{")
	if i < 0 {
		t.Fatalf("no stanza in\n%s", out)
	}
	var stanza map[string]any
	if err := json.Unmarshal([]byte(out[i:]), &stanza); err != nil {
		t.Fatalf("the stanza is not JSON: %v\n%s", err, out[i:])
	}
	want := map[string]any{"id": "a", "addr": "fd7a::1:1", "endpoint": "192.0.2.1:51820",
		"wg_public_key": base64.StdEncoding.EncodeToString(wgPub[:]), "sign_public_key": base64.StdEncoding.EncodeToString(signPub)}
	if len(stanza) != len(want) {
		t.Errorf("stanza %v, want %v", stanza, want)
	}
	for k, v := range want {
		if stanza[k] != v {
			t.Errorf("stanza %s = %v, want %v", k, stanza[k], v)
		}
	}

	// The files are what the mesh file holds: a node built from them, with
	// the stanza as a peer of another node, parses.
	peerSeed := bytes.Repeat([]byte{9}, 32)
	pk := wg.GeneratePrivateKey()
	doc := map[string]any{"mesh": "home", "overlay": "fd7a::/64",
		"node":  map[string]any{"id": "b", "addr": "fd7a::1:2", "wg_private_key": base64.StdEncoding.EncodeToString(pk[:]), "sign_private_key": base64.StdEncoding.EncodeToString(peerSeed)},
		"peers": []any{stanza}}
	if _, err := keelvip.ParseMesh(bytes.NewReader(encode(t, doc))); err != nil {
		t.Errorf("a mesh file with the stanza as a peer: %v", err)
	}
	doc = map[string]any{"mesh": "home", "overlay": "fd7a::/64",
		"node":  map[string]any{"id": "a", "addr": "fd7a::1:1", "wg_private_key": wgB64, "sign_private_key": signB64},
		"peers": []any{}}
	m, err := keelvip.ParseMesh(bytes.NewReader(encode(t, doc)))
	if err != nil {
		t.Fatalf("a mesh file with the key files' contents: %v", err)
	}
	if m.Self.WGKey.PublicKey() != wgPub || !bytes.Equal(m.Self.SignKey.Public().(ed25519.PublicKey), signPub) {
		t.Error("the mesh file's keys are not the files' keys")
	}

	// Two runs never make the same keys.
	dir2 := filepath.Join(t.TempDir(), "keys")
	if code, out2, errs := keygen(t, "--dir", dir2, "--id", "a", "--addr", "fd7a::1:1"); code != keelvip.ExitOK || out2 == out {
		t.Fatalf("second keygen: exit %d, %s%s", code, out2, errs)
	}
	if again, _ := readKey(t, filepath.Join(dir2, "wg.key")); again == wgB64 {
		t.Fatal("keygen wrote the same WireGuard key twice")
	}
}

// TestKeygenRefusesToOverwrite: a key file (or a symlink) already in place
// stops keygen before it writes anything; nothing existing changes, and
// no half pair is left behind.
func TestKeygenRefusesToOverwrite(t *testing.T) {
	for _, existing := range []string{"wg.key", "sign.key"} {
		for _, link := range []bool{false, true} {
			dir := t.TempDir()
			target := filepath.Join(t.TempDir(), "target")
			if err := os.WriteFile(target, []byte("keep me\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, existing)
			if link {
				if err := os.Symlink(target, p); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(p, []byte("keep me\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errs := keygen(t, "--dir", dir, "--id", "a", "--addr", "fd7a::1:1")
			if code != keelvip.ExitError || !strings.Contains(errs, existing) || !strings.Contains(errs, "exists") {
				t.Errorf("%s (symlink %v) present: exit %d, stdout %q, stderr %q; want exit 1 naming it", existing, link, code, out, errs)
			}
			for _, f := range []string{p, target} {
				if b, err := os.ReadFile(f); err != nil || string(b) != "keep me\n" {
					t.Errorf("%s changed: %q, %v", f, b, err)
				}
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 1 {
				t.Errorf("%s present: keygen left %d files (%v), want only it", existing, len(ents), ents)
			}
		}
	}
}

// TestKeygenUsage: --dir, --id and --addr are required and checked.
func TestKeygenUsage(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--id", "a", "--addr", "fd7a::1:1"},
		{"--dir", dir, "--addr", "fd7a::1:1"},
		{"--dir", dir, "--id", "a"},
		{"--dir", dir, "--id", "A B", "--addr", "fd7a::1:1"},
		{"--dir", dir, "--id", "a", "--addr", "192.0.2.1"},
		{"--dir", dir, "--id", "a", "--addr", "fd7a::1:1", "--endpoint", "nowhere"},
	} {
		if code, out, errs := keygen(t, args...); code != keelvip.ExitUsage || errs == "" {
			t.Errorf("%v: exit %d, %q %q; want %d", args, code, out, errs, keelvip.ExitUsage)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused keygen wrote %v", ents)
	}
}
