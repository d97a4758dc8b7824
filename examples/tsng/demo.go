package tsng

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"

	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// Demo runs three in-process nodes (wireguard-go on gVisor netstack over
// loopback UDP: no root, and every file it writes is removed), creates
// api.home with tcp/443 on two backends and udp/53 on one, sends real
// client traffic through the VIP, stops the selected TCP backend's node,
// shows new connections failing over, and prints the status table.
func Demo(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "tsng-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	names := []string{"server1", "server2", "client"}
	cfgs, err := demoConfigs(dir, names)
	if err != nil {
		return err
	}
	say := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	say("starting 3 nodes (wireguard-go on gVisor netstack, UDP on loopback): %s", strings.Join(names, ", "))
	daemons := make([]*Daemon, len(cfgs))
	defer func() {
		for _, d := range daemons {
			if d != nil {
				d.Close()
			}
		}
	}()
	for i, c := range cfgs {
		if daemons[i], err = NewDaemon(ctx, c, DaemonOptions{NoAPI: true}); err != nil {
			return err
		}
	}
	hosts := make([]*netstack.Host, 3)
	for i, d := range daemons {
		hosts[i] = d.Runtime("home").Host()
	}
	// The backends' applications.
	for i, port := range []uint16{6443, 7443} {
		if err := serveTCP(ctx, hosts[i], port, names[i]); err != nil {
			return err
		}
	}
	if err := serveUDPEcho(ctx, hosts[0], 5353, names[0]); err != nil {
		return err
	}
	// Configure from server1; the control channel carries it to the others.
	reg := daemons[0].Runtime("home").Registry()
	if _, err := reg.Create(ctx, "api"); err != nil {
		return err
	}
	b1, _ := reg.ResolveBackend("server1:6443")
	b2, _ := reg.ResolveBackend("server2:7443")
	b3, _ := reg.ResolveBackend("server1:5353")
	if _, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.TCP, Port: 443}, []vip.Backend{b1, b2}); err != nil {
		return err
	}
	v, err := reg.PortAdd(ctx, "api", vip.PortKey{Proto: vip.UDP, Port: 53}, []vip.Backend{b3})
	if err != nil {
		return err
	}
	say("created api.home (%s) on server1: tcp/443 → server1:6443, server2:7443; udp/53 → server1:5353", v.Addr)
	client := daemons[2].Runtime("home")
	if err := waitUntil(ctx, 15*time.Second, func() bool {
		cv, err := client.Registry().Get("api")
		return err == nil && cv.Revision == v.Revision
	}); err != nil {
		return fmt.Errorf("configuration did not reach the client: %w", err)
	}
	say("the client holds the same revision %s (replicated over the control channel)", v.Revision)
	self := client.self().Addr
	addr, err := resolve(ctx, hosts[2], self, "api.home.")
	if err != nil {
		return err
	}
	say("client: DNS api.home → %s (TTL %v)", addr, vip.DNSTTL)
	// Wait until both TCP backends are measured, then connect.
	if err := waitUntil(ctx, 20*time.Second, func() bool { return nextBackend(client, "tcp/443") != "" }); err != nil {
		return errors.New("no TCP backend became eligible")
	}
	first := ""
	for i := range 3 {
		who, err := ask(ctx, hosts[2], netip.AddrPortFrom(addr, 443))
		if err != nil {
			return fmt.Errorf("TCP through the VIP: %w", err)
		}
		say("client: TCP connection %d to api.home:443 answered by %s", i+1, who)
		first = who
	}
	echo, err := udpAsk(ctx, hosts[2], netip.AddrPortFrom(addr, 53), "hello")
	if err != nil {
		return fmt.Errorf("UDP through the VIP: %w", err)
	}
	say("client: UDP datagram to api.home:53 echoed by %s", echo)
	victim := 0
	if first == "server2" {
		victim = 1
	}
	say("stopping %s (its node leaves the mesh)...", names[victim])
	stopped := time.Now()
	daemons[victim].Close()
	daemons[victim] = nil
	other := names[1-victim]
	var moved time.Duration
	if err := waitUntil(ctx, 15*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		who, err := ask(cctx, hosts[2], netip.AddrPortFrom(addr, 443))
		if err == nil && who == other {
			moved = time.Since(stopped)
			return true
		}
		return false
	}); err != nil {
		return fmt.Errorf("no failover to %s: %w", other, err)
	}
	say("failover: new connections to api.home:443 now reach %s, %.1fs after %s stopped", other, moved.Seconds(), names[victim])
	printDemoStatus(out, client.Engine().Status())
	return nil
}

func nextBackend(n *netRuntime, listener string) string {
	eng := n.Engine()
	if eng == nil {
		return ""
	}
	for _, s := range eng.Status().Services {
		for _, l := range s.Listeners {
			if l.Listener == listener && l.Next != nil {
				return l.Next.NodeName
			}
		}
	}
	return ""
}

// printDemoStatus prints st as tsng vip status does: a row per listener
// (its totals), then one per backend, with the same columns.
func printDemoStatus(out io.Writer, st vip.Status) {
	fmt.Fprintln(out, "\nstatus on the client:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VIP\tLISTENER\tBACKEND\tHEALTH\tRTT\tAGE\tBINDINGS\tPKTS OUT/IN\tBYTES OUT/IN\tDROPS\tFAILOVERS\tNEXT")
	for _, s := range st.Services {
		name := s.Name + "." + st.Network
		for _, l := range s.Listeners {
			next := "-"
			if l.Next != nil {
				next = fmt.Sprintf("%s:%d", nameOr(*l.Next), l.Next.Port)
			}
			// UDP bindings fail over; TCP ones never do.
			failovers := func(n uint64) string {
				if !strings.HasPrefix(l.Listener, "udp/") {
					return "-"
				}
				return strconv.FormatUint(n, 10)
			}
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t%d\t%d/%d\t%d/%d\t%d\t%s\t%s\n", name, l.Listener, l.Active, l.PacketsOut, l.PacketsIn,
				l.BytesOut, l.BytesIn, dropCount(l.Drops), failovers(l.Failovers), next)
			for _, b := range l.Backends {
				rtt := "-"
				if rttCurrent(b) {
					rtt = fmt.Sprintf("%.2fms", b.RTTMillis)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s:%d\t%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%d\t%s\t%s\n", name, l.Listener, nameOr(b.BackendRef), b.Port, b.Reason, rtt,
					sampleAge(b.SampleAgeMillis), b.Active, b.PacketsOut, b.PacketsIn, b.BytesOut, b.BytesIn, dropCount(b.Drops), failovers(b.Failovers), next)
			}
		}
	}
	tw.Flush()
	fmt.Fprintf(out, "udp failovers %d, probe bytes out/in %d/%d (apart from user traffic)\n", st.Flow.Failovers, st.Probe.BytesOut, st.Probe.BytesIn)
}

func demoConfigs(dir string, names []string) ([]*Config, error) {
	type node struct {
		seed  []byte
		id    vip.NodeID
		wgKey wg.Key
		port  uint16
		addr  netip.Addr
	}
	nodes := make([]node, len(names))
	for i := range nodes {
		nodes[i].seed = make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(nodes[i].seed); err != nil {
			return nil, err
		}
		copy(nodes[i].id[:], ed25519.NewKeyFromSeed(nodes[i].seed).Public().(ed25519.PublicKey))
		nodes[i].wgKey = wg.GeneratePrivateKey()
		p, err := freeUDPPort()
		if err != nil {
			return nil, err
		}
		nodes[i].port = p
		nodes[i].addr = netip.AddrFrom4([4]byte{100, 80, 0, byte(i + 1)})
	}
	var cfgs []*Config
	for i, n := range nodes {
		nc := NetworkConfig{Name: "home", Overlay: "100.80.0.0/24", Node: NodeConfig{Name: names[i], Address: n.addr.String(),
			IdentityKey: base64.StdEncoding.EncodeToString(n.seed), WireGuardKey: n.wgKey, ListenPort: n.port}}
		for j, p := range nodes {
			if j == i {
				continue
			}
			nc.Peers = append(nc.Peers, PeerConfig{Name: names[j], Address: p.addr.String(), Identity: base64.StdEncoding.EncodeToString(p.id[:]),
				WireGuardKey: p.wgKey.PublicKey(), Endpoint: fmt.Sprintf("127.0.0.1:%d", p.port)})
		}
		cfgs = append(cfgs, &Config{DataDir: fmt.Sprintf("%s/%s", dir, names[i]), Networks: []NetworkConfig{nc}})
	}
	return cfgs, nil
}

func freeUDPPort() (uint16, error) {
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port), nil
}

func waitUntil(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// serveTCP answers every connection with the server's name.
func serveTCP(ctx context.Context, h *netstack.Host, port uint16, name string) error {
	ln, err := h.ListenTCP(netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintln(c, name)
			}()
		}
	}()
	return nil
}

func serveUDPEcho(ctx context.Context, h *netstack.Host, port uint16, name string) error {
	pc, err := h.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(name+": "+string(buf[:n])), from)
		}
	}()
	return nil
}

func ask(ctx context.Context, h *netstack.Host, to netip.AddrPort) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := h.DialTCP(cctx, to)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func udpAsk(ctx context.Context, h *netstack.Host, to netip.AddrPort, msg string) (string, error) {
	var lastErr error
	for range 5 {
		c, err := h.DialUDP(netip.AddrPort{}, to)
		if err != nil {
			return "", err
		}
		c.SetDeadline(time.Now().Add(time.Second))
		c.Write([]byte(msg))
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		c.Close()
		if err == nil {
			return string(buf[:n]), nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
	return "", lastErr
}

// resolve asks the agent's DNS on the node's own overlay address.
func resolve(ctx context.Context, h *netstack.Host, server netip.Addr, name string) (netip.Addr, error) {
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	raw, _ := q.Pack()
	var lastErr error
	for range 5 {
		c, err := h.DialUDP(netip.AddrPort{}, netip.AddrPortFrom(server, 53))
		if err != nil {
			return netip.Addr{}, err
		}
		c.SetDeadline(time.Now().Add(time.Second))
		c.Write(raw)
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		c.Close()
		if err != nil {
			lastErr = err
			continue
		}
		var m dns.Msg
		if err := m.Unpack(buf[:n]); err != nil {
			return netip.Addr{}, err
		}
		for _, rr := range m.Answer {
			if a, ok := rr.(*dns.A); ok {
				addr, _ := netip.AddrFromSlice(a.A.To4())
				return addr, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("DNS %s: rcode %s, no A record", name, dns.RcodeToString[m.Rcode])
	}
	return netip.Addr{}, fmt.Errorf("DNS %s: %w", name, lastErr)
}
