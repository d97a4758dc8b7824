package tsng

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

// TestCLIDepartedNode runs the CLI against a real agent whose config loses
// a member (server2) between two runs: the backends stored on server2 stay
// addressable by name (this agent knew it) and by full id, removing them
// works, unrelated edits of the service succeed, a departed node cannot be
// added as a new backend, and status names server2's backends departed.
func TestCLIDepartedNode(t *testing.T) {
	p2, id2 := testPeer(2)
	p3, _ := testPeer(3)
	cfg := oneNodeConfig(socketDir(t, "tsngdep"), p2, p3)
	d := startDaemon(t, cfg)
	f := &apiFixture{t: t, socket: cfg.Socket}
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server2:7443")
	f.must("vip", "port", "add", "home", "api", "udp/53", "--backend", "server2:5353", "--backend", "server3:5353")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// server2 leaves the member list.
	cfg.Networks[0].Peers = []PeerConfig{p3}
	d = startDaemon(t, cfg)
	defer d.Close()

	// Status names the backends departed, by the name this agent knew.
	out := f.must("vip", "status", "home", "api")
	if !strings.Contains(out, "departed") || !strings.Contains(out, "server2") {
		t.Fatalf("status does not show server2's backends as departed:\n%s", out)
	}
	var sample struct {
		Status struct {
			Listeners []struct {
				Listener string `json:"listener"`
				Backends []struct {
					NodeName string `json:"node_name"`
					Port     int    `json:"port"`
					Reason   string `json:"reason"`
					Departed bool   `json:"departed"`
				} `json:"backends"`
			} `json:"listeners"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(f.must("vip", "status", "home", "api", "--json")), &sample); err != nil {
		t.Fatal(err)
	}
	st := sample.Status
	departed := 0
	for _, l := range st.Listeners {
		for _, b := range l.Backends {
			if b.Departed != (b.Port == 7443 || (l.Listener == "udp/53" && b.NodeName == "server2")) {
				t.Fatalf("%s backend %s:%d departed=%v (reason %s)", l.Listener, b.NodeName, b.Port, b.Departed, b.Reason)
			}
			if b.Departed {
				departed++
				if b.Reason != "departed" || b.NodeName != "server2" {
					t.Fatalf("departed backend %+v", b)
				}
			}
		}
	}
	if departed != 2 {
		t.Fatalf("%d departed backends in status --json, want 2", departed)
	}

	// Unrelated changes to the service succeed.
	f.must("vip", "backend", "add", "home", "api", "tcp/443", "server3:8443")
	f.must("vip", "port", "set", "home", "api", "tcp/443", "--check-interval-ms", "1000", "--check-timeout-ms", "500")
	// A departed node is no new backend.
	code, _, errs := f.run(nil, "vip", "backend", "add", "home", "api", "tcp/443", "server2:9000")
	if code == 0 || !strings.Contains(errs, "not a member") {
		t.Fatalf("adding a backend on a departed node: exit %d %q", code, errs)
	}

	// Removal by name and by full id.
	f.must("vip", "backend", "remove", "home", "api", "tcp/443", "server2:7443")
	f.must("vip", "backend", "remove", "home", "api", "udp/53", id2+":5353")
	show := f.must("vip", "show", "home", "api", "--json")
	if strings.Contains(show, id2) {
		t.Fatalf("server2 still a backend after removal:\n%s", show)
	}
	if !strings.Contains(show, "8443") {
		t.Fatalf("the unrelated backend is missing:\n%s", show)
	}
}

// TestEditKeepsDepartedNodeID: `vip edit` resolves node selectors against
// the member list, and a full id of a node that is no member (a departed
// backend's) passes through unchanged, so the rest of the file can be
// saved.
func TestEditKeepsDepartedNodeID(t *testing.T) {
	gone := strings.Repeat("ab", 32)
	nodes := []NodeDoc{{Name: "server1"}}
	if id, err := resolveNode(nodes, gone); err != nil || id != gone {
		t.Fatalf("resolveNode(departed full id) = %q, %v", id, err)
	}
	if _, err := resolveNode(nodes, "abab"); err == nil {
		t.Fatal("a prefix of no member's id resolved")
	}
}

// TestKnownNodesFile: a damaged known-nodes file stops the network from
// opening with an error naming it, and is left as it was (never reset);
// a departed node that no backend names any more is dropped from it.
func TestKnownNodesFile(t *testing.T) {
	dir := t.TempDir()
	path := knownNodesPath(dir, "home")
	for _, bad := range []string{"{not json", `{"version":2,"nodes":[]}`, `{"version":1,"nodes":[{"id":"` + strings.Repeat("ab", 32) + `","name":"Bad\u001b"}]}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadKnownNodes(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("damaged file %q: %v, want an error naming %s", bad, err, path)
		}
		if b, _ := os.ReadFile(path); string(b) != bad {
			t.Fatalf("the damaged file was rewritten: %q", b)
		}
	}
	if got, err := loadKnownNodes(knownNodesPath(dir, "none")); err != nil || got != nil {
		t.Fatalf("missing file: %v, %v", got, err)
	}
	s1, s2, s3 := vip.NodeInfo{ID: vip.NodeID{1}, Name: "server1"}, vip.NodeInfo{ID: vip.NodeID{2}, Name: "server2"}, vip.NodeInfo{ID: vip.NodeID{3}, Name: "server3"}
	svc := vip.ServiceView{Service: vip.Service{Listeners: []vip.Listener{{Backends: []vip.Backend{{Node: s2.ID, Port: 80}}}}}}
	former := formerNodes([]vip.NodeInfo{s1, s2, s3}, []vip.NodeInfo{s1}, []vip.ServiceView{svc})
	if len(former) != 1 || former[0] != s2 {
		t.Fatalf("former nodes %+v, want server2 only (server3 is no backend)", former)
	}
	if err := saveKnownNodes(path, []vip.NodeInfo{s1}, former); err != nil {
		t.Fatal(err)
	}
	got, err := loadKnownNodes(path)
	if err != nil || len(got) != 2 || got[0] != s1 || got[1] != s2 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
}
