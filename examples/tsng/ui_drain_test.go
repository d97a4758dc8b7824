package tsng

import (
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/vip"
)

// TestWebEditorDrainToggle: each backend row has a drain toggle that edits
// the listener's replicated drain field (the one `tsng vip backend drain`
// sets) as part of the draft: nothing changes until Save, Save drains,
// toggling back and saving undrains, a drain made by the CLI shows in a
// clean window, the flag follows its row through a port edit, and
// removing a draining backend leaves no drain entry.
func TestWebEditorDrainToggle(t *testing.T) {
	ctx := browser(t)
	d, f := uiDaemon(t)
	reg := d.Runtime("home").Registry()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/8080", "--backend", "server1:8080", "--backend", "server2:9090")
	v, err := reg.Get("api")
	if err != nil {
		t.Fatal(err)
	}
	k := vip.PortKey{Proto: vip.TCP, Port: 8080}
	backend := func(node string, port uint16) vip.Backend {
		n, err := reg.ResolveNode(node)
		if err != nil {
			t.Fatal(err)
		}
		return vip.Backend{Node: n.ID, Port: port}
	}
	b1, b2 := backend("server1", 8080), backend("server2", 9090)
	draining := func(b vip.Backend) bool {
		t.Helper()
		v, err := reg.Get("api")
		if err != nil {
			t.Fatal(err)
		}
		l, ok := v.Listener(k)
		if !ok {
			t.Fatalf("no listener %s in %+v", k, v.Service)
		}
		return l.Draining(b)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// toggle is the drain checkbox of the backend row with port p.
	toggle := func(p int) string {
		return fmt.Sprintf(`[...document.querySelectorAll(".listener .backend")].find((r) => r.querySelector(".backend-port").value === "%d").querySelector(".backend-drain")`, p)
	}
	click := func(p int) chromedp.Action[chromedp.Void] {
		return void(chromedp.Evaluate[bool](fmt.Sprintf(`(() => { %s.click(); return true })()`, toggle(p))))
	}
	clean := waitJS(`document.querySelector("#dirty").textContent === ""`)

	run("open the VIP", uiSignIn(t, d, "#/n/home/v/"+v.ID.String()), waitJS(`document.querySelector("#vip-name") !== null`))
	run("each backend has a drain toggle", waitJS(`document.querySelectorAll(".listener .backend .backend-drain").length === 2`))
	run("none is on", waitJS(fmt.Sprintf(`!%s.checked && !%s.checked`, toggle(8080), toggle(9090))))

	// Toggling is a draft: dirty, nothing written; toggling back is clean.
	run("drain as a draft", click(9090), waitJS(`document.querySelector("#dirty").textContent !== "" && !document.querySelector("#save").disabled`))
	if draining(b2) {
		t.Fatal("the drain toggle wrote the configuration before Save")
	}
	run("toggle back is clean", click(9090), clean)
	run("drain again and save", click(9090), waitJS(`document.querySelector("#dirty").textContent !== ""`), chromedp.Click(chromedp.CSS("#save")), clean,
		waitJS(toggle(9090)+".checked"))
	if !draining(b2) || draining(b1) {
		t.Fatalf("after Save: server2:9090 draining %v, server1:8080 draining %v; want true, false", draining(b2), draining(b1))
	}

	// A drain made by the CLI shows in the clean window.
	f.must("vip", "backend", "drain", "home", "api", "tcp/8080", "server1:8080")
	run("the CLI's drain shows", waitJS(toggle(8080)+".checked"), clean)

	// Undrain both in the window, save: neither drains.
	run("undrain and save", click(9090), click(8080), waitJS(`document.querySelector("#dirty").textContent !== ""`),
		chromedp.Click(chromedp.CSS("#save")), clean, waitJS(fmt.Sprintf(`!%s.checked && !%s.checked`, toggle(8080), toggle(9090))))
	if draining(b1) || draining(b2) {
		t.Fatalf("after undrain and Save: server1:8080 draining %v, server2:9090 draining %v; want neither", draining(b1), draining(b2))
	}

	// The flag belongs to the row: a draining row edited to another port
	// saves that backend draining.
	run("drain, move the row to port 9091, save", click(9090),
		void(chromedp.Evaluate[bool](`(() => { const e = [...document.querySelectorAll(".listener .backend-port")].find((e) => e.value === "9090"); e.value = "9091"; e.dispatchEvent(new Event("input", {bubbles: true})); return true })()`)),
		chromedp.Click(chromedp.CSS("#save")), clean, waitJS(toggle(9091)+".checked"))
	if b3 := backend("server2", 9091); !draining(b3) || draining(b1) {
		t.Fatalf("after moving the draining row: server2:9091 draining %v, server1:8080 draining %v; want true, false", draining(b3), draining(b1))
	}

	// Removing a draining backend in the draft ends its drain: Save keeps
	// no drain entry for it, and the remaining row is not shown draining.
	run("remove the draining backend",
		void(chromedp.Evaluate[bool](`(() => { [...document.querySelectorAll(".listener .backend")].find((r) => r.querySelector(".backend-port").value === "9091").querySelector(".remove-backend").click(); return true })()`)),
		waitJS(`document.querySelectorAll(".listener .backend").length === 1`), waitJS(`!`+toggle(8080)+`.checked`),
		chromedp.Click(chromedp.CSS("#save")), clean)
	v, err = reg.Get("api")
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := v.Listener(k); len(l.Backends) != 1 || len(l.Drain) != 0 {
		t.Fatalf("after removing the draining backend: %+v", l)
	}
}

// TestWebEditorAddressVisible: the VIP's address, the one clients dial,
// is in the window's header on load, outside the collapsed ids section,
// which stays closed; the network page's table lists it as well.
func TestWebEditorAddressVisible(t *testing.T) {
	ctx := browser(t)
	d, f := uiDaemon(t)
	reg := d.Runtime("home").Registry()
	f.must("vip", "create", "home", "api")
	v, err := reg.Get("api")
	if err != nil {
		t.Fatal(err)
	}
	if !v.Addr.IsValid() {
		t.Fatalf("the VIP has no address: %+v", v)
	}
	if err := chromedp.Do(ctx, uiSignIn(t, d, "#/n/home/v/"+v.ID.String()), waitJS(`document.querySelector("#vip-name") !== null`)); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		Found, Visible, InClosedDetails, IdsOpen bool
		Text                                     string
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[seen](`(() => {
		const e = document.querySelector("#vip-addr");
		if (!e) return {Found: false};
		return {Found: true, Text: e.textContent, Visible: e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden",
			InClosedDetails: !!e.closest("details:not([open])"), IdsOpen: document.querySelector("#ids").open};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	want := v.Addr.String()
	if !got.Found {
		t.Fatal("no #vip-addr: the VIP's address is not in the window's header")
	}
	if got.Text != want || !got.Visible || got.InClosedDetails {
		t.Fatalf("VIP address shown as %+v, want %q visible outside a closed <details>", got, want)
	}
	if got.IdsOpen {
		t.Fatal("the ids section is open on load")
	}
	// The rendered text of the page (what a reader sees) has it.
	if err := chromedp.Do(ctx, waitJS(fmt.Sprintf(`document.querySelector("#main").innerText.includes(%q)`, want))); err != nil {
		t.Fatalf("the page's visible text lacks %s: %v", want, err)
	}
	// The network page lists it too.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#close")), chromedp.WaitVisible(chromedp.CSS("#vip-table")),
		waitJS(fmt.Sprintf(`document.querySelector('tr[data-vip="api"] .vip-addr').textContent === %q`, want))); err != nil {
		t.Fatalf("the network page does not show %s: %v", want, err)
	}
}
