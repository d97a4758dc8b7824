package tsng

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

//go:embed webui
var webui embed.FS

// UIServer serves the VIP editor: the embedded page and the local API
// under /api/, on a loopback address only. The page is public; the API
// answers holders of a per-start token. A browser gets the token by the
// sign-in hand-off (uihandoff.go): it posts a one-time code from the file
// that `tsng ui` writes to /handoff, and the answer stores the token in the
// editor origin's session storage (scoped to this origin, port included);
// the page sends it in the X-Tsng-Token header. The token is in no URL,
// and never a cookie: browsers send cookies to every port of a host.
//
// API requests must also be the page's own: a Host that is a loopback
// address (no DNS rebinding), Sec-Fetch-Site "same-origin" when the
// browser sends it, an Origin equal to the editor's when sent (other
// loopback ports are "same-site", not same-origin), and mutations only
// with an application/json body, which no page elsewhere can send without
// a CORS preflight this server never grants.
type UIServer struct {
	token string
	ho    uiHandoffs
	api   http.Handler
	files http.Handler
	ln    net.Listener
	srv   *http.Server
}

// uiTokenHeader carries the token on the page's API requests.
const uiTokenHeader = "X-Tsng-Token"

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
	lim := limitsOf(m, serverUI)
	u := &UIServer{token: hex.EncodeToString(tok), api: NewAPIServer(m), files: http.FileServerFS(sub), ln: lim.listen(ln, serverUI)}
	u.srv = lim.server(u)
	go func() { _ = u.srv.Serve(u.ln) }()
	return u, nil
}

// URL is the editor's address. It carries no secret: a browser signs in
// through the hand-off that `tsng ui` starts.
func (u *UIServer) URL() string {
	return fmt.Sprintf("http://%s/", u.ln.Addr())
}

// Close stops the server.
func (u *UIServer) Close() error { return u.srv.Close() }

func (u *UIServer) authorized(r *http.Request) bool {
	t := r.Header.Get(uiTokenHeader)
	return t != "" && subtle.ConstantTimeCompare([]byte(t), []byte(u.token)) == 1
}

// sameOrigin reports whether origin is the editor's own.
func (u *UIServer) sameOrigin(origin string) bool {
	_, port, _ := net.SplitHostPort(u.ln.Addr().String())
	return origin == "http://"+u.ln.Addr().String() || origin == "http://localhost:"+port
}

// ServeHTTP implements http.Handler.
func (u *UIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !localHost(r, false) {
		http.Error(w, "tsng ui: loopback only", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if r.URL.Path == uiHandoffPath {
		u.serveHandoff(w, r)
		return
	}
	rest, isAPI := strings.CutPrefix(r.URL.Path, "/api/")
	if !isAPI {
		w.Header().Set("Cache-Control", "no-store")
		u.files.ServeHTTP(w, r)
		return
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		http.Error(w, "tsng ui: only the editor's own page may call its API (Sec-Fetch-Site "+site+")", http.StatusForbidden)
		return
	}
	if o := r.Header.Get("Origin"); o != "" && !u.sameOrigin(o) {
		http.Error(w, "tsng ui: only the editor's own page may call its API (Origin "+o+")", http.StatusForbidden)
		return
	}
	if !u.authorized(r) {
		http.Error(w, "tsng ui: not signed in: run `tsng ui` on this machine (it opens the editor signed in)", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			http.Error(w, "tsng ui: changes take an application/json body", http.StatusUnsupportedMediaType)
			return
		}
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + rest
	u.api.ServeHTTP(w, r2)
}

// uiInfo is the body of GET /v1/ui on the local API.
type uiInfo struct {
	URL string `json:"url"`
}
