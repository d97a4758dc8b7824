package tsng

import (
	"errors"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/vipkit/vipkit/vip"
)

// TestWebEditorDeleteIsADraft: Delete VIP only marks the draft; Discard
// restores it, a dirty close asks, a stale deletion meets the conflict and
// Save deletes.
func TestWebEditorDeleteIsADraft(t *testing.T) {
	ctx := browser(t)
	d, f := uiDaemon(t)
	reg := d.Runtime("home").Registry()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/8080", "--backend", "server1:8080")
	v, err := reg.Get("api")
	if err != nil {
		t.Fatal(err)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	exists := func() bool {
		t.Helper()
		_, err := reg.Get("api")
		if err != nil && !errors.Is(err, vip.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	run("open the VIP", uiSignIn(t, d, "#/n/home/v/"+v.ID.String()), waitJS(`document.querySelector("#vip-name") !== null`))
	run("there is a Delete VIP button", waitJS(`document.querySelector("#delete-vip") !== null`))
	run("delete as a draft", chromedp.Click(chromedp.CSS("#delete-vip")),
		waitJS(`document.querySelector("#delete-draft") !== null && document.querySelector("#dirty").textContent !== "" && !document.querySelector("#save").disabled`))
	if !exists() {
		t.Fatal("Delete VIP deleted the service before Save")
	}

	// Discard restores the VIP in the window; nothing was written.
	run("discard", chromedp.Click(chromedp.CSS("#discard")),
		waitJS(`document.querySelector("#delete-draft") === null && document.querySelector("#dirty").textContent === "" && document.querySelector("#vip-name").value === "api"`))
	if !exists() {
		t.Fatal("Discard deleted the service")
	}

	// A dirty close asks; keeping the draft keeps the deletion pending.
	run("delete again", chromedp.Click(chromedp.CSS("#delete-vip")), waitJS(`document.querySelector("#delete-draft") !== null`))
	guard, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.onbeforeunload !== null`))
	if err != nil || !guard {
		t.Fatal("no beforeunload guard on a pending deletion")
	}
	run("close asks; keep editing", chromedp.Click(chromedp.CSS("#close")), waitJS(`document.querySelector("#close-dialog").open`),
		chromedp.Click(chromedp.CSS("#dialog-keep")), waitJS(`!document.querySelector("#close-dialog").open && document.querySelector("#delete-draft") !== null`))
	if !exists() {
		t.Fatal("closing asked, but the service is gone")
	}

	// A change elsewhere: the deletion is version-checked and kept as a draft.
	f.must("vip", "backend", "add", "home", "api", "tcp/8080", "server2:9090")
	run("a stale deletion meets the conflict", chromedp.Click(chromedp.CSS("#save")), chromedp.WaitVisible(chromedp.CSS("#conflict")),
		waitJS(`document.querySelector("#delete-draft") !== null`))
	if !exists() {
		t.Fatal("a stale deletion was written")
	}
	run("reload the latest", chromedp.Click(chromedp.CSS("#discard-reload")),
		waitJS(`document.querySelector("#conflict") === null && document.querySelector("#delete-draft") === null && document.querySelectorAll(".backend").length === 2`))

	// Save commits the deletion and leaves the window.
	run("save the deletion", chromedp.Click(chromedp.CSS("#delete-vip")), chromedp.Click(chromedp.CSS("#save")),
		chromedp.WaitVisible(chromedp.CSS("#vip-table")), waitJS(`document.querySelector('tr[data-vip="api"]') === null`))
	if exists() {
		t.Fatal("Save did not delete the service")
	}
}

// TestWebEditorNewVIPIsADraft: New VIP opens a draft that creates nothing
// until Save; a dirty close asks, Discard leaves nothing behind, and Save
// creates the service with its listeners at once.
func TestWebEditorNewVIPIsADraft(t *testing.T) {
	ctx := browser(t)
	d, _ := uiDaemon(t)
	reg := d.Runtime("home").Registry()
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	count := func() int { t.Helper(); return len(reg.List()) }
	newDraft := func() {
		t.Helper()
		run("new VIP", uiSignIn(t, d, ""), chromedp.WaitVisible(chromedp.CSS("#vip-table")),
			setInput("#new-name", "web"), chromedp.Click(chromedp.CSS("#create")),
			waitJS(`document.querySelector("#vip-name") !== null && document.querySelector("#vip-name").value === "web"`))
		if n := count(); n != 0 {
			t.Fatalf("New VIP created %d services before Save", n)
		}
		run("a new VIP is an unsaved draft", waitJS(`document.querySelector("#dirty").textContent !== "" && !document.querySelector("#save").disabled`))
		run("with a listener", chromedp.Click(chromedp.CSS("#add-listener")),
			setInput(`.listener[data-listener="0"] .port`, "80"),
			chromedp.Click(chromedp.CSS(`.listener[data-listener="0"] .add-backend`)),
			setInput(`.listener[data-listener="0"] .backend-port`, "8080"))
		if n := count(); n != 0 {
			t.Fatalf("editing a new VIP's draft created %d services", n)
		}
	}

	// A dirty close asks; discarding leaves nothing behind.
	newDraft()
	run("close asks; keep editing", chromedp.Click(chromedp.CSS("#close")), waitJS(`document.querySelector("#close-dialog").open`),
		chromedp.Click(chromedp.CSS("#dialog-keep")), waitJS(`!document.querySelector("#close-dialog").open && document.querySelector("#vip-name").value === "web"`))
	run("close asks; discard", chromedp.Click(chromedp.CSS("#close")), waitJS(`document.querySelector("#close-dialog").open`),
		chromedp.Click(chromedp.CSS("#dialog-discard")), chromedp.WaitVisible(chromedp.CSS("#vip-table")))
	if n := count(); n != 0 {
		t.Fatalf("a discarded new VIP left %d services", n)
	}

	// The toolbar's Discard drops the new draft too.
	newDraft()
	run("discard", chromedp.Click(chromedp.CSS("#discard")), chromedp.WaitVisible(chromedp.CSS("#vip-table")))
	if n := count(); n != 0 {
		t.Fatalf("Discard of a new VIP left %d services", n)
	}

	// An invalid draft is refused and creates nothing; the draft stays.
	newDraft()
	run("invalid listener port", setInput(`.listener[data-listener="0"] .port`, "0"), chromedp.Click(chromedp.CSS("#save")),
		waitJS(`document.querySelector("#save-error") !== null && document.querySelector("#vip-name").value === "web"`))
	if n := count(); n != 0 {
		t.Fatalf("an invalid new VIP created %d services", n)
	}

	// Save creates the service with its listener, and the window follows it.
	run("fix and save", setInput(`.listener[data-listener="0"] .port`, "80"), chromedp.Click(chromedp.CSS("#save")),
		waitJS(`document.querySelector("#dirty").textContent === "" && location.hash.includes("/v/") && !location.hash.endsWith("/new")`))
	v, err := reg.Get("web")
	if err != nil {
		t.Fatalf("after Save: %v", err)
	}
	l, ok := v.Listener(vip.PortKey{Proto: vip.TCP, Port: 80})
	if len(v.Listeners) != 1 || !ok || len(l.Backends) != 1 || l.Backends[0].Port != 8080 {
		t.Fatalf("saved %+v", v.Service)
	}
	hash, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`))
	if err != nil || hash != "#/n/home/v/"+v.ID.String() {
		t.Fatalf("window at %q (%v), want the saved VIP's", hash, err)
	}
}
