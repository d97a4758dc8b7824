package tsng

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vipkit/vipkit/transport/wg"
)

// TestLoadConfigStrict: a config file holds exactly one JSON object with
// known fields; anything else is ErrConfig, and a good file still loads.
func TestLoadConfigStrict(t *testing.T) {
	seed := base64.StdEncoding.EncodeToString(make([]byte, 32))
	good, err := json.Marshal(&Config{DataDir: t.TempDir(), UI: "off",
		Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24",
			Node: NodeConfig{Name: "n1", Address: "100.80.0.1", IdentityKey: seed, WireGuardKey: wg.GeneratePrivateKey()}}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		body string
		ok   bool
	}{
		{"good", string(good) + "\n", true},
		{"unknown field", `{"data_dirs":"/x"}`, false},
		{"second object", string(good) + "{}", false},
		{"stray brace", string(good) + "}", false},
		{"empty", "", false},
	} {
		p := filepath.Join(dir, c.name+".json")
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p)
		if c.ok && err != nil || !c.ok && !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ok=%v (else ErrConfig)", c.name, err, c.ok)
		}
	}
}
