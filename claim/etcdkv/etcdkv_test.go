package etcdkv_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim/etcdkv"
	"github.com/vipkit/vipkit/claim/etcdkv/etcdtest"
	"github.com/vipkit/vipkit/claim/kvtest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

var (
	server    *etcdtest.Server
	client    *clientv3.Client
	startErr  error
	prefixSeq atomic.Int64
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	server, startErr = etcdtest.Start(ctx, etcdtest.Options{})
	cancel()
	if startErr == nil {
		client, startErr = server.Client()
	}
	code := m.Run()
	if client != nil {
		client.Close()
	}
	if server != nil {
		server.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func needEtcd(t testing.TB) {
	t.Helper()
	if startErr != nil {
		testenv.Skip(t, "embedded etcd did not start: %v", startErr)
	}
}

func realHarness(t *testing.T) kvtest.Harness {
	needEtcd(t)
	return kvtest.Harness{
		KV:      etcdkv.New(client),
		Prefix:  fmt.Sprintf("/t/%d/", prefixSeq.Add(1)),
		TTL:     time.Second,
		Advance: func(d time.Duration) { transport.Sleep(transport.RealClock{}, d, nil) },
		Eventually: func(within time.Duration, cond func() bool) bool {
			end := time.Now().Add(within)
			for !cond() {
				if time.Now().After(end) {
					return false
				}
				transport.Sleep(transport.RealClock{}, 20*time.Millisecond, nil)
			}
			return true
		},
	}
}

func TestContract(t *testing.T) { kvtest.Run(t, realHarness) }
