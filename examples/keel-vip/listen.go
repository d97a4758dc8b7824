package keelvip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/jsonx"
)

// ListenerConfig is all the members' listener is given: its node id, the
// overlay address and port it listens on, and the run directory of the
// helper's members.sock. It holds no key: the listener is the one
// network-facing process, and a compromise of it must not yield the
// node's WireGuard or signing keys. Mesh.ListenerConfig makes it; the
// helper hands it over on stdin (spawn mode) or writes it, root's and
// 0644, as RunDir/listen.json (systemd's split).
type ListenerConfig struct {
	Node   string     `json:"node"`
	Addr   netip.Addr `json:"addr"`
	Port   uint16     `json:"port"`
	RunDir string     `json:"run_dir"`
}

// listenConfigName is the listener's configuration in the run directory.
const listenConfigName = "listen.json"

// ListenerConfig returns the JSON of the listener's configuration.
func (m *Mesh) ListenerConfig() []byte {
	b, _ := json.Marshal(ListenerConfig{Node: m.Self.ID, Addr: m.Self.Addr, Port: m.MembersPort, RunDir: m.RunDir})
	return b
}

// ParseListenerConfig parses and checks a ListenerConfig (unknown fields,
// such as a mesh file's keys, are refused).
func ParseListenerConfig(r io.Reader) (*ListenerConfig, error) {
	b, err := jsonx.ReadAll(r, 4096)
	if err != nil {
		return nil, fmt.Errorf("keelvip: listener config: %w", err)
	}
	var c ListenerConfig
	if err := decodeStrict(b, &c); err != nil {
		return nil, fmt.Errorf("keelvip: listener config: %w", err)
	}
	if !c.Addr.IsValid() || c.Port == 0 || !filepath.IsAbs(c.RunDir) || c.Node == "" {
		return nil, fmt.Errorf("%w: listener config %+v: want node, addr, port and an absolute run_dir", ErrMesh, c)
	}
	return &c, nil
}

// RunListener is `keel-vip listen`, the members' channel's network-facing
// side: an unprivileged process with no capabilities that listens on the
// node's overlay address and forwards each POST /v1/vip, with the sender's
// address, to the root helper over members.sock. It parses nothing: the
// helper verifies claims and releases, and the controller acts on them.
// It reads its ListenerConfig from in.
func RunListener(ctx context.Context, in io.Reader, logw io.Writer) error {
	cfg, err := ParseListenerConfig(in)
	if err != nil {
		return err
	}
	m := &Mesh{Self: Node{ID: cfg.Node, Addr: cfg.Addr}, MembersPort: cfg.Port, RunDir: cfg.RunDir}
	log := newLog(logw, m.Self.ID, "listener")
	hc := unixHTTP(filepath.Join(membersDir(m), "members.sock"), nil, 60*time.Second)
	addr := net.JoinHostPort(m.Self.Addr.String(), strconv.Itoa(int(m.MembersPort)))
	var l net.Listener
	for {
		// The overlay address may still be tentative for a moment.
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	h := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != claim.MembersPath || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			jsonx.Write(w, http.StatusBadRequest, errorReply{Error: "sender: " + err.Error()})
			return
		}
		body, ok := readBody(w, r, claim.MaxRequestBody)
		if !ok {
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://helper"+claim.MembersPath, bytesReader(body))
		if err != nil {
			writeErr(w, err)
			return
		}
		req.Header.Set(fromHeader, ap.Addr().Unmap().String())
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			log.Warn("forward", "err", err)
			jsonx.Write(w, http.StatusServiceUnavailable, errorReply{Error: "helper unavailable"})
			return
		}
		defer resp.Body.Close()
		log.Debug("forwarded", "from", ap.Addr().Unmap(), "status", resp.StatusCode)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, claim.MaxResponseBody))
	}
	srv := claim.NewServer().HTTPServer(addr)
	srv.Handler = http.HandlerFunc(h)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	log.Info("members' channel listening", "addr", addr)
	select {
	case <-ctx.Done():
	case err = <-done:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
