package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/vip"
)

// editRun runs `tsng ARGS` against f with a cache directory, so that a
// kept edit has its fixed place and a later run reopens it; editor edits
// the file in place (nil leaves it as it is).
func editRun(t *testing.T, f *apiFixture, cache string, editor func(path string) error, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string {
			switch k {
			case "TSNG_SOCKET":
				return f.socket
			case "XDG_CACHE_HOME":
				return cache
			}
			return ""
		},
		RunEditor: func(_ context.Context, path string) error {
			if editor == nil {
				return nil
			}
			return editor(path)
		}}
	code := Main(context.Background(), args, env)
	return code, out.String(), errb.String()
}

// editJSON is an editor that changes the file as generic JSON.
func editJSON(edit func(doc map[string]any)) func(path string) error {
	return func(path string) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			return err
		}
		edit(doc)
		b, err = json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(path, b, 0o600)
	}
}

// jsonAt walks doc along keys (strings for objects, ints for arrays).
func jsonAt(doc any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := doc.(map[string]any)
			doc = m[k]
		case int:
			a, _ := doc.([]any)
			if k >= len(a) {
				return nil
			}
			doc = a[k]
		}
	}
	return doc
}

func keptFiles(t *testing.T, cache string) []string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(cache, "tsng", "edit", "*"))
	return names
}

// TestEditStaleRebases replays the loop of a stale kept edit through the
// CLI: an edit refused because the service changed meanwhile is, on the
// next run, rebased onto the current service and saved with both changes.
func TestEditStaleRebases(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	code, _, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		f.must("vip", "port", "add", "home", "api", "udp/53", "--backend", "server2:5353")
		jsonAt(doc, "service").(map[string]any)["name"] = "api2"
	}), "vip", "edit", "home", "api")
	if code != ExitConflict || !strings.Contains(errs, "stale draft") {
		t.Fatalf("concurrent change: exit %d %q, want %d", code, errs, ExitConflict)
	}
	// The next run brings the kept edit up to date; the service changes
	// again while the editor is open.
	var opened string
	code, _, errs = editRun(t, f, cache, func(path string) error {
		b, err := os.ReadFile(path)
		opened = string(b)
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("the rebased edit's mode: %v %v", fi, err)
		}
		f.must("vip", "backend", "add", "home", "api", "tcp/443", "server3:6443")
		return err
	}, "vip", "edit", "home", "api")
	if !strings.Contains(opened, `"name": "api2"`) || !strings.Contains(opened, `"udp"`) {
		t.Fatalf("the second run opened\n%s\nwant the edit rebased onto udp/53", opened)
	}
	if code != ExitConflict || !strings.Contains(errs, "stale draft") {
		t.Fatalf("second concurrent change: exit %d %q", code, errs)
	}
	for _, p := range keptFiles(t, cache) {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", p, fi, err)
		}
	}
	// The third run rebases again, and saves.
	code, out, errs := editRun(t, f, cache, nil, "vip", "edit", "home", "api")
	if code != 0 || !strings.Contains(errs, "your changes are applied onto the current configuration") {
		t.Fatalf("third run: exit %d\n%s", code, errs)
	}
	if !strings.Contains(out, "api2") || !strings.Contains(out, "udp/53") || !strings.Contains(out, "tcp/443") || !strings.Contains(out, "server3") {
		t.Fatalf("saved service lacks a change:\n%s", out)
	}
	if k := keptFiles(t, cache); len(k) != 0 {
		t.Fatalf("files left after the save: %v", k)
	}
}

// TestEditStaleConflict: both sides changed the same field. The second run
// names the conflict (path, base, yours, theirs) and keeps the edit; the
// third, with the conflict resolved in the file, saves. Never a loop.
func TestEditStaleConflict(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	code, _, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		f.must("vip", "port", "set", "home", "api", "tcp/443", "--check-interval-ms", "2000")
		l := jsonAt(doc, "service", "listeners", 0).(map[string]any)
		l["check"] = map[string]any{"interval": "1s"}
	}), "vip", "edit", "home", "api")
	if code != ExitConflict {
		t.Fatalf("concurrent change: exit %d %q", code, errs)
	}
	code, _, errs = editRun(t, f, cache, func(string) error { t.Fatal("the editor opened on a conflicting rebase"); return nil }, "vip", "edit", "home", "api")
	if code != ExitConflict || !strings.Contains(errs, "listeners[tcp/443].check.interval") || !strings.Contains(errs, "base absent") ||
		!strings.Contains(errs, `yours "1s"`) || !strings.Contains(errs, `theirs "2s"`) || strings.Contains(errs, `\n`) {
		t.Fatalf("conflicting rebase: exit %d, want %d and the conflict named:\n%s", code, ExitConflict, errs)
	}
	kept := keptPath(t, errs)
	// Leaving the conflicts listed refuses the save and keeps the file.
	code, _, errs = editRun(t, f, cache, nil, "vip", "edit", "home", "api")
	if code != ExitInvalid || !strings.Contains(errs, "conflicts") {
		t.Fatalf("unresolved conflict saved: exit %d\n%s", code, errs)
	}
	// Resolved in the file: saved.
	code, out, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		delete(doc, "conflicts")
		jsonAt(doc, "service", "listeners", 0).(map[string]any)["check"] = map[string]any{"interval": "2500ms"}
	}), "vip", "edit", "home", "api")
	if code != 0 {
		t.Fatalf("resolved: exit %d\n%s%s", code, out, errs)
	}
	if show := f.must("vip", "show", "home", "api", "--json"); !strings.Contains(show, `"interval": "2.5s"`) {
		t.Fatalf("the resolved value is not saved:\n%s", show)
	}
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("kept edit left after the save: %v", err)
	}
}

// TestEditDiscard: --discard drops a kept edit (and what is stored with
// it) and edits the current service.
func TestEditDiscard(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	code, _, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		f.must("vip", "port", "add", "home", "api", "udp/53")
		jsonAt(doc, "service").(map[string]any)["name"] = "api2"
	}), "vip", "edit", "home", "api")
	if code != ExitConflict || len(keptFiles(t, cache)) == 0 {
		t.Fatalf("concurrent change: exit %d %q", code, errs)
	}
	code, _, errs = editRun(t, f, cache, func(path string) error {
		b, err := os.ReadFile(path)
		if !strings.Contains(string(b), `"name": "api"`) || !strings.Contains(string(b), "udp") {
			t.Errorf("--discard opened\n%s\nwant the current service", b)
		}
		return err
	}, "vip", "edit", "home", "api", "--discard")
	if code != 0 || !strings.Contains(errs, "no changes") {
		t.Fatalf("--discard: exit %d\n%s", code, errs)
	}
	if k := keptFiles(t, cache); len(k) != 0 {
		t.Fatalf("files left after --discard: %v", k)
	}
}

// TestEditErrorNewlines: an invalid edit's error and the kept-file note
// are on lines of their own, with no escaped newline.
func TestEditErrorNewlines(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	code, _, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		jsonAt(doc, "service", "listeners", 0).(map[string]any)["interval_ms"] = 5
	}), "vip", "edit", "home", "api")
	if code != ExitInvalid || strings.Contains(errs, `\n`) || !strings.Contains(errs, "unknown field \"interval_ms\"\n") ||
		!strings.Contains(errs, "\ntsng: your edit is kept in ") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// TestEditFileNames: the edit file names backends by node name and has no
// empty fields; saved as it is, nothing changes.
func TestEditFileNames(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443", "--backend", "server2:7443")
	var file string
	var nodes []any
	code, _, errs := editRun(t, f, cache, func(path string) error {
		b, err := os.ReadFile(path)
		file = string(b)
		var doc map[string]any
		json.Unmarshal(b, &doc)
		backends, _ := jsonAt(doc, "service", "listeners", 0, "backends").([]any)
		for _, b := range backends {
			nodes = append(nodes, jsonAt(b, "node"))
		}
		return err
	}, "vip", "edit", "home", "api")
	if code != 0 || !strings.Contains(errs, "no changes") {
		t.Fatalf("unchanged file: exit %d\n%s", code, errs)
	}
	if len(nodes) != 2 || !slices.Contains(nodes, any("server1")) || !slices.Contains(nodes, any("server2")) {
		t.Fatalf("backend nodes %v, want [server1 server2]\n%s", nodes, file)
	}
	if strings.Contains(file, `""`) || strings.Contains(file, `"network"`) || strings.Contains(file, "null") ||
		strings.Contains(file, "{}") || strings.Contains(file, `"0s"`) {
		t.Fatalf("the edit file has empty fields:\n%s", file)
	}
	// A name the user writes resolves; an unknown one is named.
	code, out, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		for _, b := range jsonAt(doc, "service", "listeners", 0, "backends").([]any) {
			if b := b.(map[string]any); b["node"] == "server2" {
				b["node"] = "server3"
			}
		}
	}), "vip", "edit", "home", "api")
	show := f.must("vip", "show", "home", "api", "--json")
	if code != 0 || !strings.Contains(show, f.nodes[2].ID.String()) || strings.Contains(show, f.nodes[1].ID.String()) {
		t.Fatalf("server2 -> server3: exit %d\n%s%s\n%s", code, out, errs, show)
	}
	code, _, errs = editRun(t, f, cache, editJSON(func(doc map[string]any) {
		jsonAt(doc, "service", "listeners", 0, "backends", 1).(map[string]any)["node"] = "server9"
	}), "vip", "edit", "home", "api")
	if code != ExitInvalid || !strings.Contains(errs, `"server9"`) {
		t.Fatalf("unknown node: exit %d\n%s", code, errs)
	}
}

func TestCLIEdit(t *testing.T) {
	f := newAPIFixture(t)
	f.must("vip", "create", "home", "api")
	writeEditor := func(edit func(ef *editFile)) *Env {
		return &Env{RunEditor: func(_ context.Context, path string) error {
			var ef editFile
			b, _ := os.ReadFile(path)
			if err := json.Unmarshal(b, &ef); err != nil {
				return err
			}
			edit(&ef)
			b, _ = json.Marshal(ef)
			return os.WriteFile(path, b, 0o600)
		}}
	}
	// A good edit: add a listener with two backends at once.
	code, out, errs := f.run(writeEditor(func(ef *editFile) {
		ef.Service.Listeners = append(ef.Service.Listeners, editListener{Proto: vip.TCP, Port: 443, Backends: []editBackend{{Node: "server1", Port: 1}, {Node: f.nodes[1].ID.String(), Port: 2}}})
	}), "vip", "edit", "home", "api")
	if code != 0 || !strings.Contains(out, "tcp/443") {
		t.Fatalf("edit: %d %s %s", code, out, errs)
	}
	// A stale edit: the service changes while the editor is open.
	code, _, errs = f.run(&Env{RunEditor: func(_ context.Context, path string) error {
		f.must("vip", "port", "add", "home", "api", "udp/53")
		var ef editFile
		b, _ := os.ReadFile(path)
		json.Unmarshal(b, &ef)
		ef.Service.Name = "api2"
		b, _ = json.Marshal(ef)
		return os.WriteFile(path, b, 0o600)
	}}, "vip", "edit", "home", "api")
	kept := keptPath(t, errs)
	if code != ExitConflict || !strings.Contains(errs, "stale draft") || !strings.Contains(errs, "current revision") {
		t.Fatalf("stale edit: exit %d %q", code, errs)
	}
	if b, err := os.ReadFile(kept); err != nil || !strings.Contains(string(b), "api2") {
		t.Fatalf("stale edit's file not kept: %v", err)
	}
	os.Remove(kept)
	// An editor that writes invalid JSON: the file is kept, exit 6.
	code, _, errs = f.run(&Env{RunEditor: func(_ context.Context, path string) error {
		return os.WriteFile(path, []byte(`{"revision": "x", "service": {`), 0o600)
	}}, "vip", "edit", "home", "api")
	kept = keptPath(t, errs)
	if code != ExitInvalid {
		t.Fatalf("invalid JSON: exit %d %q", code, errs)
	}
	if b, _ := os.ReadFile(kept); !strings.Contains(string(b), `"service": {`) {
		t.Fatal("invalid file not kept")
	}
	os.Remove(kept)
	// A draft that fails validation: kept, exit 6, message names the field.
	code, _, errs = f.run(writeEditor(func(ef *editFile) { ef.Service.Listeners[0].Port = 0 }), "vip", "edit", "home", "api")
	kept = keptPath(t, errs)
	os.Remove(kept)
	if code != ExitInvalid || !strings.Contains(errs, "port 0") {
		t.Fatalf("invalid draft: exit %d %q", code, errs)
	}
	// No change: nothing saved, no file left.
	code, _, errs = f.run(&Env{RunEditor: func(context.Context, string) error { return nil }}, "vip", "edit", "home", "api")
	if code != 0 || !strings.Contains(errs, "no changes") {
		t.Fatalf("unchanged edit: %d %q", code, errs)
	}
}

// TestEditStaleWithoutBase: a stale kept edit whose base is not stored
// (a file of an older version) cannot be rebased; the error says so and
// names --discard, which makes progress.
func TestEditStaleWithoutBase(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	code, _, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		f.must("vip", "port", "add", "home", "api", "udp/53")
		jsonAt(doc, "service").(map[string]any)["name"] = "api2"
	}), "vip", "edit", "home", "api")
	kept := keptPath(t, errs)
	if code != ExitConflict {
		t.Fatalf("concurrent change: exit %d %q", code, errs)
	}
	if err := os.Remove(baseEditPath(kept)); err != nil {
		t.Fatal(err)
	}
	code, _, errs = editRun(t, f, cache, nil, "vip", "edit", "home", "api")
	if code != ExitConflict || !strings.Contains(errs, "not stored") || !strings.Contains(errs, "--discard") {
		t.Fatalf("no base: exit %d\n%s", code, errs)
	}
	if b, err := os.ReadFile(kept); err != nil || !strings.Contains(string(b), "api2") {
		t.Fatalf("the kept edit was lost: %v", err)
	}
	code, _, errs = editRun(t, f, cache, editJSON(func(doc map[string]any) {
		jsonAt(doc, "service").(map[string]any)["name"] = "api3"
	}), "vip", "edit", "home", "api", "--discard")
	if code != 0 || !strings.Contains(f.must("vip", "show", "home", "api3"), "api3") {
		t.Fatalf("--discard: exit %d\n%s", code, errs)
	}
}

// TestEditNodeLabels: the edit file names a node by its name only where
// the name selects that node back; otherwise (no name, a shared name, a
// name that reads as an id, no member) by its id. Every label resolves to
// its node; an ambiguous or unknown name is an error naming it.
func TestEditNodeLabels(t *testing.T) {
	id := func(b byte) vip.NodeID { return vip.NodeID{b, 0xee} }
	departed := id(9)
	nodes := []NodeDoc{{ID: id(1), Name: "server1"}, {ID: id(2), Name: "dup"}, {ID: id(3), Name: "dup"}, {ID: id(4)},
		{ID: id(5), Name: id(6).String()}, {ID: id(6), Name: "six"}}
	want := map[vip.NodeID]string{id(1): "server1", id(2): id(2).String(), id(3): id(3).String(), id(4): id(4).String(),
		id(5): id(5).String(), id(6): "six", departed: departed.String()}
	for n, w := range want {
		got := nodeLabel(nodes, n)
		if got != w {
			t.Errorf("label of %s = %q, want %q", n, got, w)
		}
		if back, err := resolveNode(nodes, got); err != nil || back != n.String() {
			t.Errorf("label %q resolves to %q, %v; want %s", got, back, err, n)
		}
	}
	for sel, msg := range map[string]string{"dup": "ambiguous", "nosuch": "no node", "": "no node"} {
		if _, err := resolveNode(nodes, sel); err == nil || !strings.Contains(err.Error(), strconv.Quote(sel)) || !strings.Contains(err.Error(), msg) {
			t.Errorf("resolveNode(%q) = %v, want an error naming it (%s)", sel, err, msg)
		}
	}
	// Through the file: the shared name is refused with its line.
	es := toEditService(vip.Service{Listeners: []vip.Listener{{Proto: vip.TCP, Port: 80, Backends: []vip.Backend{{Node: id(1), Port: 1}}}}}, nodes)
	es.Listeners[0].Backends = append(es.Listeners[0].Backends, editBackend{Node: "dup", Port: 2})
	b, _ := json.MarshalIndent(editFile{Revision: "r", Service: es}, "", "  ")
	if _, _, err := parseEdit(b, nodes); err == nil || !strings.Contains(err.Error(), `"dup"`) || !strings.Contains(err.Error(), "line ") {
		t.Fatalf("a shared name in the file: %v", err)
	}
}

// TestEditRebase: the three-way rebase per field, listener and backend.
func TestEditRebase(t *testing.T) {
	n1, n2, n3 := vip.NodeID{1}, vip.NodeID{2}, vip.NodeID{3}
	nodes := []NodeDoc{{ID: n1, Name: "s1"}, {ID: n2, Name: "s2"}, {ID: n3, Name: "s3"}}
	be := func(n vip.NodeID, port uint16) vip.Backend { return vip.Backend{Node: n, Port: port} }
	tcp := func(port uint16, bs ...vip.Backend) vip.Listener {
		return vip.Listener{Proto: vip.TCP, Port: port, Generation: 1, Backends: bs}
	}
	svc := func(name string, ls ...vip.Listener) vip.Service { return vip.Service{Name: name, Listeners: ls} }
	off := false
	withCheck := func(l vip.Listener, iv time.Duration) vip.Listener { l.Check.Interval = vip.Duration(iv); return l }
	drained := func(l vip.Listener, bs ...vip.Backend) vip.Listener { l.Drain = bs; return l }
	noCheck := func(l vip.Listener) vip.Listener { l.Check.PortCheck = &off; return l }
	base := svc("api", tcp(443, be(n1, 1), be(n2, 2)))
	for _, c := range []struct {
		name          string
		yours, theirs vip.Service
		want          vip.Service
		conflicts     []string
	}{
		{"both add backends", svc("api", tcp(443, be(n1, 1), be(n2, 2), be(n3, 3))), svc("api", tcp(443, be(n1, 1), be(n2, 2), be(n1, 9))),
			svc("api", tcp(443, be(n1, 1), be(n2, 2), be(n1, 9), be(n3, 3))), nil},
		{"you remove, they drain", svc("api", tcp(443, be(n1, 1))), svc("api", drained(tcp(443, be(n1, 1), be(n2, 2)), be(n2, 2))),
			svc("api", tcp(443, be(n1, 1))), []string{"listeners[tcp/443].backends[s2:2]"}},
		{"you drain, they leave it", svc("api", drained(tcp(443, be(n1, 1), be(n2, 2)), be(n1, 1))), svc("api2", tcp(443, be(n1, 1), be(n2, 2))),
			svc("api2", drained(tcp(443, be(n1, 1), be(n2, 2)), be(n1, 1))), nil},
		{"you change, they remove the listener", svc("api", withCheck(tcp(443, be(n1, 1), be(n2, 2)), time.Second)), svc("api"),
			svc("api", withCheck(tcp(443, be(n1, 1), be(n2, 2)), time.Second)), []string{"listeners[tcp/443]"}},
		{"they remove an unchanged listener", base, svc("api", tcp(80)), svc("api", tcp(80)), nil},
		{"you remove, they add another", svc("api"), svc("api", tcp(443, be(n1, 1), be(n2, 2)), tcp(80)), svc("api", tcp(80)), nil},
		{"you remove, they change", svc("api"), svc("api", tcp(443, be(n1, 1))), svc("api"), []string{"listeners[tcp/443]"}},
		{"both add the same listener", svc("api", base.Listeners[0], tcp(80, be(n3, 8))), svc("api", base.Listeners[0], tcp(80, be(n3, 8))),
			svc("api", base.Listeners[0], tcp(80, be(n3, 8))), nil},
		{"both rename", svc("a1", base.Listeners...), svc("a2", base.Listeners...), svc("a1", base.Listeners...), []string{"name"}},
		{"check fields apart", svc("api", noCheck(tcp(443, be(n1, 1), be(n2, 2)))), svc("api", withCheck(tcp(443, be(n1, 1), be(n2, 2)), time.Second)),
			svc("api", noCheck(withCheck(tcp(443, be(n1, 1), be(n2, 2)), time.Second))), nil},
		{"one check field both ways", svc("api", withCheck(base.Listeners[0], 4*time.Second)), svc("api", withCheck(base.Listeners[0], 5*time.Second)),
			svc("api", withCheck(base.Listeners[0], 4*time.Second)), []string{"listeners[tcp/443].check.interval"}},
	} {
		got, cs := rebase(base, c.yours, c.theirs, nodes)
		var paths []string
		for _, cf := range cs {
			paths = append(paths, cf.Path)
		}
		if !slices.Equal(paths, c.conflicts) {
			t.Errorf("%s: conflicts %v, want %v", c.name, paths, c.conflicts)
		}
		if c.name == "you remove, they drain" && len(cs) == 1 &&
			(string(cs[0].Base) != `"present"` || cs[0].Yours != nil || string(cs[0].Theirs) != `"draining"`) {
			t.Errorf("%s: conflict %s / %s / %s", c.name, cs[0].Base, cs[0].Yours, cs[0].Theirs)
		}
		if len(got.Listeners) != len(c.want.Listeners) || got.Name != c.want.Name {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
			continue
		}
		for i := range got.Listeners {
			if !sameListener(got.Listeners[i], c.want.Listeners[i]) || got.Listeners[i].Key() != c.want.Listeners[i].Key() {
				t.Errorf("%s: listener %d: got %+v, want %+v", c.name, i, got.Listeners[i], c.want.Listeners[i])
			}
		}
	}
}

// TestEditKeepRemovedListener: theirs removed a listener that yours
// changed; keeping yours in the conflict saves the listener again.
func TestEditKeepRemovedListener(t *testing.T) {
	f := newAPIFixture(t)
	cache := t.TempDir()
	f.must("vip", "create", "home", "api")
	f.must("vip", "port", "add", "home", "api", "tcp/443", "--backend", "server1:6443")
	code, _, errs := editRun(t, f, cache, editJSON(func(doc map[string]any) {
		f.must("vip", "port", "remove", "home", "api", "tcp/443")
		jsonAt(doc, "service", "listeners", 0).(map[string]any)["check"] = map[string]any{"interval": "4s"}
	}), "vip", "edit", "home", "api")
	if code != ExitConflict {
		t.Fatalf("concurrent change: exit %d %q", code, errs)
	}
	code, _, errs = editRun(t, f, cache, nil, "vip", "edit", "home", "api")
	if code != ExitConflict || !strings.Contains(errs, "listeners[tcp/443]: base {") || !strings.Contains(errs, "theirs absent") {
		t.Fatalf("conflict: exit %d\n%s", code, errs)
	}
	code, _, errs = editRun(t, f, cache, editJSON(func(doc map[string]any) { delete(doc, "conflicts") }), "vip", "edit", "home", "api")
	show := f.must("vip", "show", "home", "api", "--json")
	if code != 0 || !strings.Contains(show, `"interval": "4s"`) || !strings.Contains(show, "6443") {
		t.Fatalf("yours kept: exit %d\n%s\n%s", code, errs, show)
	}
}
