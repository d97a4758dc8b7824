// Package etcdtest starts a real single-member etcd inside the test process
// (go.etcd.io/etcd/server/v3/embed) on 127.0.0.1 with free ports and a
// temporary data directory, for tests of code that talks to etcd. Start it
// once per test binary (in TestMain) and Close it before checking for
// goroutine leaks.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running embedded etcd.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	etcd     *embed.Etcd
	dir      string
}

// Options tunes Start. Zero values give a fast test cluster: 10 ms
// heartbeats and a 100 ms election timeout, so the minimum lease TTL is 1 s.
type Options struct {
	TickMs, ElectionMs uint
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts an etcd member and waits (up to ctx) until it serves.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.TickMs == 0 {
		o.TickMs = 10
	}
	if o.ElectionMs == 0 {
		o.ElectionMs = 100
	}
	dir, err := os.MkdirTemp("", "vipkit-etcd-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := start(ctx, dir, o)
		if err == nil {
			return s, nil
		}
		lastErr = err
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("etcdtest: start: %w", lastErr)
}

func start(ctx context.Context, dir string, o Options) (*Server, error) {
	cp, err := freePort()
	if err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", cp))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", pp))
	cfg := embed.NewConfig()
	cfg.Name = "vipkit"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = o.TickMs, o.ElectionMs
	cfg.UnsafeNoFsync = true
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("not ready: %w", ctx.Err())
	}
	return &Server{Endpoint: cu.String(), etcd: e, dir: dir}, nil
}

// Client returns a new client of the server; the caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(),
	})
}

// Close stops the server and removes its data directory.
func (s *Server) Close() {
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
	os.RemoveAll(s.dir)
}
