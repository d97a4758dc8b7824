package tsng

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/vipkit/vipkit/vip"
)

// Forwarder is a Manager that can forward a loopback port to a VIP.
type Forwarder interface {
	Forward(ctx context.Context, network string, req ForwardRequest) (ForwardDoc, <-chan struct{}, error)
}

// Forward implements Forwarder.
func (d *Daemon) Forward(ctx context.Context, network string, req ForwardRequest) (ForwardDoc, <-chan struct{}, error) {
	for _, n := range d.nets {
		if n.api.Name == network || n.api.ID == network {
			return n.forward(ctx, req)
		}
	}
	return ForwardDoc{}, nil, fmt.Errorf("%w: network %q", vip.ErrNotFound, network)
}

// forward serves POST /v1/networks/{net}/forward: the answer's first line
// is a ForwardDoc, and the forward lasts as long as the request.
func (s *APIServer) forward(w http.ResponseWriter, r *http.Request) {
	n, err := s.network(r.PathValue("net"))
	if err != nil {
		writeErr(w, err)
		return
	}
	var req ForwardRequest
	if err := s.decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	fw, ok := s.m.(Forwarder)
	if !ok {
		writeErr(w, &APIError{Code: CodeInvalid, Message: "tsng: this agent does not forward ports"})
		return
	}
	doc, done, err := fw.Forward(r.Context(), n.Name, req)
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(doc)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	select {
	case <-done:
	case <-r.Context().Done():
		<-done
	}
}

func forwardCommand() *command {
	return &command{name: "forward", args: "NET VIP PROTO/PORT [--listen 127.0.0.1:PORT]", min: 3, max: 3,
		short: "Forward a local port to a VIP's listener (netstack mode), until interrupted.",
		long:  "For applications that speak no proxy: TCP connections or UDP datagrams to the local port reach the VIP through the agent. The agent listens (on loopback only) while this command runs.",
		flags: func(fs *flag.FlagSet, o *opts) {
			fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "local loopback `IP:port` to listen on (port 0: any free one)")
		},
		run: runForward}
}

func runForward(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	b, _ := json.Marshal(ForwardRequest{VIP: a[1], Listener: a[2], Listen: o.listen})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://tsng/v1/networks/"+url.PathEscape(a[0])+"/forward", strings.NewReader(string(b)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	// No client timeout: the answer lasts as long as the forward.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", c.client.Socket)
	}}}
	defer hc.CloseIdleConnections()
	c.client.announce()
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%w at %s: %v (is `tsng daemon` running?)", ErrAgentUnreachable, c.client.Socket, err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if resp.StatusCode >= 300 {
		data, _ := io.ReadAll(io.LimitReader(rd, 1<<20))
		var ae APIError
		if json.Unmarshal(data, &ae) == nil && ae.Code != "" {
			return &ae
		}
		return fmt.Errorf("tsng: agent answered %s", resp.Status)
	}
	line, err := rd.ReadBytes('\n')
	var doc ForwardDoc
	if err != nil || json.Unmarshal(line, &doc) != nil {
		return fmt.Errorf("tsng: forward: unreadable answer: %v", err)
	}
	fmt.Fprintf(c.env.Stdout, "forwarding %s → %s.%s %s (until interrupted)\n", doc.Listen, doc.VIP, doc.Network, doc.Listener)
	if f, ok := c.env.Stdout.(interface{ Sync() error }); ok {
		f.Sync()
	}
	io.Copy(io.Discard, rd)
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("tsng: the agent ended the forward (network stopped or agent exiting)")
}
