package tsng

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// uiDaemon starts a one-node agent (netstack mode) with its editor and
// local API, and a second configured member that never comes up.
func uiDaemon(t *testing.T) (*Daemon, *apiFixture) {
	dir := socketDir(t, "tsngui")
	seed := make([]byte, 32)
	seed[0] = 3
	peerSeed := make([]byte, 32)
	peerSeed[0] = 4
	cfg := &Config{DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "api.sock"),
		Networks: []NetworkConfig{{Name: "home", Overlay: "100.80.0.0/24", DNSPort: 5353,
			Node: NodeConfig{Name: "server1", Address: "100.80.0.1", IdentityKey: base64.StdEncoding.EncodeToString(seed), WireGuardKey: wg.GeneratePrivateKey()},
			Peers: []PeerConfig{{Name: "server2", Address: "100.80.0.2", Identity: hexOf(ed25519.NewKeyFromSeed(peerSeed).Public().(ed25519.PublicKey)),
				WireGuardKey: wg.GeneratePrivateKey().PublicKey()}}}}}
	d, err := NewDaemon(context.Background(), cfg, DaemonOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, &apiFixture{t: t, socket: cfg.Socket}
}

// browser starts Debian's headless Chromium for chromedp.
func browser(t *testing.T) context.Context {
	path := testenv.NeedBinary(t, "chromium", "/usr/lib/chromium")
	prof := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.UserDataDir(prof),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.NoFirstRun,
		chromedp.WindowSize(1280, 1000))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelC := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelC(); cancelB(); cancelA() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// void drops an action's value.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}

// setInput sets an input's value and fires the event the page listens to.
func setInput(sel, value string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q; e.dispatchEvent(new Event(e.tagName === "SELECT" ? "change" : "input", {bubbles: true})); return true })()`, sel, value)))
}

// waitJS polls a JavaScript condition until it is true (10 s).
func waitJS(cond string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(15*time.Second)))
}

func TestWebEditor(t *testing.T) {
	ctx := browser(t)
	d, f := uiDaemon(t)
	reg := d.Runtime("home").Registry()
	url := d.UIURL()
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.ContainsAny(url, "?#") {
		t.Fatalf("editor URL %q: want loopback, with nothing after the path", url)
	}
	// `tsng ui` prints that address and has the browser open its sign-in
	// page; the browser ends on the editor, signed in, with no secret in
	// its address or its history.
	opened := 0
	code, out, errs := f.run(&Env{OpenBrowser: func(path string) error {
		opened++
		return chromedp.Do(ctx, chromedp.Navigate("file://"+path))
	}}, "ui")
	if code != 0 || out != url+"\n" || opened != 1 {
		t.Fatalf("tsng ui: exit %d, opened %d, printed %q%q, want %q", code, opened, out, errs, url)
	}
	if err := chromedp.Do(ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		return chromedp.Void{}, waitSignedIn(ctx, tg, url)
	}); err != nil {
		t.Fatal(err)
	}
	hist, err := chromedp.Run(ctx, chromedp.NavigationEntries())
	if err != nil {
		t.Fatal(err)
	}
	href, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("signed in at %s; history:", href)
	urls := []string{href}
	for _, e := range hist.Entries {
		urls = append(urls, e.URL)
	}
	for _, u := range urls {
		t.Logf("  %s", u)
		if strings.Contains(u, d.ui.token) || strings.Contains(u, "token") || strings.Contains(u, "code") || strings.Contains(u, "/handoff") {
			t.Errorf("the browser's address or history holds a secret or the sign-in: %s", u)
		}
	}
	if cur := hist.Entries[hist.CurrentIndex].URL; strings.Split(href, "#")[0] != url || strings.Split(cur, "#")[0] != url {
		t.Errorf("the browser is at %s (history: %s), want %s", href, cur, url)
	}
	if st := d.ui.HandoffStats(); st.Issued != 1 || st.SignedIn != 1 {
		t.Errorf("sign-ins: %+v, want one issued and used", st)
	}
	// Without the token there is no access.
	resp, err := http.Get(url + "api/v1/networks")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", resp.StatusCode)
	}

	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	get := func() vip.ServiceView {
		t.Helper()
		v, err := reg.Get("api")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// Network page, then a new VIP with two listeners, saved.
	run("open the network page", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("#vip-table")))
	run("create", chromedp.SendKeys(chromedp.CSS("#new-name"), "api"), chromedp.Click(chromedp.CSS("#create")), chromedp.WaitVisible(chromedp.CSS("#vip-name")))
	run("two listeners as a draft",
		chromedp.Click(chromedp.CSS("#add-listener")), chromedp.Click(chromedp.CSS("#add-listener")),
		setInput(`.listener[data-listener="0"] .port`, "8080"),
		setInput(`.listener[data-listener="1"] .proto`, "udp"),
		setInput(`.listener[data-listener="1"] .port`, "53"),
		chromedp.Click(chromedp.CSS(`.listener[data-listener="0"] .add-backend`)),
		setInput(`.listener[data-listener="0"] .backend-port`, "8080"),
		chromedp.Click(chromedp.CSS(`.listener[data-listener="1"] .add-backend`)),
		setInput(`.listener[data-listener="1"] .backend-node`, nodeID(reg, "server2")),
		setInput(`.listener[data-listener="1"] .backend-port`, "5353"),
		setInput(`.listener[data-listener="0"] .check-interval`, "1000"),
		setInput(`.listener[data-listener="0"] .check-timeout`, "500"))
	if n := len(reg.List()); n != 0 {
		t.Fatalf("a New VIP draft reached the configuration: %d services before Save", n)
	}
	run("save", chromedp.Click(chromedp.CSS("#save")), waitJS(`document.querySelector("#dirty").textContent === ""`))
	v := get()
	if len(v.Listeners) != 2 {
		t.Fatalf("saved %d listeners, want 2: %+v", len(v.Listeners), v.Listeners)
	}
	tcp, _ := v.Listener(vip.PortKey{Proto: vip.TCP, Port: 8080})
	if len(tcp.Backends) != 1 || tcp.Check.Interval != vip.Duration(time.Second) {
		t.Fatalf("tcp/8080 saved as %+v", tcp)
	}

	// Live status changes while a draft is dirty: the backend's port starts
	// listening, its health turns ok, and the draft is untouched.
	// server1 is in netstack mode and its backend_ports does not list 8080:
	// its own status names that as the failure.
	run("status shows the failing check", waitJS(`[...document.querySelectorAll("#status-table .reason")].some(e => e.textContent.startsWith("not-allowed"))`))
	run("dirty draft", setInput("#vip-name", "dirty-name"), waitJS(`document.querySelector("#dirty").textContent !== ""`))
	ln, err := d.Runtime("home").Host().ListenTCP(netip.MustParseAddrPort("100.80.0.1:8080"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	run("status refreshes without replacing the draft",
		waitJS(`[...document.querySelectorAll("#status-table tr[data-backend^='server1'] .reason")].some(e => e.textContent === "ok")`),
		waitJS(`document.querySelector("#vip-name").value === "dirty-name"`))
	if get().Name != "api" {
		t.Fatal("the draft was saved by a status refresh")
	}

	// A CLI edit meanwhile: Save meets the conflict and keeps the draft.
	f.must("vip", "backend", "add", "home", "api", "tcp/8080", "server2:9090")
	run("conflict keeps the draft", chromedp.Click(chromedp.CSS("#save")), chromedp.WaitVisible(chromedp.CSS("#conflict")),
		waitJS(`document.querySelector("#vip-name").value === "dirty-name"`))
	if get().Name != "api" {
		t.Fatal("a stale draft was written")
	}
	// Discard / reload loads the latest configuration.
	run("discard and reload", chromedp.Click(chromedp.CSS("#discard-reload")),
		waitJS(`document.querySelector("#vip-name").value === "api" && !document.querySelector("#conflict")`),
		waitJS(`document.querySelectorAll('.listener[data-listener="0"] .backend').length === 2 || document.querySelectorAll('.listener[data-listener="1"] .backend').length === 2`))

	// Delete a listener as a draft, then Save.
	run("delete a listener as a draft", chromedp.Click(chromedp.CSS(`.listener[data-listener="1"] .remove-listener`)),
		waitJS(`document.querySelectorAll(".listener").length === 1`))
	if n := len(get().Listeners); n != 2 {
		t.Fatalf("deleting in the draft changed the configuration: %d listeners", n)
	}
	run("save the deletion", chromedp.Click(chromedp.CSS("#save")), waitJS(`document.querySelector("#dirty").textContent === ""`))
	if n := len(get().Listeners); n != 1 {
		t.Fatalf("after saving the deletion: %d listeners, want 1", n)
	}

	// Closing a dirty window asks: keep editing, then discard.
	run("dirty again", setInput("#vip-name", "unsaved"))
	guard, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.onbeforeunload !== null`))
	if err != nil || !guard {
		t.Fatal("no beforeunload guard on a dirty draft")
	}
	run("close asks; keep editing", chromedp.Click(chromedp.CSS("#close")), waitJS(`document.querySelector("#close-dialog").open`),
		chromedp.Click(chromedp.CSS("#dialog-keep")), waitJS(`!document.querySelector("#close-dialog").open && document.querySelector("#vip-name").value === "unsaved"`))
	// In-app navigation (a network link) asks too.
	run("navigation asks", chromedp.Click(chromedp.CSS(`#networks a`)), waitJS(`document.querySelector("#close-dialog").open`),
		chromedp.Click(chromedp.CSS("#dialog-keep")), waitJS(`document.querySelector("#vip-name") !== null`))
	// Ids and node addresses sit in a collapsed detail.
	stray, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#main").innerText.split("\n").some(l => l.trim() === "null" || l.trim() === "undefined")`))
	if err != nil || stray {
		t.Fatalf("the page shows a stray null/undefined: %v", err)
	}
	open, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#ids").open`))
	if err != nil || open {
		t.Fatal("the addresses and ids detail is open by default")
	}
	// Screenshot of the editor with a dirty draft.
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatal("the screenshot is not a PNG")
	}
	art := os.Getenv("VIPKIT_ARTIFACTS")
	if art == "" {
		if art, err = os.MkdirTemp("", "vipkit-artifacts-"); err != nil {
			t.Fatal(err)
		}
	}
	shot := filepath.Join(art, "tsng-vip-editor.png")
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("editor screenshot: %s", shot)
	run("close asks; discard", chromedp.Click(chromedp.CSS("#close")), waitJS(`document.querySelector("#close-dialog").open`),
		chromedp.Click(chromedp.CSS("#dialog-discard")), chromedp.WaitVisible(chromedp.CSS("#vip-table")))
	if get().Name != "api" {
		t.Fatal("a discarded draft was saved")
	}
}

func nodeID(reg *vip.Registry, name string) string {
	n, err := reg.ResolveNode(name)
	if err != nil {
		panic(err)
	}
	return n.ID.String()
}
