//go:build linux

package keelvip_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/netns"
)

// ownMember returns a client of n's etcd member from n's own namespace
// (no overlay leg in the way).
func (c *cluster) ownMember(n *node) *clientv3.Client {
	ep := fmt.Sprintf("[%v]:2379", n.addr)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return n.h.Dial(ctx, "tcp", addr)
		})}})
	if err != nil {
		c.t.Fatal(err)
	}
	return cli
}

// ownMemberStatus asks n's etcd member which leader it follows.
func (c *cluster) ownMemberStatus(n *node) (*clientv3.StatusResponse, error) {
	cli := c.ownMember(n)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cli.Status(ctx, fmt.Sprintf("[%v]:2379", n.addr))
}

// quorumRead reports whether n's etcd member serves a linearizable read
// (etcd's ReadIndex: the leader confirms it leads a quorum) within 2 s.
func (c *cluster) quorumRead(cli *clientv3.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := cli.Get(ctx, "/keel/e2e/quorum-probe")
	return err == nil
}

// evidence logs what a failed heal needs: every member's view of etcd's
// leader from its own namespace, whether each overlay leg carries a TCP
// connection to the peer port, and every member's etcd log since from
// (the byte offsets returned by etcdLogSizes).
func (c *cluster) evidence(from map[string]int64) {
	t := c.t
	for _, n := range c.nodes {
		st, err := c.ownMemberStatus(n)
		if err != nil {
			t.Logf("evidence: %s's etcd member: %v", n.name, err)
		} else {
			t.Logf("evidence: %s's etcd member: id %x leader %x term %d raft index %d errors %v", n.name, st.Header.MemberId, st.Leader, st.RaftTerm, st.RaftIndex, st.Errors)
		}
		for _, p := range c.nodes {
			if p == n {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			conn, err := n.h.Dial(ctx, "tcp", fmt.Sprintf("[%v]:2380", p.addr))
			cancel()
			if err == nil {
				conn.Close()
			}
			t.Logf("evidence: overlay leg %s→%s (tcp to etcd's peer port): %v", n.name, p.name, errOr(err))
		}
	}
	for _, n := range c.nodes {
		b, err := os.ReadFile(filepath.Join(n.dir, "etcd.log"))
		if err != nil {
			t.Logf("evidence: %s's etcd log: %v", n.name, err)
			continue
		}
		b = b[min(from[n.name], int64(len(b))):]
		t.Logf("evidence: %s's etcd log since the fault:\n%s", n.name, b)
	}
}

// leadAmong waits until the members ms (a quorum) have a leader, and
// makes ms[0] the leader.
func (c *cluster) leadAmong(ms ...*node) {
	c.t.Helper()
	waitFor(c.t, 60*time.Second, ms[0].name+" leads "+fmt.Sprint(len(ms))+" members", func() bool {
		ids := map[uint64]*node{}
		var leader uint64
		for _, m := range ms {
			st, err := func() (*clientv3.StatusResponse, error) {
				cli := c.etcdClient(m)
				defer cli.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				return cli.Status(ctx, fmt.Sprintf("[%v]:2379", m.addr))
			}()
			if err != nil || st.Leader == 0 {
				return false
			}
			ids[st.Header.MemberId] = m
			leader = st.Leader
		}
		l := ids[leader]
		if l == nil {
			return false
		}
		if l == ms[0] {
			return true
		}
		var target uint64
		for id, m := range ids {
			if m == ms[0] {
				target = id
			}
		}
		cli := c.etcdClient(l)
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.MoveLeader(ctx, target); err != nil {
			c.t.Logf("move leader to %s: %v", ms[0].name, err)
		}
		return false
	})
}

func errOr(err error) string {
	if err == nil {
		return "connected"
	}
	return err.Error()
}

// etcdLogSizes returns the size of every member's etcd log now.
func (c *cluster) etcdLogSizes() map[string]int64 {
	m := map[string]int64{}
	for _, n := range c.nodes {
		if fi, err := os.Stat(filepath.Join(n.dir, "etcd.log")); err == nil {
			m[n.name] = fi.Size()
		}
	}
	return m
}

// TestPartitionEtcdRestartNetns: A holds the VIP and B leads etcd; B is
// cut off for 30 s, and during the cut C's etcd member is killed and
// restarted (A has no quorum until C's member is back, so A stops
// renewing and is fenced), then A is made etcd's leader, so that B's way
// back to the leader is over peer streams that stayed open through the
// cut. After the heal B's etcd member must serve a linearizable read
// within 15 s, and exactly one pair member must carry the VIP within
// 45 s (B, as A is fenced). etcd's peer streams never time out a silent
// connection, so this holds only with TCP's retransmission backoff
// capped (rtoMaxMs; see the README).
func TestPartitionEtcdRestartNetns(t *testing.T) {
	seed := testenv.Seed(t, 2026)
	t.Setenv("KEEL_VIP_LOG_LEVEL", "debug") // wireguard-go's handshakes in the helpers' logs
	impair := map[string]any{"latency_ms": 125, "jitter_ms": 12.5, "loss": 0.01}
	c := newCluster(t, seed, true, impair, "a", "b", "c")
	A, B, C := c.node("a"), c.node("b"), c.node("c")
	c.start()
	c.startEtcd(500, 5000)
	w := c.watchAddrs()
	c.holdAtA()
	c.moveLeader(B, false)
	bcli := c.ownMember(B)
	defer bcli.Close()
	if !c.quorumRead(bcli) {
		t.Fatal("B's etcd member serves no linearizable read before the cut")
	}

	logs := c.etcdLogSizes()
	t.Logf("cut B (etcd's leader) for 30 s")
	cut := time.Now()
	if err := c.sw.Cut(B.h); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	t.Logf("kill C's etcd member")
	if err := C.etcd.Kill(); err != nil {
		t.Fatal(err)
	}
	<-C.etcd.Done()
	time.Sleep(8 * time.Second)
	t.Logf("restart C's etcd member")
	C.etcd = netns.StartChildT(t, C.h, "etcd", C.etcdArgs...)
	// A leads the two members that have a quorum, as in the run that
	// failed: B's way back to the leader is then over its peer streams
	// with A, which were open through the cut (C's are new).
	c.leadAmong(A, C)
	time.Sleep(time.Until(cut.Add(30 * time.Second)))
	if err := c.sw.Heal(B.h); err != nil {
		t.Fatal(err)
	}
	healed := bootNow()
	t.Logf("healed B")

	deadline := time.Now().Add(45 * time.Second)
	var readAt, carrierAt time.Duration
	for time.Now().Before(deadline) && (readAt == 0 || carrierAt == 0) {
		if readAt == 0 && c.quorumRead(bcli) {
			readAt = bootNow() - healed
		}
		if carrierAt == 0 && carriesAddr(A.h, testVIP) != carriesAddr(B.h, testVIP) {
			carrierAt = bootNow() - healed
		}
		time.Sleep(100 * time.Millisecond)
	}
	es := w.events()
	if two := twoCarriers(es); len(two) > 0 {
		t.Errorf("two carriers at %v", two)
	}
	switch {
	case readAt == 0:
		t.Errorf("B's etcd member serves no linearizable read 45 s after the heal")
	case readAt > 15*time.Second:
		t.Errorf("B's etcd member served a linearizable read %v after the heal, want ≤ 15 s", readAt)
	}
	if carrierAt == 0 {
		sa, erra := c.status(A)
		sb, errb := c.status(B)
		t.Errorf("45 s after the heal: carriers a=%v b=%v (status a %+v %v, b %+v %v)", carriesAddr(A.h, testVIP), carriesAddr(B.h, testVIP), sa, erra, sb, errb)
	}
	if t.Failed() {
		c.evidence(logs)
	}
	t.Logf("after the heal: B's etcd member served a linearizable read at %v, one member carried at %v; address events %v", readAt, carrierAt, es)
}
