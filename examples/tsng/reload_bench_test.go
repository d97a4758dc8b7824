package tsng

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/wg"
)

// fakePeer is member i of a large network (100.80.0.i): a key and an
// endpoint on loopback where nothing answers.
func fakePeer(i int) PeerConfig {
	seed := make([]byte, ed25519.SeedSize)
	seed[0], seed[1] = byte(i), 0xfe
	id := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	return PeerConfig{Name: fmt.Sprintf("peer%d", i), Address: fmt.Sprintf("100.80.0.%d", i), Identity: base64.StdEncoding.EncodeToString(id),
		WireGuardKey: wg.GeneratePrivateKey().PublicKey(), Endpoint: fmt.Sprintf("127.0.0.1:%d", 20000+i)}
}

// BenchmarkReload64Peers: an agent with 64 peers (one a running agent, the
// others keys without a node) reloads its config, each time with its last
// peer removed or put back, while it exchanges UDP datagrams every 5 ms
// with the running peer. ns/op is one reload; gap-ms is the longest the
// exchange went without an answer over the whole run, lost the datagrams
// never answered.
func BenchmarkReload64Peers(b *testing.B) {
	ctx := context.Background()
	cfgs, err := demoConfigs(b.TempDir(), []string{"server1", "server2"})
	if err != nil {
		b.Fatal(err)
	}
	big := cloneConfig(b, cfgs[0])
	for i := 3; len(big.Networks[0].Peers) < 64; i++ {
		big.Networks[0].Peers = append(big.Networks[0].Peers, fakePeer(i))
	}
	less := cloneConfig(b, big)
	less.Networks[0].Peers = less.Networks[0].Peers[:63]
	path := writeConfig(b, big)
	d, err := NewDaemon(ctx, big, DaemonOptions{NoAPI: true, ConfigPath: path})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	other, err := NewDaemon(ctx, cfgs[1], DaemonOptions{NoAPI: true})
	if err != nil {
		b.Fatal(err)
	}
	defer other.Close()
	if err := serveUDPEcho(ctx, other.Runtime("home").Host(), 7000, "server2"); err != nil {
		b.Fatal(err)
	}
	to := netip.AddrPortFrom(other.Runtime("home").self().Addr, 7000)
	if _, err := udpAsk(ctx, d.Runtime("home").Host(), to, "first"); err != nil {
		b.Fatal(err)
	}
	uc, err := d.Runtime("home").Host().DialUDP(netip.AddrPort{}, to)
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu           sync.Mutex
		maxGap       time.Duration
		sent, gotten int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 1500)
		last := time.Now()
		for {
			n, err := uc.Read(buf)
			if err != nil {
				return
			}
			_ = n
			mu.Lock()
			gotten++
			maxGap = max(maxGap, time.Since(last))
			last = time.Now()
			mu.Unlock()
		}
	})
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if _, err := uc.Write([]byte("ping")); err == nil {
				mu.Lock()
				sent++
				mu.Unlock()
			}
		}
	})
	b.ResetTimer()
	for i := range b.N {
		c := less
		if i%2 == 1 {
			c = big
		}
		b.StopTimer()
		rewriteConfig(b, path, c)
		b.StartTimer()
		if res, err := d.Reload(ctx); err != nil || !res.Changed {
			b.Fatalf("reload %d: %+v %v", i, res, err)
		}
	}
	b.StopTimer()
	close(stop)
	// The last answers arrive (within a second), then the reader ends.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		done := gotten >= sent
		mu.Unlock()
		if done {
			break
		}
	}
	uc.Close()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	b.ReportMetric(float64(maxGap.Microseconds())/1000, "gap-ms")
	b.ReportMetric(float64(sent-gotten), "lost")
}
