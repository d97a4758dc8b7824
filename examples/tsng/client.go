package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/vipkit/vipkit/internal/jsonx"
)

// ErrAgentUnreachable means the CLI could not reach the agent's local API.
var ErrAgentUnreachable = errors.New("tsng: agent not reachable")

// Client talks to an agent's local API over its Unix socket.
type Client struct {
	Socket string
	hc     *http.Client
	// notice, if set, runs once before the first request: the CLI's note
	// on how it found (or could not find) the socket.
	notice     func()
	noticeOnce sync.Once
}

// announce runs c's notice the first time it is called.
func (c *Client) announce() {
	if c.notice != nil {
		c.noticeOnce.Do(c.notice)
	}
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client {
	return &Client{Socket: socket, hc: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}}
}

// Do sends one request and decodes a JSON answer into out (if not nil). An
// API error comes back as *APIError.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://tsng"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.announce()
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s: %v (is `tsng daemon` running?)", ErrAgentUnreachable, c.Socket, err)
	}
	defer resp.Body.Close()
	data, err := jsonx.ReadAll(resp.Body, 16<<20)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var ae APIError
		if json.Unmarshal(data, &ae) == nil && ae.Code != "" {
			return &ae
		}
		return fmt.Errorf("tsng: agent answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

func vipPath(network, sel string) string {
	return "/v1/networks/" + url.PathEscape(network) + "/vips/" + url.PathEscape(sel)
}
