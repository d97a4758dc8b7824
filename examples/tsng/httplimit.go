package tsng

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/transport"
)

// The agent's local HTTP servers, as named in limits and metrics.
const (
	serverAPI       = "api"
	serverUI        = "ui"
	serverMetrics   = "metrics"
	serverHTTPProxy = "http-proxy"
)

// httpLimits are the bounds of one of the agent's local HTTP servers. Any
// local user can open connections to the loopback ones; without these an
// idle keep-alive connection is held, with its goroutine, for ever.
//
// The timeouts bound the request phase: read, write and header timeouts
// are net/http's, and the read timeout ends once the request's body is
// read (requestPhase), so a request that lasts as long as its client
// wants (a `vip forward`) is not cut. A CONNECT tunnel or a forwarded
// request of the HTTP proxy runs under tunnelIdle instead.
type httpLimits struct {
	// readHeader bounds the arrival of a request's headers.
	readHeader time.Duration
	// read bounds the arrival of the whole request, body included; 0:
	// none.
	read time.Duration
	// write bounds writing the answer, from the end of the request's
	// headers; 0: none.
	write time.Duration
	// idle is how long a keep-alive connection waits for its next request.
	idle time.Duration
	// maxConns is how many connections may be open at once; the server
	// closes more at once, counts and logs them.
	maxConns int
	// tunnelIdle (HTTP proxy only) closes a CONNECT tunnel or a forwarded
	// request in which no byte has flowed either way for that long.
	tunnelIdle time.Duration
	// clock times tunnelIdle (RealClock when nil).
	clock transport.Clock
	// log reports refused connections (discarded when nil).
	log *slog.Logger
}

// Default limits of the local HTTP servers; docs/defaults.md lists them.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpReadTimeout       = 30 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpIdleTimeout       = 60 * time.Second
	httpMaxConns          = 64
	httpProxyMaxConns     = 256
	httpProxyTunnelIdle   = time.Hour
	httpProxyDialTimeout  = 10 * time.Second
)

// defaultHTTPLimits returns the limits server has unless a test sets
// others (DaemonOptions.httpLimits).
func defaultHTTPLimits(server string) httpLimits {
	l := httpLimits{readHeader: httpReadHeaderTimeout, read: httpReadTimeout, write: httpWriteTimeout,
		idle: httpIdleTimeout, maxConns: httpMaxConns}
	switch server {
	case serverAPI:
		// A `vip forward` answers its first line, then lasts as long as
		// the request. The socket is the owner's alone and the answers
		// are small, so no write timeout.
		l.write = 0
	case serverHTTPProxy:
		l.maxConns, l.tunnelIdle = httpProxyMaxConns, httpProxyTunnelIdle
	}
	return l
}

// httpLimitsFor returns the limits of the daemon's server.
func (d *Daemon) httpLimitsFor(server string) httpLimits {
	l, ok := d.o.httpLimits[server]
	if !ok {
		l = defaultHTTPLimits(server)
	}
	if l.log == nil {
		l.log = d.log.With("part", server)
	}
	return l
}

// limitsOf returns the limits of server in m's agent, or the defaults
// when m is not a Daemon.
func limitsOf(m Manager, server string) httpLimits {
	if d, ok := m.(*Daemon); ok {
		return d.httpLimitsFor(server)
	}
	return defaultHTTPLimits(server)
}

// server returns an http.Server for h with l's timeouts. Serve it on
// l.listen's listener.
func (l httpLimits) server(h http.Handler) *http.Server {
	return &http.Server{Handler: requestPhase(h), ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read,
		WriteTimeout: l.write, IdleTimeout: l.idle, ErrorLog: slog.NewLogLogger(l.logger().Handler(), slog.LevelDebug)}
}

func (l httpLimits) logger() *slog.Logger {
	if l.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.log
}

// listen wraps ln so that at most l.maxConns of its connections are open
// at once.
func (l httpLimits) listen(ln net.Listener, server string) *connLimiter {
	return &connLimiter{Listener: ln, server: server, max: int64(l.maxConns), log: l.logger()}
}

// requestPhase ends the server's read timeout once the request has been
// read: for a request without a body when the handler starts, otherwise
// when its body reaches its end. Without this, net/http's read of the
// connection in the background during the handler fails at the deadline
// and cancels the request's context, which would end a long request such
// as a `vip forward`.
func requestPhase(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body == nil || r.Body == http.NoBody {
			_ = rc.SetReadDeadline(time.Time{})
		} else {
			r.Body = &phaseBody{ReadCloser: r.Body, done: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		}
		h.ServeHTTP(w, r)
	})
}

// phaseBody calls done when the body has been read to its end.
type phaseBody struct {
	io.ReadCloser
	done func()
	once sync.Once
}

// Read implements io.Reader.
func (b *phaseBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.done)
	}
	return n, err
}

// connLimiter is a listener that has at most max connections open at
// once. A connection beyond that is answered 503 and closed at once,
// counted and logged, rather than left waiting in the kernel's queue as
// netutil.LimitListener does: a waiting client learns nothing and the
// queue fills for everyone, while a refusal tells the client what
// happened and frees the slot at once.
type connLimiter struct {
	net.Listener
	server string
	max    int64
	log    *slog.Logger
	// open counts the connections accepted and not yet closed; peak is
	// its highest value.
	open    atomic.Int64
	peak    atomic.Int64
	refused atomic.Uint64
	// lastLog is when a refusal was last logged (UnixNano).
	lastLog atomic.Int64
}

// refusalLogEvery spaces the log lines of refused connections.
const refusalLogEvery = 10 * time.Second

// Accept implements net.Listener: it returns the next connection within
// the cap, refusing those beyond it.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		if n <= l.max {
			for {
				p := l.peak.Load()
				if n <= p || l.peak.CompareAndSwap(p, n) {
					break
				}
			}
			return &limitedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.refuse(c)
	}
}

func (l *connLimiter) refuse(c net.Conn) {
	total := l.refused.Add(1)
	msg := fmt.Sprintf("tsng %s: too many connections (limit %d); try again later\n", l.server, l.max)
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
	c.Close()
	now := time.Now().UnixNano()
	if last := l.lastLog.Load(); now-last >= int64(refusalLogEvery) && l.lastLog.CompareAndSwap(last, now) {
		l.log.Warn("connection refused: too many connections open", "server", l.server, "limit", l.max, "refused_total", total)
	}
}

// limitedConn gives its slot back to its connLimiter when closed.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

// Close implements net.Conn.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// CloseWrite half-closes the connection (a tunnel's relay passes a
// half-close on).
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// localHost reports whether r's Host is one that only a local client, or
// one that addressed the agent by IP address, sends: an IP address (a
// loopback one unless anyIP) or localhost. Any other name is what a page
// sends after rebinding its own name to the agent's address (DNS
// rebinding), so the editor and metrics refuse it.
func localHost(r *http.Request, anyIP bool) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if err != nil {
		return host == "localhost"
	}
	return anyIP || a.IsLoopback()
}
