//go:build linux

package tsng_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/transport/netns"
)

// The clients of TestE2ETUN: programs that run in the client's namespace
// as this test binary re-executed with `ip netns exec` (so that they
// resolve names through the agent's DNS), each with the parent side that
// starts it and reads its report.

// e2eChildEnv names the client to run in a re-executed test binary.
const e2eChildEnv = "TSNG_E2E_CHILD"

// init runs a client instead of the tests when the test binary was
// re-executed as one. (TestMain belongs to main_test.go; a client needs none
// of it.)
func init() {
	mode := os.Getenv(e2eChildEnv)
	if mode == "" {
		return
	}
	args := os.Args[1:]
	if i := slices.Index(args, "--"); i >= 0 {
		args = args[i+1:]
	}
	var err error
	switch mode {
	case "http":
		err = e2eHTTPClient(args, os.Stdout)
	case "udp":
		err = e2eUDPClient(args, os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown client %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e client:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// inNamespace is the argv that runs this test binary as client mode in n's
// namespace through `ip netns exec` (which mounts its resolv.conf).
func inNamespace(t *testing.T, n *e2eNode, args ...string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"ip", "netns", "exec", n.host.Name(), exe, "-test.run=^$", "--"}, args...)
}

type httpReply struct {
	node string
	peer netip.AddrPort
}

type httpResult struct {
	resolved        string
	replies         []httpReply
	errors          []string
	firstWant       int // index in replies of the first reply from -want; -1
	firstWantMillis int64
}

func (r httpResult) summary() string {
	count := map[string]int{}
	for _, x := range r.replies {
		count[x.node]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, count[k]))
	}
	return strings.Join(parts, ", ")
}

// runHTTPClient runs the HTTP client in cl's namespace and parses its
// report.
func runHTTPClient(ctx context.Context, t *testing.T, cl *e2eNode, port uint16, args ...string) httpResult {
	t.Helper()
	argv := inNamespace(t, cl, append([]string{"-url", fmt.Sprintf("http://api.%s:%d/", e2eNet, port),
		"-attempt", attemptTimeout.String()}, args...)...)
	p, err := cl.host.Start(ctx, argv, netns.ProcOptions{Env: []string{e2eChildEnv + "=http"}})
	if err != nil {
		t.Fatal(err)
	}
	werr := p.Wait(ctx)
	out, _ := p.Output()
	if werr != nil {
		t.Fatalf("HTTP client: %v\n%s", werr, out)
	}
	res := httpResult{firstWant: -1}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "resolved":
			res.resolved = f[1]
		case len(f) == 4 && f[0] == "reply":
			ap, err := netip.ParseAddrPort(f[3])
			if err != nil {
				t.Fatalf("HTTP client: bad reply line %q", sc.Text())
			}
			res.replies = append(res.replies, httpReply{node: f[2], peer: ap})
		case len(f) >= 2 && f[0] == "error":
			res.errors = append(res.errors, strings.Join(f[2:], " "))
		case len(f) == 3 && f[0] == "want":
			res.firstWant = len(res.replies) - 1
			res.firstWantMillis, _ = strconv.ParseInt(f[2], 10, 64)
		}
	}
	t.Logf("HTTP client output:\n%s", out)
	return res
}

// e2eHTTPClient makes new HTTP connections (no keep-alive) to -url, one at
// a time, and prints, one line each:
//
//	resolved ADDR          the name's address, from the namespace's resolver
//	reply MS NODE PEER     an answer, MS after -since
//	error MS ERROR         a failed attempt
//	want NODE MS           the first answer from -want
//
// Without -want it makes -n attempts; with -want, it tries until an answer
// comes from that node (or -deadline) and then makes -n-1 more attempts.
func e2eHTTPClient(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	rawURL := fs.String("url", "", "URL")
	n := fs.Int("n", 1, "attempts (after the first answer from -want)")
	want := fs.String("want", "", "node to wait for")
	deadline := fs.Duration("deadline", 30*time.Second, "give up waiting for -want after")
	attempt := fs.Duration("attempt", 2*time.Second, "timeout of one attempt")
	since := fs.Int64("since", 0, "report times from this Unix time in ns (0: now)")
	big := fs.Int("big", 0, "instead, download and upload this many bytes per attempt (two replies)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t0 := time.Now()
	if *since != 0 {
		t0 = time.Unix(0, *since)
	}
	ms := func() int64 { return time.Since(t0).Milliseconds() }
	ctx, cancel := context.WithTimeout(context.Background(), *deadline)
	defer cancel()
	host := strings.TrimSuffix(strings.TrimPrefix(*rawURL, "http://"), "/")
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		return err
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", name, err)
	}
	fmt.Fprintln(out, "resolved", strings.Join(addrs, ","))
	left := *n
	found := *want == ""
	for left > 0 {
		if ctx.Err() != nil {
			return fmt.Errorf("no answer from %s within %v", *want, *deadline)
		}
		tr := &http.Transport{DisableKeepAlives: true}
		hc := &http.Client{Transport: tr, Timeout: *attempt}
		if *big > 0 {
			who, err := bigExchange(hc, *rawURL, *big)
			tr.CloseIdleConnections()
			if err != nil {
				fmt.Fprintln(out, "error", ms(), strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				for _, w := range who {
					fmt.Fprintln(out, "reply", ms(), w)
				}
			}
			left--
			continue
		}
		resp, err := hc.Get(*rawURL)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %s", resp.Status)
			}
		}
		tr.CloseIdleConnections()
		if err != nil {
			fmt.Fprintln(out, "error", ms(), strings.ReplaceAll(err.Error(), "\n", " "))
			if found {
				left--
			}
			continue
		}
		f := strings.Fields(string(body))
		if len(f) != 2 {
			return fmt.Errorf("unexpected answer %q", body)
		}
		fmt.Fprintln(out, "reply", ms(), f[0], f[1])
		if !found && f[0] == *want {
			found = true
			fmt.Fprintln(out, "want", f[0], ms())
		}
		if found {
			left--
		}
	}
	return nil
}

// udpResult is one datagram's outcome at the UDP client.
type udpResult struct {
	kind string // reply, refused, timeout, error
	node string
	text string
}

// udpClient drives the UDP client in the client's namespace over its
// stdin and stdout.
type udpClient struct {
	p     *netns.Process
	in    *io.PipeWriter
	lines chan string
}

func startUDPClient(ctx context.Context, t *testing.T, cl *e2eNode, addr string) *udpClient {
	t.Helper()
	pr, pw := io.Pipe()
	u := &udpClient{in: pw, lines: make(chan string, 256)}
	lw := &lineWriter{f: func(s string) {
		select {
		case u.lines <- s:
		default:
		}
	}}
	p, err := cl.host.Start(ctx, inNamespace(t, cl, "-addr", addr), netns.ProcOptions{Env: []string{e2eChildEnv + "=udp"}, Stdin: pr, Output: lw})
	if err != nil {
		t.Fatal(err)
	}
	u.p = p
	t.Cleanup(func() {
		pw.Close()
		_ = p.Kill()
	})
	if l := u.next(ctx, t); !strings.HasPrefix(l, "ready ") {
		t.Fatalf("UDP client: %q", l)
	}
	return u
}

func (u *udpClient) next(ctx context.Context, t *testing.T) string {
	t.Helper()
	select {
	case l := <-u.lines:
		return l
	case <-u.p.Done():
		out, _ := u.p.Output()
		t.Fatalf("UDP client exited: %v\n%s", u.p.ExitCode(), out)
	case <-time.After(10 * time.Second):
		t.Fatalf("UDP client: no answer")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return ""
}

func (u *udpClient) send(ctx context.Context, t *testing.T, msg string) udpResult {
	t.Helper()
	if _, err := fmt.Fprintf(u.in, "send %s\n", msg); err != nil {
		t.Fatalf("UDP client: %v", err)
	}
	l := u.next(ctx, t)
	t.Logf("UDP %s → %s", msg, l)
	f := strings.Fields(l)
	switch {
	case len(f) == 4 && f[0] == "reply" && f[3] == msg:
		return udpResult{kind: "reply", node: f[1], text: l}
	case len(f) >= 1 && (f[0] == "refused" || f[0] == "timeout"):
		return udpResult{kind: f[0], text: l}
	}
	return udpResult{kind: "error", text: l}
}

func (u *udpClient) close(t *testing.T) {
	u.in.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := u.p.Wait(ctx); err != nil {
		out, _ := u.p.Output()
		t.Errorf("UDP client: %v\n%s", err, out)
	}
}

// lineWriter calls f with each whole line written to it.
type lineWriter struct {
	// mu guards buf, a partial line, and serialises the calls to f.
	mu sync.Mutex
	// +checklocks:mu
	buf []byte
	// +checklocks:mu
	f func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.f(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// e2eUDPClient resolves -addr, connects one UDP socket to it (one source
// port: one session), prints "ready LOCAL REMOTE", and for each "send MSG"
// line on in sends MSG and prints what came back within 1.5 s:
//
//	reply NODE PEER MSG   the backend's answer
//	refused               ECONNREFUSED: an ICMP port unreachable arrived
//	timeout               nothing
func e2eUDPClient(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("udp", flag.ContinueOnError)
	addr := fs.String("addr", "", "HOST:PORT")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp4", *addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintln(out, "ready", c.LocalAddr(), c.RemoteAddr())
	sc := bufio.NewScanner(in)
	buf := make([]byte, 2048)
	for sc.Scan() {
		msg, ok := strings.CutPrefix(sc.Text(), "send ")
		if !ok {
			return fmt.Errorf("bad command %q", sc.Text())
		}
		if _, err := c.Write([]byte(msg)); err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				fmt.Fprintln(out, "refused on send")
				continue
			}
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		k, err := c.Read(buf)
		switch {
		case err == nil:
			fmt.Fprintln(out, "reply", string(buf[:k]))
		case errors.Is(err, syscall.ECONNREFUSED):
			fmt.Fprintln(out, "refused")
		case errors.Is(err, os.ErrDeadlineExceeded):
			fmt.Fprintln(out, "timeout")
		default:
			fmt.Fprintln(out, "error", err)
		}
	}
	return sc.Err()
}

// maxBig bounds the bulk transfers (bytes).
const maxBig = 64 << 20

// e2ePattern returns n bytes in which a lost, duplicated or misplaced
// segment shows.
func e2ePattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ byte(i>>9) ^ byte(i>>17)
	}
	return b
}

// bigExchange downloads and uploads size bytes through url (GET and POST
// /big on fresh connections) and checks both; it returns the backend that
// served each.
func bigExchange(hc *http.Client, url string, size int) ([2]string, error) {
	var who [2]string
	want := e2ePattern(size)
	resp, err := hc.Get(fmt.Sprintf("%sbig?n=%d", url, size))
	if err != nil {
		return who, err
	}
	got, err := io.ReadAll(io.LimitReader(resp.Body, maxBig+1))
	resp.Body.Close()
	if err != nil {
		return who, fmt.Errorf("download: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
		return who, fmt.Errorf("download: status %s, %d bytes, want %d bytes of the pattern (first difference at %d)", resp.Status, len(got), size, firstDiff(got, want))
	}
	who[0] = resp.Header.Get("X-Backend")
	resp, err = hc.Post(url+"big", "application/octet-stream", bytes.NewReader(want))
	if err != nil {
		return who, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	if err != nil {
		return who, fmt.Errorf("upload: %w", err)
	}
	sum := sha256.Sum256(want)
	if exp := fmt.Sprintf("%d %x\n", size, sum); resp.StatusCode != http.StatusOK || string(body) != exp {
		return who, fmt.Errorf("upload: status %s, backend got %q, want %q", resp.Status, body, exp)
	}
	who[1] = resp.Header.Get("X-Backend")
	return who, nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
