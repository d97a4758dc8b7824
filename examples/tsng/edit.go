package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"

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
	return fmt.Sprintf("%v\nyour edit is kept in %s (fix it and run the edit again, or copy from it)", e.err, e.path)
}

func (e *editError) Unwrap() error { return e.err }

func runEdit(ctx context.Context, c *cliCtx, _ *opts, a []string) error {
	var d ServiceDoc
	if err := c.client.Do(ctx, http.MethodGet, vipPath(a[0], a[1]), nil, &d); err != nil {
		return err
	}
	orig, err := json.MarshalIndent(editFile{
		Comment:  "Edit the service and save. The whole file is one draft, saved only if the service is still at this revision.",
		Revision: d.Revision, Service: d.Service,
	}, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp("", "tsng-edit-"+d.Network+"-"+d.Name+"-*.json")
	if err != nil {
		return err
	}
	path := f.Name()
	_, err = f.Write(append(orig, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
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
	if bytes.Equal(bytes.TrimSpace(edited), bytes.TrimSpace(orig)) {
		os.Remove(path)
		fmt.Fprintln(c.env.Stderr, "tsng: no changes")
		return nil
	}
	var ef editFile
	dec := json.NewDecoder(bytes.NewReader(edited))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ef); err != nil {
		return &editError{path: path, err: fmt.Errorf("the edited file is not valid: %w", err), code: ExitInvalid}
	}
	var saved ServiceDoc
	if err := c.client.Do(ctx, http.MethodPut, vipPath(a[0], d.ID.String()), SaveRequest{Service: ef.Service, Revision: ef.Revision}, &saved); err != nil {
		code := ExitError
		if ae, ok := err.(*APIError); ok {
			code = ExitCode(ae.Code)
			if ae.Current != "" {
				err = fmt.Errorf("%s (current revision %s)", ae.Message, ae.Current)
			}
		}
		return &editError{path: path, err: fmt.Errorf("the draft was refused: %w", err), code: code}
	}
	os.Remove(path)
	return printDoc(c, saved)
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
