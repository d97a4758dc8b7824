package keelvip_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

// TestREADMEKeysAndMeshFile follows the README's "Keys and the mesh file"
// as written, with /etc/keel moved to a temporary directory: its keygen
// line, then its shell snippet that writes the mesh file from the key
// files, then its check line. The mesh file it makes is complete (no
// placeholder), has run_dir and state_dir, loads with mode 0600 and holds
// the keys keygen wrote.
func TestREADMEKeysAndMeshFile(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc-keel")
	local := func(s string) string { return strings.ReplaceAll(s, "/etc/keel", etc) }

	// The keygen line.
	var keygenLine string
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "sudo keel-vip keygen ") || strings.HasPrefix(l, "keel-vip keygen ") {
			keygenLine = strings.TrimPrefix(l, "sudo ")
			break
		}
	}
	if keygenLine == "" {
		t.Fatal("README.md has no `keel-vip keygen` line")
	}
	args := strings.Fields(local(keygenLine))[1:]
	var out, errb bytes.Buffer
	if code := keelvip.Main(context.Background(), args, &out, &errb); code != keelvip.ExitOK {
		t.Fatalf("%s: exit %d: %s", keygenLine, code, errb.String())
	}

	// The snippet that writes the mesh file, from `umask 077` to the
	// heredoc's end.
	i := strings.Index(readme, "umask 077\ncat > /etc/keel/mesh.json <<EOF\n")
	if i < 0 {
		t.Fatal("README.md has no snippet writing /etc/keel/mesh.json (umask 077, cat <<EOF)")
	}
	j := strings.Index(readme[i:], "\nEOF\n")
	if j < 0 {
		t.Fatal("the mesh file snippet has no EOF line")
	}
	snippet := readme[i : i+j+len("\nEOF\n")]
	if strings.Contains(snippet, "…") || strings.Contains(snippet, "...") {
		t.Fatalf("the README's mesh file has a placeholder:\n%s", snippet)
	}
	cmd := exec.Command(sh, "-e", "-c", local(snippet))
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's snippet: %v\n%s", err, o)
	}
	meshPath := filepath.Join(etc, "mesh.json")
	raw, err := os.ReadFile(meshPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("the README's mesh file is not JSON: %v\n%s", err, raw)
	}
	for _, k := range []string{"run_dir", "state_dir", "peers", "appliance", "etcd"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("the README's mesh file has no %q", k)
		}
	}
	m, err := keelvip.LoadMesh(meshPath)
	if err != nil {
		t.Fatalf("the README's mesh file does not load: %v\n%s", err, raw)
	}
	if !strings.Contains(out.String(), keyB64(m.Self.WGKey.PublicKey())) {
		t.Errorf("the mesh file's WireGuard key is not the one keygen wrote (keygen printed %s)", out.String())
	}

	// The check line.
	out.Reset()
	errb.Reset()
	if code := keelvip.Main(context.Background(), []string{"check", "--mesh", meshPath}, &out, &errb); code != keelvip.ExitOK || out.String() != "ok\n" {
		t.Fatalf("keel-vip check on the README's mesh file: exit %d, %q %q", code, out.String(), errb.String())
	}
	if !strings.Contains(readme, "keel-vip check --mesh /etc/keel/mesh.json") {
		t.Error("README.md does not check the mesh file it writes")
	}
	// Running tend without systemd, for a trial.
	if !strings.Contains(readme, "sudo keel-vip tend --mesh /etc/keel/mesh.json") {
		t.Error("README.md does not show tend run without systemd")
	}
}

func keyB64(k [32]byte) string { return b64(k[:]) }
