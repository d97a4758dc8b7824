package tsng

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/wg"
)

// TestOnChangeDoesNotWaitForStop: stopping a network holds its lock while
// it waits for the control carrier's handlers, and a handler that merges a
// peer's frame ends in onChange. So onChange must return while the lock is
// held, or the stop and the handler wait for each other for ever.
func TestOnChangeDoesNotWaitForStop(t *testing.T) {
	dir, err := os.MkdirTemp("", "tsngstop")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	seed := make([]byte, 32)
	seed[0] = 1
	peerSeed := make([]byte, 32)
	peerSeed[0] = 2
	peerID := ed25519.NewKeyFromSeed(peerSeed).Public().(ed25519.PublicKey)
	cfg := &Config{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "api.sock"), UI: "off",
		Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24", DNSPort: 5353,
			Node:  NodeConfig{Name: "server1", Address: "100.80.0.1", IdentityKey: base64.StdEncoding.EncodeToString(seed), WireGuardKey: wg.GeneratePrivateKey()},
			Peers: []PeerConfig{{Name: "server2", Address: "100.80.0.2", Identity: hexOf(peerID), WireGuardKey: wg.GeneratePrivateKey().PublicKey()}}}}}
	d, err := NewDaemon(context.Background(), cfg, DaemonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	n := d.nets[0]
	if !n.up.Load() {
		t.Fatal("network not up")
	}

	n.mu.Lock() // as stopLocked holds it while it waits for the handlers
	returned := make(chan struct{})
	go func() {
		n.onChange(nil, false)
		close(returned)
	}()
	select {
	case <-returned:
		n.mu.Unlock()
	case <-time.After(30 * time.Second):
		n.mu.Unlock()
		<-returned
		t.Fatal("onChange waited for the network's lock, which a stop holds while it waits for onChange")
	}
}
