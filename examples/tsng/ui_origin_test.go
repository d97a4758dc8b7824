package tsng

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// TestUIOtherLoopbackPorts: a browser that opened the editor's address
// carries nothing to other servers on 127.0.0.1 (cookies are not scoped
// by port), and a page on another loopback port cannot change anything
// with the simple requests it can send without a preflight.
func TestUIOtherLoopbackPorts(t *testing.T) {
	d, _ := uiDaemon(t)
	uiURL := d.UIURL()
	tok := d.ui.token

	// Another local server records everything it receives.
	var mu sync.Mutex
	var seen []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		for k, vs := range r.Header {
			seen = append(seen, k+": "+strings.Join(vs, ","))
		}
		seen = append(seen, r.URL.String())
	}))
	defer other.Close()

	// The browser, as a cookie jar: it opens the editor, then visits the
	// other port.
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar}
	resp, err := browser.Get(uiURL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("editor page: %d", resp.StatusCode)
	}
	if c := resp.Header.Values("Set-Cookie"); len(c) != 0 {
		t.Errorf("the editor sets cookies, which every loopback port receives: %q", c)
	}
	resp, err = browser.Get(other.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	for _, h := range seen {
		if strings.Contains(h, tok) {
			t.Errorf("another loopback port received the token: %q", h)
		}
	}
	mu.Unlock()

	// A page on the other port posts text/plain (no preflight), with what
	// the browser would attach: the jar's cookies, its Origin, and
	// Sec-Fetch-Site same-site (other ports of 127.0.0.1 are same-site).
	uiBase, _ := url.Parse(uiURL)
	post := func(what, ctype, origin, site string, token bool) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+uiBase.Host+"/api/v1/networks/home/vips", strings.NewReader(`{"name":"`+what+`"}`))
		req.Header.Set("Content-Type", ctype)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if site != "" {
			req.Header.Set("Sec-Fetch-Site", site)
		}
		if token {
			req.Header.Set(uiTokenHeader, tok)
		}
		resp, err := browser.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("%s: %d %.80s", what, resp.StatusCode, strings.TrimSpace(string(b)))
		return resp.StatusCode
	}
	reg := d.Runtime("home").Registry()
	exists := func(name string) bool { _, err := reg.Get(name); return err == nil }
	if code := post("evil", "text/plain", other.URL, "same-site", false); code < 400 || exists("evil") {
		t.Errorf("a cross-port text/plain POST was accepted (%d)", code)
	}
	// Even holding the token, a request that is not the page's own is
	// refused: wrong Origin, a cross-site fetch, or a non-JSON body.
	if code := post("evil2", "application/json", other.URL, "", true); code != http.StatusForbidden || exists("evil2") {
		t.Errorf("a foreign Origin was accepted (%d)", code)
	}
	if code := post("evil3", "application/json", "", "same-site", true); code != http.StatusForbidden || exists("evil3") {
		t.Errorf("Sec-Fetch-Site same-site was accepted (%d)", code)
	}
	if code := post("evil4", "text/plain", "http://"+uiBase.Host, "same-origin", true); code != http.StatusUnsupportedMediaType || exists("evil4") {
		t.Errorf("a text/plain mutation was accepted (%d)", code)
	}
	// The page's own request: same origin, JSON, the token as a header.
	if code := post("api", "application/json", "http://"+uiBase.Host, "same-origin", true); code != http.StatusCreated || !exists("api") {
		t.Errorf("the page's own request was refused (%d)", code)
	}
}
