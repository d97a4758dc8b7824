package tsng

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

//go:embed webui
var webui embed.FS

// UIServer serves the VIP editor: the embedded page and the local API
// under /api/, on a loopback address only, to holders of a per-start
// token. The token arrives in the URL that `tsng ui` prints; the first page
// load turns it into a strict same-site cookie, so the page's own requests
// carry it. Requests whose Host is not a loopback address are refused (no
// DNS rebinding).
type UIServer struct {
	token string
	api   http.Handler
	files http.Handler
	ln    net.Listener
	srv   *http.Server
}

const uiCookie = "tsng_ui"

// NewUIServer listens on addr ("127.0.0.1:0" when empty; a non-loopback
// address is refused) and serves m's API behind a fresh token.
func NewUIServer(m Manager, addr string) (*UIServer, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("%w: ui address %q: want a loopback IP:port", ErrConfig, addr)
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(webui, "webui")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tsng: ui: %w", err)
	}
	u := &UIServer{token: hex.EncodeToString(tok), api: NewAPIServer(m), files: http.FileServerFS(sub), ln: ln}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

// URL is the editor's address with the token.
func (u *UIServer) URL() string {
	return fmt.Sprintf("http://%s/?token=%s", u.ln.Addr(), u.token)
}

// Close stops the server.
func (u *UIServer) Close() error { return u.srv.Close() }

func (u *UIServer) authorized(r *http.Request) bool {
	if t := r.URL.Query().Get("token"); t != "" {
		return subtle.ConstantTimeCompare([]byte(t), []byte(u.token)) == 1
	}
	if c, err := r.Cookie(uiCookie); err == nil {
		return subtle.ConstantTimeCompare([]byte(c.Value), []byte(u.token)) == 1
	}
	return false
}

// ServeHTTP implements http.Handler.
func (u *UIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if a, err := netip.ParseAddr(host); (err != nil && host != "localhost") || (err == nil && !a.IsLoopback()) {
		http.Error(w, "tsng ui: loopback only", http.StatusForbidden)
		return
	}
	if !u.authorized(r) {
		http.Error(w, "tsng ui: open the address that `tsng ui` prints (it carries this start's token)", http.StatusUnauthorized)
		return
	}
	if r.URL.Query().Get("token") != "" {
		http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: u.token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if rest, ok := strings.CutPrefix(r.URL.Path, "/api"); ok {
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		u.api.ServeHTTP(w, r2)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	u.files.ServeHTTP(w, r)
}

// uiInfo is the body of GET /v1/ui on the local API.
type uiInfo struct {
	URL string `json:"url"`
}

// runUI asks the agent for the editor's address and prints it (and opens a
// browser when asked and one is available).
func runUI(ctx context.Context, c *cliCtx, open bool) error {
	var info uiInfo
	if err := c.client.Do(ctx, http.MethodGet, "/v1/ui", nil, &info); err != nil {
		return err
	}
	fmt.Fprintln(c.env.Stdout, info.URL)
	if open && c.env.OpenBrowser != nil {
		return c.env.OpenBrowser(info.URL)
	}
	return nil
}
