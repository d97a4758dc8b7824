//go:build linux

package keelvip_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/transport/netns"
)

func registerChildren() {
	netns.RegisterChild("keel-tend", tendChild)
	netns.RegisterChild("etcd", etcdChild)
	netns.DispatchChild()
}

// tendChild runs `keel-vip tend --mesh args[0] --exe args[1]` in its
// namespace.
func tendChild(ctx context.Context, args []string) error {
	if code := keelvip.Main(ctx, []string{"tend", "--mesh", args[0], "--exe", args[1]}, os.Stdout, os.Stderr); code != 0 {
		return fmt.Errorf("tend exited %d", code)
	}
	return nil
}

// etcdChild runs one embedded etcd member: name dir initial-cluster
// peer-url client-url tick-ms election-ms.
func etcdChild(ctx context.Context, args []string) error {
	if len(args) != 7 {
		return fmt.Errorf("etcd child: %d args", len(args))
	}
	name, dir, cluster := args[0], args[1], args[2]
	pu, err := url.Parse(args[3])
	if err != nil {
		return err
	}
	cu, err := url.Parse(args[4])
	if err != nil {
		return err
	}
	tick, _ := strconv.Atoi(args[5])
	elect, _ := strconv.Atoi(args[6])
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = cluster
	cfg.InitialClusterToken = "keel-vip-e2e"
	cfg.TickMs, cfg.ElectionMs = uint(tick), uint(elect)
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd %s ready (%s)\n", name, strings.Join([]string{cu.String(), pu.String()}, " "))
	case err := <-e.Err():
		return err
	case <-ctx.Done():
		return nil
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("etcd %s not ready after 2 minutes", name)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}
