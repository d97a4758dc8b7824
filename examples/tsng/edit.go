package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/vip"
)

// editFile is what `tsng vip edit` puts in the editor.
type editFile struct {
	Comment  string       `json:"_comment,omitempty"`
	Revision vip.Revision `json:"revision"`
	// Conflicts lists what a rebase could not bring together; the file is
	// saved only once they are resolved in Service and the list is gone.
	Conflicts []editConflict `json:"conflicts,omitempty"`
	Service   editService    `json:"service"`
}

// editService is a vip.Service as the edit file shows it: backends by
// node name, and no empty fields.
type editService struct {
	ID   vip.ServiceID `json:"id"`
	Name string        `json:"name"`
	// Network is accepted from the files of older versions and never
	// written: the agent sets it.
	Network   string         `json:"network,omitempty"`
	Listeners []editListener `json:"listeners"`
}

type editListener struct {
	Proto       vip.Proto     `json:"proto"`
	Port        uint16        `json:"port"`
	Generation  uint64        `json:"generation,omitempty"`
	Backends    []editBackend `json:"backends"`
	Drain       []editBackend `json:"drain,omitempty"`
	Check       vip.Check     `json:"check,omitzero"`
	IdleTimeout vip.Duration  `json:"idle_timeout,omitempty"`
}

type editBackend struct {
	Node string `json:"node"`
	Port uint16 `json:"port"`
}

// editConflict is one thing both the kept edit and a later change of the
// service changed differently. An absent value is left out.
type editConflict struct {
	Path   string          `json:"path"`
	Base   json.RawMessage `json:"base,omitempty"`
	Yours  json.RawMessage `json:"yours,omitempty"`
	Theirs json.RawMessage `json:"theirs,omitempty"`
}

// editBase is the service a kept edit was made from, stored beside it so
// that the edit can be rebased when the service changes meanwhile.
type editBase struct {
	Revision vip.Revision `json:"revision"`
	Service  vip.Service  `json:"service"`
}

// editError ends an edit whose file was kept.
type editError struct {
	path string
	err  error
	code int
	// shown: runEdit wrote err's lines to stderr already, so Error() is
	// only where the edit is kept.
	shown bool
}

func (e *editError) Error() string {
	kept := fmt.Sprintf("your edit is kept in %s (run the edit again to reopen it, brought up to date if the service changed; --discard drops it)", e.path)
	if e.shown {
		return kept
	}
	return e.err.Error() + "\n" + kept
}

func (e *editError) Unwrap() error { return e.err }

// keptEditPath is where an edit of a service lives until it is saved:
// $XDG_CACHE_HOME/tsng/edit (or ~/.cache/tsng/edit), mode 0700, one file
// per network and service, so running the edit again reopens it. "" when
// there is no cache directory.
func keptEditPath(getenv func(string) string, network string, id vip.ServiceID) string {
	dir := getenv("XDG_CACHE_HOME")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".cache")
	}
	dir = filepath.Join(dir, "tsng", "edit")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return ""
	}
	return filepath.Join(dir, network+"-"+id.String()+".json")
}

// baseEditPath is where the base of the kept edit at path is stored.
func baseEditPath(path string) string {
	return strings.TrimSuffix(path, ".json") + ".base.json"
}

// runEdit is `tsng vip edit`. The lines of an error that keeps the edit
// are printed here, each escaped on its own, so that they stay lines.
func runEdit(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	err := edit(ctx, c, o, a)
	var ee *editError
	if errors.As(err, &ee) && !ee.shown {
		lines := strings.Split(ee.err.Error(), "\n")
		fmt.Fprintln(c.env.Stderr, "tsng:", printable(lines[0]))
		for _, l := range lines[1:] {
			fmt.Fprintln(c.env.Stderr, printable(l))
		}
		ee.shown = true
	}
	return err
}

const editComment = "Edit the service and save. The whole file is one draft, saved only if the service is still at this revision. A backend's node is a node name, id or unique id prefix (the file shows a node's id where it has no unique name). A check field left out or 0 takes its default (3s interval, 2s timeout, 2 failures, 1 success); idle_timeout left out or 0 is the protocol's default (7200s TCP, 120s UDP). Nodes:"

func edit(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	var d ServiceDoc
	if err := c.client.Do(ctx, http.MethodGet, vipPath(a[0], a[1]), nil, &d); err != nil {
		return err
	}
	var nodes []NodeDoc
	if err := c.client.Do(ctx, http.MethodGet, "/v1/networks/"+url.PathEscape(a[0])+"/nodes", nil, &nodes); err != nil {
		return err
	}
	comment := editComment
	for _, n := range nodes {
		name := n.Name
		if name == "" {
			name = "(no name)"
		}
		comment += fmt.Sprintf(" %s = %s;", name, n.ID)
	}
	comment = strings.TrimSuffix(comment, ";")
	render := func(ef editFile) ([]byte, error) {
		b, err := json.MarshalIndent(ef, "", "  ")
		return append(b, '\n'), err
	}
	orig, err := render(editFile{Comment: comment, Revision: d.Revision, Service: toEditService(d.Service, nodes)})
	if err != nil {
		return err
	}
	current, err := json.Marshal(editBase{Revision: d.Revision, Service: d.Service})
	if err != nil {
		return err
	}
	path := keptEditPath(c.env.Getenv, d.Network, d.ID)
	basePath := ""
	if path != "" {
		basePath = baseEditPath(path)
	}
	if o.discard && path != "" {
		if err := os.Remove(path); err == nil {
			fmt.Fprintf(c.env.Stderr, "tsng: dropped your kept edit %s\n", path)
		} else if !os.IsNotExist(err) {
			return err
		}
		if err := os.Remove(basePath); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	reopened := false
	if path != "" {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
			reopened = true
		}
	}
	if reopened {
		if err := reopenKept(c, path, basePath, d, nodes, comment, current, render); err != nil {
			return err
		}
	} else {
		var f *os.File
		if path != "" {
			f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		} else {
			f, err = os.CreateTemp("", "tsng-edit-"+d.Network+"-"+d.Name+"-*.json")
		}
		if err != nil {
			return err
		}
		path = f.Name()
		_, err = f.Write(orig)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && basePath != "" {
			err = writeFileAtomic(basePath, current)
		}
		if err != nil {
			return err
		}
	}
	run := c.env.RunEditor
	if run == nil {
		run = func(ctx context.Context, p string) error { return runUserEditor(ctx, c.env.Getenv, p) }
	}
	if err := run(ctx, path); err != nil {
		return &editError{path: path, err: fmt.Errorf("editor failed: %w", err), code: ExitError}
	}
	edited, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	remove := func() {
		os.Remove(path)
		if basePath != "" {
			os.Remove(basePath)
		}
	}
	if !reopened && bytes.Equal(bytes.TrimSpace(edited), bytes.TrimSpace(orig)) {
		remove()
		fmt.Fprintln(c.env.Stderr, "tsng: no changes")
		return nil
	}
	ef, svc, err := parseEdit(edited, nodes)
	if err != nil {
		return &editError{path: path, err: fmt.Errorf("the edited file is not valid: %w", err), code: ExitInvalid}
	}
	if len(ef.Conflicts) > 0 {
		return &editError{path: path, err: fmt.Errorf("the edited file still lists conflicts (%d): resolve each in \"service\" and delete \"conflicts\"", len(ef.Conflicts)), code: ExitInvalid}
	}
	var saved ServiceDoc
	if err := c.client.Do(ctx, http.MethodPut, vipPath(a[0], d.ID.String()), SaveRequest{Service: svc, Revision: ef.Revision}, &saved); err != nil {
		code := ExitError
		if ae, ok := err.(*APIError); ok {
			code = ExitCode(ae.Code)
			if ae.Current != "" {
				err = fmt.Errorf("%s (current revision %s)", strings.TrimPrefix(ae.Message, "tsng: "), ae.Current)
			}
		}
		return &editError{path: path, err: fmt.Errorf("the draft was refused: %w", err), code: code}
	}
	remove()
	return printDoc(c, saved)
}

// reopenKept prepares the kept edit at path for the editor. An edit made
// at the current revision reopens as it is. One made at an older revision
// is rebased: its changes from the stored base are applied onto the
// current service d and the file rewritten at d's revision, with d as its
// new base; where both changed the same thing, the conflicts are listed in
// the file and returned as an error, and the editor does not open. A file
// that does not parse reopens as it is, for the user to fix.
func reopenKept(c *cliCtx, path, basePath string, d ServiceDoc, nodes []NodeDoc, comment string, current []byte, render func(editFile) ([]byte, error)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	kept, yours, perr := parseEdit(b, nodes)
	if perr != nil || kept.Revision == d.Revision {
		fmt.Fprintf(c.env.Stderr, "tsng: reopening your kept edit %s (--discard drops it and edits the current configuration)\n", path)
		if perr == nil {
			// Made at the current revision: d is its base.
			return writeFileAtomic(basePath, current)
		}
		return nil
	}
	var base editBase
	bb, err := os.ReadFile(basePath)
	if err == nil {
		err = jsonx.Decode(bb, &base)
	}
	if err == nil && base.Revision != kept.Revision {
		err = fmt.Errorf("it is of revision %s", base.Revision)
	}
	if err != nil {
		return &editError{path: path, code: ExitConflict, err: fmt.Errorf(
			"your kept edit was made at revision %s and the service is now at %s, but the base to bring it up to date is not stored (%s: %v); run the edit with --discard to start from the current configuration", kept.Revision, d.Revision, basePath, err)}
	}
	merged, conflicts := rebase(base.Service, yours, d.Service, nodes)
	// Conflicts listed before and not met again stay listed.
	all := conflicts
	for _, old := range kept.Conflicts {
		if !slices.ContainsFunc(conflicts, func(n editConflict) bool { return n.Path == old.Path }) {
			all = append(all, old)
		}
	}
	out, err := render(editFile{Comment: comment, Revision: d.Revision, Conflicts: all, Service: toEditService(merged, nodes)})
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, out); err != nil {
		return err
	}
	if err := writeFileAtomic(basePath, current); err != nil {
		return err
	}
	if len(conflicts) > 0 {
		var msg strings.Builder
		fmt.Fprintf(&msg, "your kept edit conflicts with changes saved since it was made (revision %s, now %s):", kept.Revision, d.Revision)
		for _, cf := range conflicts {
			fmt.Fprintf(&msg, "\n  %s: base %s, yours %s, theirs %s", cf.Path, conflictValue(cf.Base), conflictValue(cf.Yours), conflictValue(cf.Theirs))
		}
		msg.WriteString("\nyour other changes are applied onto the current configuration; the file holds yours where they conflict: resolve each, delete \"conflicts\" and run the edit again")
		return &editError{path: path, code: ExitConflict, err: errors.New(msg.String())}
	}
	fmt.Fprintf(c.env.Stderr, "tsng: the service changed since your kept edit %s was made (revision %s, now %s); your changes are applied onto the current configuration: review and save\n", path, kept.Revision, d.Revision)
	return nil
}

func conflictValue(v json.RawMessage) string {
	if len(v) == 0 {
		return "absent"
	}
	return string(v)
}

// parseEdit reads an edited file: syntax first, with positions in the
// file as the user sees it, then the fields, then the backends' nodes.
func parseEdit(b []byte, nodes []NodeDoc) (editFile, vip.Service, error) {
	var syntax json.RawMessage
	if err := json.Unmarshal(b, &syntax); err != nil {
		return editFile{}, vip.Service{}, jsonError(b, err)
	}
	var ef editFile
	if err := jsonx.Decode(b, &ef); err != nil {
		return editFile{}, vip.Service{}, jsonError(b, err)
	}
	svc, err := fromEditService(ef.Service, nodes)
	var ne *nodeSelError
	if errors.As(err, &ne) {
		q, _ := json.Marshal(ne.sel)
		if loc := regexp.MustCompile(`"node"\s*:\s*` + regexp.QuoteMeta(string(q))).FindIndex(b); loc != nil {
			err = fmt.Errorf("line %d: %w", 1+bytes.Count(b[:loc[0]], []byte{'\n'}), err)
		}
	}
	return ef, svc, err
}

// nodeSelError is a backend node of the edit file that selects no one
// member.
type nodeSelError struct {
	sel string
	err error
}

func (e *nodeSelError) Error() string { return e.err.Error() }
func (e *nodeSelError) Unwrap() error { return e.err }

// writeFileAtomic replaces path with data through a file of mode 0600 in
// the same directory.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// nodeLabel is how the edit file names node id: by its name when that
// name selects id and nothing else, else by the id (a node without a
// name, with a name another node shares, or no member).
func nodeLabel(nodes []NodeDoc, id vip.NodeID) string {
	for _, n := range nodes {
		if n.ID == id && n.Name != "" {
			if got, err := resolveNode(nodes, n.Name); err == nil && got == id.String() {
				return n.Name
			}
			break
		}
	}
	return id.String()
}

func toEditBackends(nodes []NodeDoc, bs []vip.Backend) []editBackend {
	out := make([]editBackend, 0, len(bs))
	for _, b := range bs {
		out = append(out, editBackend{Node: nodeLabel(nodes, b.Node), Port: b.Port})
	}
	return out
}

func toEditListener(l vip.Listener, nodes []NodeDoc) editListener {
	el := editListener{Proto: l.Proto, Port: l.Port, Generation: l.Generation, Backends: toEditBackends(nodes, l.Backends),
		Check: l.Check, IdleTimeout: l.IdleTimeout}
	if len(l.Drain) > 0 {
		el.Drain = toEditBackends(nodes, l.Drain)
	}
	return el
}

func toEditService(s vip.Service, nodes []NodeDoc) editService {
	es := editService{ID: s.ID, Name: s.Name, Listeners: make([]editListener, 0, len(s.Listeners))}
	for _, l := range s.Listeners {
		es.Listeners = append(es.Listeners, toEditListener(l, nodes))
	}
	return es
}

// fromEditService resolves the backends' nodes of an edited service; an
// error names the listener and the node as written.
func fromEditService(es editService, nodes []NodeDoc) (vip.Service, error) {
	s := vip.Service{ID: es.ID, Name: es.Name, Network: es.Network}
	resolve := func(k vip.PortKey, what string, in []editBackend) ([]vip.Backend, error) {
		var out []vip.Backend
		for _, b := range in {
			hex, err := resolveNode(nodes, b.Node)
			if err != nil {
				return nil, &nodeSelError{sel: b.Node, err: fmt.Errorf("listener %s: %s: %w", k, what, err)}
			}
			id, _ := vip.ParseNodeID(hex)
			out = append(out, vip.Backend{Node: id, Port: b.Port})
		}
		return out, nil
	}
	for _, el := range es.Listeners {
		l := vip.Listener{Proto: el.Proto, Port: el.Port, Generation: el.Generation, Check: el.Check, IdleTimeout: el.IdleTimeout}
		var err error
		if l.Backends, err = resolve(l.Key(), "backends", el.Backends); err != nil {
			return vip.Service{}, err
		}
		if l.Drain, err = resolve(l.Key(), "drain", el.Drain); err != nil {
			return vip.Service{}, err
		}
		s.Listeners = append(s.Listeners, l)
	}
	return s, nil
}

// resolveNode maps a backend node selector (a node name, a full id or a
// unique id prefix) to the node's id in hex. A full id is taken as it is,
// member or not: the backend of a departed node keeps its id in the file,
// and the agent decides whether it may stay. A name two members share is
// ambiguous.
func resolveNode(nodes []NodeDoc, sel string) (string, error) {
	if id, err := vip.ParseNodeID(strings.ToLower(sel)); err == nil {
		return id.String(), nil
	}
	var match []string
	for _, n := range nodes {
		if n.Name != "" && n.Name == sel {
			match = append(match, n.ID.String())
		}
	}
	if len(match) == 0 && sel != "" {
		for _, n := range nodes {
			if strings.HasPrefix(n.ID.String(), sel) {
				match = append(match, n.ID.String())
			}
		}
	}
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		return "", fmt.Errorf("backend node %q: no node has that name or id", sel)
	}
	return "", fmt.Errorf("backend node %q: ambiguous, matches %s", sel, strings.Join(match, ", "))
}

// runUserEditor runs $VISUAL, $EDITOR or vi on path, with the terminal.
func runUserEditor(ctx context.Context, getenv func(string) string, path string) error {
	ed := getenv("VISUAL")
	if ed == "" {
		ed = getenv("EDITOR")
	}
	if ed == "" {
		ed = "vi"
	}
	// The variable may carry arguments ("code --wait").
	parts := strings.Fields(ed)
	cmd := exec.CommandContext(ctx, parts[0], append(parts[1:], path)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	return cmd.Run()
}

// rebase applies the changes of yours (from base) onto theirs, the
// current service, per field, listener and backend. A listener is known by
// its protocol and port; a backend of a listener is absent, present or
// draining. Where yours and theirs both changed one thing to different
// values, the result holds yours and the conflict is returned, its values
// in the edit file's form.
func rebase(base, yours, theirs vip.Service, nodes []NodeDoc) (vip.Service, []editConflict) {
	var cs []editConflict
	raw := func(v any) json.RawMessage {
		if v == nil {
			return nil
		}
		b, _ := json.Marshal(v)
		return b
	}
	conflict := func(path string, b, y, t any) {
		cs = append(cs, editConflict{Path: path, Base: raw(b), Yours: raw(y), Theirs: raw(t)})
	}
	out := theirs.Clone()
	out.Name = merge3("name", base.Name, yours.Name, theirs.Name, conflict)
	out.Listeners = nil
	var keys []vip.PortKey
	for _, l := range theirs.Listeners {
		keys = append(keys, l.Key())
	}
	for _, l := range yours.Listeners {
		if !slices.Contains(keys, l.Key()) {
			keys = append(keys, l.Key())
		}
	}
	listener := func(l vip.Listener, ok bool) any {
		if !ok {
			return nil
		}
		return toEditListener(l, nodes)
	}
	for _, k := range keys {
		bl, bok := listenerOf(base, k)
		yl, yok := listenerOf(yours, k)
		tl, tok := listenerOf(theirs, k)
		path := "listeners[" + k.String() + "]"
		switch {
		case yok && tok:
			if !bok {
				bl = vip.Listener{Proto: k.Proto, Port: k.Port}
			}
			out.Listeners = append(out.Listeners, mergeListener(path, bl, yl, tl, nodes, conflict))
		case yok: // theirs removed it, or yours added it
			if bok && !sameListener(bl, yl) {
				conflict(path, listener(bl, bok), listener(yl, yok), nil)
			}
			if !bok || !sameListener(bl, yl) {
				out.Listeners = append(out.Listeners, yl)
			}
		case tok: // yours removed it, or theirs added it
			if bok && !sameListener(bl, tl) {
				conflict(path, listener(bl, bok), nil, listener(tl, tok))
			}
			if !bok {
				out.Listeners = append(out.Listeners, tl)
			}
		}
	}
	return out, cs
}

func listenerOf(s vip.Service, k vip.PortKey) (vip.Listener, bool) {
	if l, ok := s.Listener(k); ok {
		return *l, true
	}
	return vip.Listener{}, false
}

// merge3 is the three-way merge of one value: a side that left it as in
// base takes the other's.
func merge3[T comparable](path string, b, y, t T, conflict func(path string, b, y, t any)) T {
	switch {
	case y == b:
		return t
	case t == b || t == y:
		return y
	}
	var zero T
	show := func(v T) any {
		if v == zero {
			return nil
		}
		return v
	}
	conflict(path, show(b), show(y), show(t))
	return y
}

// sameListener reports whether two listeners are the same configuration,
// in whatever order their backends are listed.
func sameListener(a, b vip.Listener) bool {
	norm := func(l vip.Listener) vip.Listener {
		l.Generation = 0
		l.Backends = slices.Clone(l.Backends)
		l.Drain = slices.Clone(l.Drain)
		cmp := func(x, y vip.Backend) int {
			if c := bytes.Compare(x.Node[:], y.Node[:]); c != 0 {
				return c
			}
			return int(x.Port) - int(y.Port)
		}
		slices.SortFunc(l.Backends, cmp)
		slices.SortFunc(l.Drain, cmp)
		if len(l.Drain) == 0 {
			l.Drain = nil
		}
		if len(l.Backends) == 0 {
			l.Backends = nil
		}
		return l
	}
	x, _ := json.Marshal(norm(a))
	y, _ := json.Marshal(norm(b))
	return bytes.Equal(x, y)
}

func mergeListener(path string, b, y, t vip.Listener, nodes []NodeDoc, conflict func(string, any, any, any)) vip.Listener {
	r := t
	portCheck := func(c vip.Check) string {
		if c.PortCheck == nil {
			return ""
		}
		if *c.PortCheck {
			return "on"
		}
		return "off"
	}
	switch merge3(path+".check.port_check", portCheck(b.Check), portCheck(y.Check), portCheck(t.Check), conflict) {
	case "":
		r.Check.PortCheck = nil
	case "on":
		on := true
		r.Check.PortCheck = &on
	case "off":
		off := false
		r.Check.PortCheck = &off
	}
	r.Check.Interval = merge3(path+".check.interval", b.Check.Interval, y.Check.Interval, t.Check.Interval, conflict)
	r.Check.Timeout = merge3(path+".check.timeout", b.Check.Timeout, y.Check.Timeout, t.Check.Timeout, conflict)
	r.Check.Failures = merge3(path+".check.failures", b.Check.Failures, y.Check.Failures, t.Check.Failures, conflict)
	r.Check.Successes = merge3(path+".check.successes", b.Check.Successes, y.Check.Successes, t.Check.Successes, conflict)
	r.IdleTimeout = merge3(path+".idle_timeout", b.IdleTimeout, y.IdleTimeout, t.IdleTimeout, conflict)

	// Each backend: "" absent, "present" or "draining".
	state := func(l vip.Listener, be vip.Backend) string {
		switch {
		case l.Draining(be) && slices.Contains(l.Backends, be):
			return "draining"
		case slices.Contains(l.Backends, be):
			return "present"
		}
		return ""
	}
	var all []vip.Backend
	for _, l := range []vip.Listener{t, y, b} {
		for _, be := range l.Backends {
			if !slices.Contains(all, be) {
				all = append(all, be)
			}
		}
	}
	r.Backends, r.Drain = []vip.Backend{}, nil
	for _, be := range all {
		p := fmt.Sprintf("%s.backends[%s:%d]", path, nodeLabel(nodes, be.Node), be.Port)
		switch merge3(p, state(b, be), state(y, be), state(t, be), conflict) {
		case "draining":
			r.Drain = append(r.Drain, be)
			fallthrough
		case "present":
			r.Backends = append(r.Backends, be)
		}
	}
	return r
}
