package tsng

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/vip"
)

// floodNames is how many distinct names one flood asks for.
const floodNames = 10000

// floodWindow is how many of its queries the flooding client keeps
// unanswered at once. It is far above every cap, and small enough that
// neither side's socket buffer overflows (floodPorts sockets share it), so
// every answer arrives and the tallies are exact. The kernel's drops on
// both sides are counted all the same, and reported.
const floodWindow = 1024

// floodPorts is how many ports of each source address the flood uses.
const floodPorts = 8

// floodResult is what the flooding process reports on its stdout.
type floodResult struct {
	Error      string `json:"error,omitempty"`
	Sent       int    `json:"sent"`
	Unanswered int    `json:"unanswered"`
	// Drops is how many datagrams the kernel dropped on the flood's
	// sockets: answers that never reached it.
	Drops  uint64         `json:"drops"`
	Rcodes map[string]int `json:"rcodes"`
	// Prompt counts the answers that came before dnsForwardTimeout, by
	// rcode; Slowest is the longest of them waited.
	Prompt  map[string]int `json:"prompt"`
	Slowest time.Duration  `json:"slowest"`
}

const floodResultPrefix = "DNSFLOOD "

// startSilentUpstream runs a resolver on loopback UDP that answers
// good.test. with 192.0.2.8 at once and never answers any other name, so
// that every other forwarded query waits out dnsForwardTimeout. It runs on
// one goroutine and one socket however many queries arrive.
func startSilentUpstream(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pc.SetReadBuffer(4 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			q := new(dns.Msg)
			if q.Unpack(buf[:n]) != nil || len(q.Question) != 1 || !strings.EqualFold(q.Question[0].Name, "good.test.") {
				continue
			}
			m := new(dns.Msg)
			m.SetReply(q)
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 8)})
			if b, err := m.Pack(); err == nil {
				pc.WriteToUDPAddrPort(b, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// openFDs counts the test process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// askGood asks server for good.test. from 127.0.0.2, a client other than
// the flood's, and returns the answer's address or its rcode.
func askGood(t *testing.T, server string) string {
	t.Helper()
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}}}
	q := new(dns.Msg)
	q.SetQuestion("good.test.", dns.TypeA)
	m, _, err := c.Exchange(q, server)
	if err != nil {
		return err.Error()
	}
	return aOf(m)
}

// forwardsInFlight is the number of forwarded queries under way.
func forwardsInFlight(h *dnsHandler) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.forwarding
}

// TestDNSForwardFloodBounded: a local user (another uid) floods the agent
// with queries for 10,000 distinct names, which an upstream never answers.
// 10,000 distinct DNS names keep goroutines and file descriptors under the
// stated cap: the agent holds at most maxForwardPerClient forwards for one
// client and maxForwardInflight for all, answers the rest at once (REFUSED
// over a client's share, SERVFAIL over the total) and counts them, and a
// well-behaved client is answered during a one-client flood and after any
// flood.
func TestDNSForwardFloodBounded(t *testing.T) {
	if testenv.OtherUserRole() == "dnsflood" {
		dnsFlood()
		return
	}
	if testenv.OtherUserRole() != "" {
		return
	}
	g0 := runtime.NumGoroutine() // before the upstream and the server
	up := startSilentUpstream(t)
	own, err := vip.NewDNSServer(vip.DNSOptions{Domain: "home", Lookup: func(string) (netip.Addr, bool) { return netip.Addr{}, false }})
	if err != nil {
		t.Fatal(err)
	}
	h := newDNSHandler(own, vip.DNSOptions{Domain: "home"}, []netip.AddrPort{up}, discardLogger())
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	forceReadBuffer(pc, 4<<20) // the whole flood window fits: nothing is lost
	server := pc.LocalAddr().String()
	srvs, err := serveDNS(h, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srvs.Close() })
	if got := askGood(t, server); got != "192.0.2.8" {
		t.Fatalf("before any flood, good.test: %s", got)
	}

	// One client: one address, however many ports.
	t.Run("one client", func(t *testing.T) {
		res, st := runFlood(t, h, g0, pc, "a", []string{"127.0.0.1"}, maxForwardPerClient, true)
		if res.Rcodes["REFUSED"] == 0 {
			t.Errorf("no query of the flood was refused: %+v", res)
		}
		// Every REFUSED came from the client's limit and was counted; a
		// count may also be in transit (unanswered when the flood ended).
		if st.ClientLimit < uint64(res.Rcodes["REFUSED"]) || st.ClientLimit > uint64(res.Rcodes["REFUSED"]+res.Unanswered) {
			t.Errorf("counted %d over the client's limit; the flood saw %d REFUSED and %d unanswered", st.ClientLimit, res.Rcodes["REFUSED"], res.Unanswered)
		}
		if st.Busy != 0 || st.Loops != 0 {
			t.Errorf("one client met the total limit (%d) or the loop guard (%d)", st.Busy, st.Loops)
		}
	})
	// Many clients (addresses 127.0.0.3 to 127.0.0.10): the total cap.
	t.Run("many clients", func(t *testing.T) {
		var srcs []string
		for i := 3; i <= 10; i++ {
			srcs = append(srcs, fmt.Sprintf("127.0.0.%d", i))
		}
		res, st := runFlood(t, h, g0, pc, "b", srcs, maxForwardInflight, false)
		if res.Prompt["SERVFAIL"] == 0 {
			t.Errorf("no query over the total cap got a prompt SERVFAIL: %+v", res)
		}
		// A SERVFAIL before dnsForwardTimeout is one over the total
		// limit (the upstream never fails fast), and every one of those
		// the flood received was prompt.
		if st.Busy < uint64(res.Prompt["SERVFAIL"]) || st.Busy > uint64(res.Prompt["SERVFAIL"]+res.Unanswered) {
			t.Errorf("counted %d over the total limit; the flood saw %d prompt SERVFAIL and %d unanswered", st.Busy, res.Prompt["SERVFAIL"], res.Unanswered)
		}
		if st.ClientLimit < uint64(res.Rcodes["REFUSED"]) || st.ClientLimit > uint64(res.Rcodes["REFUSED"]+res.Unanswered) || st.Loops != 0 {
			t.Errorf("counted %d over a client's limit and %d loops; the flood saw %d REFUSED", st.ClientLimit, st.Loops, res.Rcodes["REFUSED"])
		}
	})
}

// runFlood runs one flood of floodNames names from the addresses srcs (as
// another uid) against server and watches the test process while it is in
// flight: its goroutines (over g0) and open file descriptors stay under the
// caps, and the forwards in flight reach held (so the watch saw the flood
// at its height). With goodDuring, a well-behaved client is asked while the flood
// holds its share. After the flood the good client is answered again.
func runFlood(t *testing.T, h *dnsHandler, g0 int, pc *net.UDPConn, prefix string, srcs []string, held int, goodDuring bool) (floodResult, dnsStats) {
	server := pc.LocalAddr().String()
	// Forwards of an earlier flood end first: they are not this one's.
	deadline := time.Now().Add(15 * time.Second)
	for forwardsInFlight(h) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d forwards of the earlier flood still in flight", forwardsInFlight(h))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd := testenv.AsOtherUser(t, "TestDNSForwardFloodBounded", "dnsflood",
		"VIPKIT_DNS_SERVER="+server, "VIPKIT_DNS_SOURCES="+strings.Join(srcs, ","),
		"VIPKIT_DNS_PREFIX="+prefix, "VIPKIT_DNS_HELD="+strconv.Itoa(held))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	st0 := h.Stats()
	drops0, err := udpDrops(pc)
	if err != nil {
		t.Fatal(err)
	}
	fd0 := openFDs(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// Goroutines are counted from before the upstream and the server
	// started, file descriptors from before this flood (the server's socket
	// and the upstream's are older). The upstream's goroutine, the server's
	// reader, the subtest's and the stdout reader are the test's own, as are
	// the command's pipe and pidfd: 8 covers them.
	const slack = 8
	maxG, maxFD, maxFwd := 0, 0, 0
	var res floodResult
	gotResult, asked := false, !goodDuring
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline = time.Now().Add(120 * time.Second)
watch:
	for {
		g, fd, fwd := runtime.NumGoroutine()-g0, openFDs(t)-fd0, forwardsInFlight(h)
		maxG, maxFD, maxFwd = max(maxG, g), max(maxFD, fd), max(maxFwd, fwd)
		if g > udpHandlers+slack || fd > held+slack {
			t.Errorf("during the flood: %d goroutines and %d open fds over the test's own (%d forwards in flight); want at most %d and %d",
				g, fd, fwd, udpHandlers+slack, held+slack)
			cmd.Process.Kill()
			break
		}
		if !asked && fwd >= held {
			asked = true
			if got := askGood(t, server); got != "192.0.2.8" {
				t.Errorf("during the flood (%d forwards in flight), good.test from another client: %s", fwd, got)
			} else {
				t.Logf("during the flood (%d forwards in flight), good.test from another client: %s", fwd, got)
			}
		}
		select {
		case l, ok := <-lines:
			if !ok {
				break watch
			}
			if s, ok := strings.CutPrefix(l, floodResultPrefix); ok {
				if err := json.Unmarshal([]byte(s), &res); err != nil {
					t.Fatal(err)
				}
				gotResult = true
			}
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Errorf("the flood was still running after 120 s")
			cmd.Process.Kill()
			break
		}
	}
	for range lines {
	}
	wg.Wait()
	cmd.Wait()
	st1 := h.Stats()
	drops1, err := udpDrops(pc)
	if err != nil {
		t.Fatal(err)
	}
	st := dnsStats{Loops: st1.Loops - st0.Loops, ClientLimit: st1.ClientLimit - st0.ClientLimit, Busy: st1.Busy - st0.Busy, HandlerWaits: st1.HandlerWaits - st0.HandlerWaits}
	t.Logf("flood from %v: at most %d goroutines, %d fds over the test's own, %d forwards in flight; %+v; counted %+v; the kernel dropped %d queries at the server, %d answers at the flood",
		srcs, maxG, maxFD, maxFwd, res, st, drops1-drops0, res.Drops)
	if t.Failed() {
		return res, st
	}
	if !gotResult || res.Error != "" {
		t.Fatalf("the flood reported no tallies: %q", res.Error)
	}
	// A datagram the kernel dropped (a full receive buffer on a busy
	// machine) is unanswered through no fault of the agent's; every other
	// query beyond those held was answered.
	if lost := drops1 - drops0 + res.Drops; res.Sent != floodNames || uint64(res.Unanswered) > uint64(held)+lost {
		t.Errorf("the flood sent %d and ended with %d unanswered (the kernel dropped %d), want %d and at most %d+%d", res.Sent, res.Unanswered, lost, floodNames, held, lost)
	}
	if maxFwd != held {
		t.Errorf("at most %d forwards in flight, want the flood to hold %d", maxFwd, held)
	}
	if res.Rcodes["REFUSED"] != res.Prompt["REFUSED"] {
		t.Errorf("%d REFUSED, of which only %d before %v", res.Rcodes["REFUSED"], res.Prompt["REFUSED"], dnsForwardTimeout)
	}
	// After the flood: answered once its forwards end.
	deadline = time.Now().Add(15 * time.Second)
	for {
		got := askGood(t, server)
		if got == "192.0.2.8" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the flood, good.test from another client: %s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return res, st
}

// dnsFlood is the flooding client, run as another uid: it asks
// VIPKIT_DNS_SERVER for floodNames distinct names from floodPorts ports of each
// address of VIPKIT_DNS_SOURCES, keeping floodWindow unanswered at most,
// then waits until at most VIPKIT_DNS_HELD are unanswered and prints its
// tallies (floodResultPrefix, JSON).
func dnsFlood() {
	fail := func(err error) {
		b, _ := json.Marshal(floodResult{Error: err.Error()})
		fmt.Println(floodResultPrefix + string(b))
		os.Exit(1)
	}
	dst, err := net.ResolveUDPAddr("udp4", os.Getenv("VIPKIT_DNS_SERVER"))
	if err != nil {
		fail(err)
	}
	held, _ := strconv.Atoi(os.Getenv("VIPKIT_DNS_HELD"))
	prefix := os.Getenv("VIPKIT_DNS_PREFIX")
	var conns []*net.UDPConn
	for _, s := range strings.Split(os.Getenv("VIPKIT_DNS_SOURCES"), ",") {
		for range floodPorts {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(s)})
			if err != nil {
				fail(err)
			}
			forceReadBuffer(c, 1<<20)
			conns = append(conns, c)
		}
	}
	var (
		mu          sync.Mutex
		cond        = sync.NewCond(&mu)
		sentAt      = make([]time.Time, floodNames)
		answered    = make([]bool, floodNames)
		outstanding int
		timedOut    bool
		res         = floodResult{Rcodes: map[string]int{}, Prompt: map[string]int{}}
	)
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65535)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				m := new(dns.Msg)
				if m.Unpack(buf[:n]) != nil {
					continue
				}
				i := int(m.Id) - 1
				mu.Lock()
				if i >= 0 && i < floodNames && !sentAt[i].IsZero() && !answered[i] {
					answered[i] = true
					outstanding--
					rc := dns.RcodeToString[m.Rcode]
					res.Rcodes[rc]++
					if d := time.Since(sentAt[i]); d < dnsForwardTimeout {
						res.Prompt[rc]++
						res.Slowest = max(res.Slowest, d)
					}
					cond.Broadcast()
				}
				mu.Unlock()
			}
		}()
	}
	timer := time.AfterFunc(60*time.Second, func() {
		mu.Lock()
		timedOut = true
		cond.Broadcast()
		mu.Unlock()
	})
	for i := range floodNames {
		mu.Lock()
		for outstanding >= floodWindow && !timedOut {
			cond.Wait()
		}
		if timedOut {
			mu.Unlock()
			break
		}
		outstanding++
		sentAt[i] = time.Now()
		res.Sent++
		mu.Unlock()
		q := new(dns.Msg)
		q.SetQuestion(fmt.Sprintf("%s%d.flood.test.", prefix, i), dns.TypeA)
		q.Id = uint16(i + 1)
		b, err := q.Pack()
		if err != nil {
			fail(err)
		}
		if _, err := conns[i%len(conns)].WriteToUDP(b, dst); err != nil {
			fail(err)
		}
	}
	mu.Lock()
	for outstanding > held && !timedOut {
		cond.Wait()
	}
	res.Unanswered = outstanding
	if res.Drops, err = udpDrops(conns...); err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	mu.Unlock()
	timer.Stop()
	fmt.Println(floodResultPrefix + string(b))
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
}

// TestDNSUDPNonQueries: the UDP server answers no message that is not a
// query (too short, unparsable, a response), and after many of them, more
// than it has handlers, a query is answered: each went back to its handler.
func TestDNSUDPNonQueries(t *testing.T) {
	own, err := vip.NewDNSServer(vip.DNSOptions{Domain: "home", Lookup: func(l string) (netip.Addr, bool) {
		return netip.MustParseAddr("100.80.0.9"), l == "api"
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := newDNSHandler(own, vip.DNSOptions{Domain: "home"}, nil, discardLogger())
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pc.SetReadBuffer(4 << 20) // all of them fit: none is lost
	srvs, err := serveDNS(h, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srvs.Close() })
	c, err := net.DialUDP("udp4", nil, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp := new(dns.Msg)
	resp.SetQuestion("api.home.", dns.TypeA)
	resp.Response = true
	rb, _ := resp.Pack()
	junk := [][]byte{{1, 2, 3}, bytes.Repeat([]byte{0xff}, 40), rb}
	for range udpHandlers + 1 {
		for _, b := range junk {
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	q := new(dns.Msg)
	q.SetQuestion("api.home.", dns.TypeA)
	qb, _ := q.Pack()
	if _, err := c.Write(qb); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("the query after %d non-queries: %v", len(junk)*(udpHandlers+1), err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil || m.Id != q.Id || aOf(m) != "100.80.0.9" {
		t.Fatalf("the first message back is not the query's answer: %v %v", m, err)
	}
}

// TestDNSLimitMetrics: the agent's metrics carry each network's DNS limit
// counts, by limit.
func TestDNSLimitMetrics(t *testing.T) {
	d, _ := uiDaemonWith(t, nil)
	n := d.Runtime("home")
	n.mu.Lock()
	h := n.dns.h.(*dnsHandler)
	n.mu.Unlock()
	h.mu.Lock()
	h.stats = dnsStats{Loops: 1, ClientLimit: 2, Busy: 3, HandlerWaits: 4}
	h.mu.Unlock()
	if err := testutil.GatherAndCompare(d.metricsRegistry(), strings.NewReader(`
# HELP tsng_dns_limited_total DNS queries that met a limit: REFUSED as a forwarding loop (loop) or over a client's forwards in flight (client), SERVFAIL over all forwards in flight (total), or waiting while every UDP handler was busy (handlers).
# TYPE tsng_dns_limited_total counter
tsng_dns_limited_total{limit="client",network="home"} 2
tsng_dns_limited_total{limit="handlers",network="home"} 4
tsng_dns_limited_total{limit="loop",network="home"} 1
tsng_dns_limited_total{limit="total",network="home"} 3
`), "tsng_dns_limited_total"); err != nil {
		t.Fatal(err)
	}
}

// TestDNSCloseEndsForwards: closing the servers ends a forward waiting on
// an upstream that never answers, instead of waiting out its timeout.
func TestDNSCloseEndsForwards(t *testing.T) {
	up := startSilentUpstream(t)
	own, err := vip.NewDNSServer(vip.DNSOptions{Domain: "home", Lookup: func(string) (netip.Addr, bool) { return netip.Addr{}, false }})
	if err != nil {
		t.Fatal(err)
	}
	h := newDNSHandler(own, vip.DNSOptions{Domain: "home"}, []netip.AddrPort{up, up}, discardLogger())
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	srvs, err := serveDNS(h, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp4", nil, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion("never.test.", dns.TypeA)
	b, _ := q.Pack()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for forwardsInFlight(h) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the query was never forwarded")
		}
		time.Sleep(time.Millisecond)
	}
	// Two upstreams that never answer: waited out, 2 × dnsForwardTimeout.
	start := time.Now()
	srvs.Close()
	if d := time.Since(start); d >= dnsForwardTimeout {
		t.Fatalf("Close took %v with a forward under way", d)
	}
	if n := forwardsInFlight(h); n != 0 {
		t.Fatalf("%d forwards in flight after Close", n)
	}
}
