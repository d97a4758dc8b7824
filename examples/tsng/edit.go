package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/vip"
)

// editFile is what `tsng vip edit` puts in the editor.
type editFile struct {
	Comment  string       `json:"_comment,omitempty"`
	Revision vip.Revision `json:"revision"`
	Service  vip.Service  `json:"service"`
}

// editError ends an edit whose file was kept.
type editError struct {
	path string
	err  error
	code int
}

func (e *editError) Error() string {
	return fmt.Sprintf("%v\nyour edit is kept in %s (fix it and run the edit again, which reopens this file; or delete it to start from the current configuration)", e.err, e.path)
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

// nodeField finds the backends' "node" values in an edit file.
var nodeField = regexp.MustCompile(`"node"(\s*):(\s*)"([^"\\]*)"`)

func runEdit(ctx context.Context, c *cliCtx, _ *opts, a []string) error {
	var d ServiceDoc
	if err := c.client.Do(ctx, http.MethodGet, vipPath(a[0], a[1]), nil, &d); err != nil {
		return err
	}
	var nodes []NodeDoc
	if err := c.client.Do(ctx, http.MethodGet, "/v1/networks/"+url.PathEscape(a[0])+"/nodes", nil, &nodes); err != nil {
		return err
	}
	comment := "Edit the service and save. The whole file is one draft, saved only if the service is still at this revision. A backend's node is a node name, id or unique id prefix. A check field left out or 0 takes its default (3s interval, 2s timeout, 2 failures, 1 success); idle_timeout 0 is the protocol's default (7200s TCP, 120s UDP). Nodes:"
	for _, n := range nodes {
		comment += fmt.Sprintf(" %s = %s;", n.Name, n.ID)
	}
	orig, err := json.MarshalIndent(editFile{Comment: strings.TrimSuffix(comment, ";"), Revision: d.Revision, Service: d.Service}, "", "  ")
	if err != nil {
		return err
	}
	path := keptEditPath(c.env.Getenv, d.Network, d.ID)
	reopened := false
	if path != "" {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
			reopened = true
			fmt.Fprintf(c.env.Stderr, "tsng: reopening your kept edit %s (delete it to start from the current configuration)\n", path)
		}
	}
	if !reopened {
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
		_, err = f.Write(append(orig, '\n'))
		if cerr := f.Close(); err == nil {
			err = cerr
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
	if !reopened && bytes.Equal(bytes.TrimSpace(edited), bytes.TrimSpace(orig)) {
		os.Remove(path)
		fmt.Fprintln(c.env.Stderr, "tsng: no changes")
		return nil
	}
	invalid := func(err error) error {
		return &editError{path: path, err: fmt.Errorf("the edited file is not valid: %w", err), code: ExitInvalid}
	}
	// Syntax first, with positions in the file as the user sees it.
	var any json.RawMessage
	if err := json.Unmarshal(edited, &any); err != nil {
		return invalid(jsonError(edited, err))
	}
	// Node names (or id prefixes) to ids; lines stay where they are.
	var resolveErr error
	resolved := nodeField.ReplaceAllFunc(edited, func(m []byte) []byte {
		sub := nodeField.FindSubmatch(m)
		id, err := resolveNode(nodes, string(sub[3]))
		if err != nil && resolveErr == nil {
			line := 1 + bytes.Count(edited[:bytes.Index(edited, m)], []byte{'\n'})
			resolveErr = fmt.Errorf("line %d: %w", line, err)
		}
		return []byte(`"node"` + string(sub[1]) + ":" + string(sub[2]) + `"` + id + `"`)
	})
	if resolveErr != nil {
		return invalid(resolveErr)
	}
	var ef editFile
	if err := jsonx.Decode(resolved, &ef); err != nil {
		return invalid(jsonError(resolved, err))
	}
	var saved ServiceDoc
	if err := c.client.Do(ctx, http.MethodPut, vipPath(a[0], d.ID.String()), SaveRequest{Service: ef.Service, Revision: ef.Revision}, &saved); err != nil {
		code := ExitError
		if ae, ok := err.(*APIError); ok {
			code = ExitCode(ae.Code)
			if ae.Current != "" {
				err = fmt.Errorf("%s (current revision %s)", strings.TrimPrefix(ae.Message, "tsng: "), ae.Current)
			}
		}
		return &editError{path: path, err: fmt.Errorf("the draft was refused: %w", err), code: code}
	}
	os.Remove(path)
	return printDoc(c, saved)
}

// resolveNode maps a backend node selector (a node name, a full id or a
// unique id prefix) to the node's id in hex. A full id is taken as it is,
// member or not: the backend of a departed node keeps its id in the file,
// and the agent decides whether it may stay.
func resolveNode(nodes []NodeDoc, sel string) (string, error) {
	if id, err := vip.ParseNodeID(strings.ToLower(sel)); err == nil {
		return id.String(), nil
	}
	for _, n := range nodes {
		if n.Name == sel || n.ID.String() == sel {
			return n.ID.String(), nil
		}
	}
	var match []string
	if sel != "" {
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
