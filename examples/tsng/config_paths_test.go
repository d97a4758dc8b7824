package tsng

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// setJSON sets the value at path (object keys and array indices) in the
// generic JSON value v; a path ending in a missing key adds it.
func setJSON(t *testing.T, v any, path []any, val any) {
	t.Helper()
	for i, p := range path {
		last := i == len(path)-1
		switch k := p.(type) {
		case string:
			m := v.(map[string]any)
			if last {
				m[k] = val
				return
			}
			v = m[k]
		case int:
			a := v.([]any)
			if last {
				a[k] = val
				return
			}
			v = a[k]
		}
	}
}

// TestConfigErrorPaths: every config error names the field it is in,
// with the network's and peer's index and name, as a path: JSON decoding
// errors (unknown fields, wrong types, bad keys) as well as validation.
func TestConfigErrorPaths(t *testing.T) {
	p2, _ := testPeer(2)
	p3, _ := testPeer(3)
	base := oneNodeConfig(t.TempDir(), p2, p3)
	base.Networks[0].Limits.Listeners = 16
	lab := base.Networks[0]
	lab.Name, lab.Overlay, lab.Node.Address, lab.Peers = "lab", "100.81.0.0/24", "100.81.0.1", nil
	base.Networks = append(base.Networks, lab)
	good, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	privKey := base.Networks[0].Node.WireGuardKey.String()
	n0, n1 := "networks[0] (home)", "networks[1] (lab)"
	pe0, pe1 := n0+".peers[0] (server2)", n0+".peers[1] (server3)"
	cases := []struct {
		path []any
		val  any
		want string // the error's text from the path on
	}{
		// JSON decoding.
		{[]any{"data_dirs"}, "/x", `data_dirs: unknown field`},
		{[]any{"networks", 0, "node", "listen_prot"}, 1, n0 + `.node.listen_prot: unknown field (did you mean listen_port?)`},
		{[]any{"networks", 1, "dns_prot"}, 1, n1 + `.dns_prot: unknown field (did you mean dns_port?)`},
		{[]any{"networks", 0, "peers", 1, "endpont"}, "x", pe1 + `.endpont: unknown field (did you mean endpoint?)`},
		{[]any{"networks", 0, "limits"}, map[string]any{"Listenerz": 3}, n0 + `.limits.Listenerz: unknown field (did you mean Listeners?)`},
		{[]any{"networks", 0, "node", "wireguard_key"}, privKey[:43], n0 + `.node.wireguard_key: wg: bad key: base64 key has 43 characters, want 44`},
		{[]any{"networks", 0, "node", "wireguard_key"}, "!" + privKey[1:], n0 + `.node.wireguard_key: wg: bad key: `},
		{[]any{"networks", 0, "peers", 0, "wireguard_key"}, "abc", pe0 + `.wireguard_key: wg: bad key: base64 key has 3 characters, want 44`},
		{[]any{"networks", 0, "peers", 0, "wireguard_key"}, 7, pe0 + `.wireguard_key: `},
		{[]any{"networks", 0, "node", "listen_port"}, "51820", n0 + `.node.listen_port: want a number`},
		{[]any{"networks", 0, "node", "listen_port"}, 70000, n0 + `.node.listen_port: 70000 is out of range`},
		{[]any{"networks", 1, "dns"}, "yes", n1 + `.dns: want true or false`},
		{[]any{"networks", 0, "limits", "Listeners"}, "x", n0 + `.limits.Listeners: want a number`},
		{[]any{"networks", 1}, "lab", `networks[1]: want an object`},
		{[]any{"networks"}, map[string]any{}, `networks: want an array`},
		{[]any{"networks", 0, "peers"}, "server2", n0 + `.peers: want an array`},
		{[]any{"socket"}, 3, `socket: want a string`},
		// Validation.
		{[]any{"data_dir"}, "", `data_dir is required`},
		{[]any{"networks"}, []any{}, `networks: none`},
		{[]any{"metrics"}, "nowhere", `metrics "nowhere": want IP:port`},
		{[]any{"ui"}, "0.0.0.0:8470", `ui "0.0.0.0:8470": want a loopback IP:port`},
		{[]any{"log_level"}, "loud", `log_level "loud": want debug, info, warn or error`},
		{[]any{"networks", 1, "name"}, "Lab", `networks[1] (Lab).name: name "Lab": want lowercase`},
		{[]any{"networks", 1, "name"}, "home", `networks[1] (home).name: network "home" twice`},
		{[]any{"networks", 1, "overlay"}, "10.0.0.0/33", n1 + `.overlay "10.0.0.0/33": want an IPv4 range`},
		{[]any{"networks", 1, "mode"}, "kernel", n1 + `.mode "kernel": want netstack or tun`},
		{[]any{"networks", 1, "control_auth"}, "maybe", n1 + `.control_auth: `},
		{[]any{"networks", 1, "dns_upstreams"}, []any{"resolver"}, n1 + `.dns_upstreams: `},
		{[]any{"networks", 1, "socks5"}, "0.0.0.0:1080", n1 + `.socks5 "0.0.0.0:1080": want a loopback IP:port`},
		{[]any{"networks", 1, "id"}, "xyz", n1 + `.id: "xyz": want 32 hex digits`},
		{[]any{"networks", 0, "node", "name"}, "", n0 + `.node.name: empty name`},
		{[]any{"networks", 0, "node", "address"}, "100.80.0", n0 + `.node.address "100.80.0": want an IPv4 address`},
		{[]any{"networks", 0, "node", "address"}, "100.99.0.1", n0 + `.node.address 100.99.0.1 is outside 100.80.0.0/24`},
		{[]any{"networks", 0, "node", "identity_key"}, "short", n0 + `.node.identity_key: want a base64 Ed25519 seed of 32 bytes`},
		{[]any{"networks", 0, "node", "wireguard_key"}, "", n0 + `.node.wireguard_key: wg: bad key: base64 key has 0 characters, want 44`},
		{[]any{"networks", 0, "peers", 0, "name"}, "server3", pe1 + `.name: name "server3" twice`},
		{[]any{"networks", 0, "peers", 1, "name"}, "server3!", n0 + `.peers[1] (server3!).name: name "server3!": want lowercase`},
		{[]any{"networks", 0, "peers", 0, "address"}, "x", pe0 + `.address "x": want an IPv4 address`},
		{[]any{"networks", 0, "peers", 1, "address"}, "100.80.0.2", pe1 + `.address 100.80.0.2: taken or outside`},
		{[]any{"networks", 0, "peers", 0, "identity"}, "abc", pe0 + `.identity: "abc": want an Ed25519 public key`},
		{[]any{"networks", 0, "peers", 1, "endpoint"}, "host", pe1 + `.endpoint "host": want IP:port`},
	}
	dir := t.TempDir()
	for i, c := range cases {
		var v any
		if err := json.Unmarshal(good, &v); err != nil {
			t.Fatal(err)
		}
		setJSON(t, v, c.path, c.val)
		b, _ := json.MarshalIndent(v, "", "  ")
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(p)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), p+": "+c.want) {
			t.Errorf("case %d %v = %v:\n got %v\nwant %s", i, c.path, c.val, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), privKey[1:20]) {
			t.Errorf("case %d: the private key is in the error: %v", i, err)
		}
	}
	// The good file loads.
	p := filepath.Join(dir, "good.json")
	os.WriteFile(p, good, 0o600)
	if _, err := LoadConfig(p); err != nil {
		t.Fatal(err)
	}
}
