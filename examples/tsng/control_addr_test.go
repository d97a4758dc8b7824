package tsng

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vipkit/vipkit/vip"
)

// goneConn is a connection whose endpoint has closed: gVisor's gonet
// returns a nil RemoteAddr then.
type goneConn struct{ net.Conn }

func (goneConn) RemoteAddr() net.Addr { return nil }
func (goneConn) LocalAddr() net.Addr  { return nil }
func (goneConn) Close() error         { return nil }

// A connection whose peer closed it before it was admitted has no remote
// address any more: it is no member's, and admit refuses it (counted)
// instead of dereferencing the missing address.
func TestAdmitConnWithoutRemoteAddr(t *testing.T) {
	var id vip.NodeID
	id[0] = 1
	c := &Control{
		o:       ControlOptions{Peer: func(netip.Addr) (vip.NodeID, bool) { return id, true }},
		inbound: map[vip.NodeID][]inConn{},
		pending: map[vip.NodeID][]net.Conn{},
		pinned:  map[vip.NodeID]bool{},
		peers:   map[vip.NodeID]*peerConn{},
	}
	if _, ok := c.member(goneConn{}); ok {
		t.Fatal("a connection without a remote address named a member")
	}
	if c.admit(goneConn{}, id, true, false) {
		t.Fatal("admitted a connection without a remote address")
	}
	if s := c.Stats(); s.Refused != 1 {
		t.Fatalf("refused %d, want 1", s.Refused)
	}
}
