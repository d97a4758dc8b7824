package tsng

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// uiHandoffPoll is how often `tsng ui` asks whether the browser signed in.
const uiHandoffPoll = 100 * time.Millisecond

// runUI signs a browser in to the editor: it asks the agent for a one-time
// sign-in code, writes the sign-in page to a 0600 file in a fresh 0700
// directory, prints the editor's address (no secret) and the file's path,
// opens the file in a browser when asked, and waits until the code is used
// or expires, then removes the file.
func runUI(ctx context.Context, c *cliCtx, open bool) error {
	var h UIHandoff
	if err := c.client.Do(ctx, http.MethodPost, "/v1/ui/handoff", nil, &h); err != nil {
		return err
	}
	ttl := time.Duration(h.TTLMillis) * time.Millisecond
	path, remove, err := writeHandoffFile(handoffBase(c.env.Getenv), &h)
	if err != nil {
		return fmt.Errorf("tsng: ui: the sign-in page: %w", err)
	}
	defer remove()
	fmt.Fprintln(c.env.Stdout, h.URL)
	fmt.Fprintf(c.env.Stderr, "tsng ui: sign-in page %s (it signs one browser on this machine in, within %s)\n", path, ttl)
	if open && c.env.OpenBrowser != nil {
		if err := c.env.OpenBrowser(path); err != nil {
			return fmt.Errorf("tsng: ui: opening a browser: %w", err)
		}
	}
	return waitHandoff(ctx, c, h.ID, ttl)
}

// waitHandoff polls the agent until the code named id is used (nil) or
// expired (an error), and gives up a few seconds after ttl whatever the
// agent says.
func waitHandoff(ctx context.Context, c *cliCtx, id string, ttl time.Duration) error {
	sleep := c.env.Sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	deadline := time.Now().Add(ttl + 5*time.Second)
	for {
		var st UIHandoffState
		if err := c.client.Do(ctx, http.MethodGet, "/v1/ui/handoff/"+url.PathEscape(id), nil, &st); err != nil {
			return err
		}
		switch st.State {
		case UIHandoffUsed:
			return nil
		case UIHandoffExpired:
			return fmt.Errorf("tsng: ui: no browser opened the sign-in page within %s; run `tsng ui` again", ttl)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tsng: ui: the sign-in was not used within %s (the agent still calls it %q); run `tsng ui` again", ttl, st.State)
		}
		if err := sleep(ctx, uiHandoffPoll); err != nil {
			return err
		}
	}
}

// sleepCtx waits d, or until ctx ends (its error then): the CLI's sleep
// unless the environment provides one.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handoffBase is where the sign-in page's directory is made:
// $XDG_RUNTIME_DIR when it is a directory of this uid that no other may
// write, else the system's temporary directory (where the fresh directory's
// random name and mode 0700 keep others out).
func handoffBase(getenv func(string) string) string {
	if d := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		st, err := os.Lstat(d)
		if s, ok := statT(st, err); ok && st.IsDir() && st.Mode().Perm()&0o022 == 0 && int(s.Uid) == os.Geteuid() {
			return d
		}
	}
	return os.TempDir()
}

func statT(st os.FileInfo, err error) (*syscall.Stat_t, bool) {
	if err != nil {
		return nil, false
	}
	s, ok := st.Sys().(*syscall.Stat_t)
	return s, ok
}

// writeHandoffFile writes h's sign-in page to signin.html in a fresh
// directory under base, created 0700 (os.MkdirTemp); the file is created
// 0600 with O_EXCL and O_NOFOLLOW, so it is this process's new file and no
// link planted in its place. remove deletes the directory and the file.
func writeHandoffFile(base string, h *UIHandoff) (path string, remove func(), err error) {
	dir, err := os.MkdirTemp(base, "tsng-ui-")
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	if st, err := os.Lstat(dir); err != nil {
		remove()
		return "", nil, err
	} else if s, ok := statT(st, nil); !ok || !st.IsDir() || st.Mode().Perm()&0o077 != 0 || int(s.Uid) != os.Geteuid() {
		remove()
		return "", nil, fmt.Errorf("%s is not a private directory of this user (mode %v)", dir, st.Mode())
	}
	path = filepath.Join(dir, "signin.html")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		remove()
		return "", nil, err
	}
	_, err = fmt.Fprintf(f, `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<title>tsng — sign in to the VIP editor</title>
</head>
<body>
<form method="post" action="%s" id="signin">
<input type="hidden" name="code" value="%s">
<p>This page signs this browser in to the tsng VIP editor, once, within %s of <code>tsng ui</code>.
<button type="submit">Open the editor</button></p>
</form>
<script>document.getElementById("signin").submit();</script>
</body>
</html>
`, html.EscapeString(h.Action), html.EscapeString(h.Code), time.Duration(h.TTLMillis)*time.Millisecond)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		remove()
		return "", nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return path, remove, nil
}
