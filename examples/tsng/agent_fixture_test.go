package tsng

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vipkit/vipkit/transport/wg"
)

// socketDir makes a directory with a short path under the system's
// temporary directory (a Unix socket's path in it stays well under the
// kernel's limit, whatever the test's name), removed at t's cleanup.
func socketDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// testPeer is member serverN (N a digit) at 100.80.0.N, with the identity
// of the seed N,0,0,… and a fresh WireGuard key. It also returns the
// identity, in hex as in the config.
func testPeer(n byte) (PeerConfig, string) {
	s := make([]byte, ed25519.SeedSize)
	s[0] = n
	id := hexOf(ed25519.NewKeyFromSeed(s).Public().(ed25519.PublicKey))
	return PeerConfig{Name: "server" + string('0'+n), Address: "100.80.0." + string('0'+n), Identity: id, WireGuardKey: wg.GeneratePrivateKey().PublicKey()}, id
}

// oneNodeConfig is the config of an agent in netstack mode in dir: node
// server1 (100.80.0.1, the identity of the seed 1,0,0,…) of network home
// (100.80.0.0/24, DNS on port 5353) with peers, and its metrics on a free
// loopback port.
func oneNodeConfig(dir string, peers ...PeerConfig) *Config {
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 1
	nc := NetworkConfig{Name: "home", Overlay: "100.80.0.0/24", DNSPort: 5353,
		Node:  NodeConfig{Name: "server1", Address: "100.80.0.1", IdentityKey: base64.StdEncoding.EncodeToString(seed), WireGuardKey: wg.GeneratePrivateKey()},
		Peers: peers}
	return &Config{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "api.sock"), Metrics: "127.0.0.1:0", Networks: []NetworkConfig{nc}}
}

// startDaemon starts the agent of cfg, with default options; the caller
// closes it.
func startDaemon(t *testing.T, cfg *Config) *Daemon {
	t.Helper()
	d, err := NewDaemon(context.Background(), cfg, DaemonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// syncBuffer is a bytes.Buffer safe for a daemon's logger and a test.
type syncBuffer struct {
	// mu guards b.
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

// Write appends p.
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
