package tsng

import (
	"errors"
	"strings"
	"testing"
)

// TestConfigDuplicateKeys: a peer with another member's identity or
// WireGuard key (or this node's) is refused, naming the field.
func TestConfigDuplicateKeys(t *testing.T) {
	p2, _ := testPeer(2)
	p3, _ := testPeer(3)
	sameID := p3
	sameID.Identity = p2.Identity
	sameWG := p3
	sameWG.WireGuardKey = p2.WireGuardKey
	cfg := oneNodeConfig(t.TempDir())
	ownWG := p3
	ownWG.WireGuardKey = cfg.Networks[0].Node.WireGuardKey.PublicKey()
	for _, c := range []struct {
		peer  PeerConfig
		field string
	}{{sameID, "peers[1] (server3).identity"}, {sameWG, "peers[1] (server3).wireguard_key"}, {ownWG, "peers[1] (server3).wireguard_key"}} {
		cfg.Networks[0].Peers = []PeerConfig{p2, c.peer}
		err := cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("want an error naming %s, got %v", c.field, err)
		}
	}
}
