package tsng

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// membership is a network's member set at one moment, immutable once
// made. The network keeps the one in force in an atomic pointer, and a
// reload swaps in a new one whole: every reader (the control channel's
// peer and address maps, the replicator's peers, the registry's nodes, the
// WireGuard path check) loads one snapshot and so never sees a member
// half added or half removed.
type membership struct {
	// members is every member, this node first; peers[i] is the config of
	// members[i+1].
	members []vip.NodeInfo
	peers   []PeerConfig
	// former are departed members that some stored backend still names
	// (vip.RegistryOptions.FormerNodes).
	former []vip.NodeInfo
	// peerIDs are the ids of members[1:], for the replicator (which copies
	// what it is given).
	peerIDs []vip.NodeID
	byAddr  map[netip.Addr]int // index into members
	byID    map[vip.NodeID]int
}

// newMembership makes the snapshot of members (this node first, then
// peers' in order) and former. It keeps its own copies.
func newMembership(members []vip.NodeInfo, peers []PeerConfig, former []vip.NodeInfo) *membership {
	m := &membership{members: slices.Clone(members), peers: slices.Clone(peers), former: slices.Clone(former),
		byAddr: make(map[netip.Addr]int, len(members)), byID: make(map[vip.NodeID]int, len(members))}
	for i, x := range m.members {
		m.byAddr[x.Addr] = i
		m.byID[x.ID] = i
		if i > 0 {
			m.peerIDs = append(m.peerIDs, x.ID)
		}
	}
	return m
}

// peer returns the config and member info of peer id.
func (m *membership) peer(id vip.NodeID) (PeerConfig, vip.NodeInfo, bool) {
	i, ok := m.byID[id]
	if !ok || i == 0 {
		return PeerConfig{}, vip.NodeInfo{}, false
	}
	return m.peers[i-1], m.members[i], true
}

// wgConfig is the WireGuard configuration of the member set: this node's
// key and a peer per member, routed its overlay /32. A peer's endpoint is
// the configured one, except for the peers keep says to keep as the device
// has them (their endpoint left empty, so a roamed endpoint stays).
// ListenPort is 0 (keep the port in use).
func (m *membership) wgConfig(node NodeConfig, keep func(PeerConfig) bool) wg.Config {
	c := wg.Config{PrivateKey: node.WireGuardKey}
	for i, p := range m.peers {
		pc := wg.PeerConfig{PublicKey: p.WireGuardKey, AllowedIPs: []netip.Prefix{netip.PrefixFrom(m.members[i+1].Addr, 32)}, PersistentKeepalive: 25 * time.Second}
		if p.Endpoint != "" && (keep == nil || !keep(p)) {
			pc.Endpoint = netip.MustParseAddrPort(p.Endpoint) // validated
		}
		c.Peers = append(c.Peers, pc)
	}
	return c
}

// authorsOf returns the members' crdt author keys.
func authorsOf(members []vip.NodeInfo) []crdt.AuthorID {
	out := make([]crdt.AuthorID, len(members))
	for i, m := range members {
		out[i] = crdt.AuthorID(m.ID)
	}
	return out
}
