package tsng

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

// attackReport is what the other uid learned from the process table and
// what it did with it.
type attackReport struct {
	// Read holds the /proc files of the named processes it could read.
	Read map[string]string `json:"read"`
	// Files is, for each absolute path in those processes' arguments,
	// "read" or the error that opening it gave.
	Files map[string]string `json:"files"`
	// Tried counts the secrets it tried.
	Tried int `json:"tried"`
	// Created names the secret (and where it was found) that created a
	// VIP, empty when none did.
	Created string `json:"created"`
	// Statuses are the answers it got, by attempt.
	Statuses []string `json:"statuses"`
}

// TestUIHandoffLocalUser plays issue #28's finding: `tsng ui` hands the
// editor to a browser started as a child process, and another local uid
// reads every /proc/PID/cmdline and /proc/PID/environ it may (those of the
// opener and of `tsng ui` itself among them), follows every path in their
// arguments, and tries whatever looks like a secret against the editor's
// API and its sign-in. It must create nothing. The opener is a stand-in
// for xdg-open started the way DefaultEnv starts it (sh, the target as its
// argument, this process's environment); it blocks until the test ends,
// so its /proc entry is there for the other uid to read. The test then
// plays the browser on the hand-off and checks that the sign-in works
// once, and that `tsng ui` cleans up.
func TestUIHandoffLocalUser(t *testing.T) {
	if testenv.OtherUserRole() == "attacker" {
		attackUI(t)
		return
	}
	d, f := uiDaemon(t)
	attacker := testenv.AsOtherUser(t, "TestUIHandoffLocalUser", "attacker")

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close(); pw.Close() })
	started := make(chan *exec.Cmd, 1)
	var target string
	env := &Env{OpenBrowser: func(to string) error {
		target = to
		cmd := exec.Command("sh", "-c", "read _", "xdg-open", to)
		cmd.Stdin = pr
		if err := cmd.Start(); err != nil {
			return err
		}
		started <- cmd
		return nil
	}}
	type result struct {
		code      int
		out, errs string
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		var out, errs bytes.Buffer
		env.Stdout, env.Stderr = &out, &errs
		env.Getenv = func(k string) string {
			if k == "TSNG_SOCKET" {
				return f.socket
			}
			return ""
		}
		code := Main(ctx, []string{"ui"}, env)
		done <- result{code, out.String(), errs.String()}
	}()
	var ended *result
	t.Cleanup(func() {
		cancel()
		if ended == nil {
			<-done
		}
	})
	var opener *exec.Cmd
	select {
	case opener = <-started:
	case r := <-done:
		ended = &r
		select {
		case opener = <-started:
		default:
			t.Fatalf("tsng ui ended without opening a browser: exit %d: %s%s", r.code, r.out, r.errs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tsng ui did not start the browser within 30s")
	}
	t.Cleanup(func() { pw.Close(); opener.Wait() })
	openerPID := strconv.Itoa(opener.Process.Pid)
	t.Logf("the opener runs as pid %s with argument %q", openerPID, target)

	attacker.Env = append(attacker.Env, "TSNG_UI_ADDR="+d.UIAddr(), "TSNG_UI_PIDS="+openerPID+" "+strconv.Itoa(os.Getpid()))
	out, err := attacker.Output()
	if err != nil {
		t.Fatalf("the other uid's process: %v\n%s", err, out)
	}
	var rep attackReport
	for _, l := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(l, "ATTACK "); ok {
			if err := json.Unmarshal([]byte(j), &rep); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmdline := "/proc/" + openerPID + "/cmdline"
	if rep.Read[cmdline] == "" {
		t.Fatalf("the other uid could not read %s, so the test shows nothing (read: %v)", cmdline, rep.Read)
	}
	t.Logf("the other uid read %s: %q; tried %d secrets: %v", cmdline, rep.Read[cmdline], rep.Tried, rep.Statuses)
	if rep.Created != "" {
		t.Fatalf("another uid created a VIP through POST /api/v1/networks/home/vips (201) with %s", rep.Created)
	}
	for _, v := range d.Runtime("home").Registry().List() {
		t.Errorf("a VIP exists after the attack: %q", v.Name)
	}
	if len(rep.Statuses) == 0 {
		t.Log("the other uid found nothing that looks like a secret")
	}

	// The opener's argument is the hand-off file: a regular file of this
	// uid, 0600, in a directory of this uid, 0700, that the other uid
	// could not open.
	if !filepath.IsAbs(target) {
		t.Fatalf("the browser was given %q, want the hand-off file's path", target)
	}
	st, err := os.Lstat(target)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Fatalf("hand-off file %s: mode %v uid %d, want a regular file 0600 of uid %d", target, st.Mode(), st.Sys().(*syscall.Stat_t).Uid, os.Geteuid())
	}
	dst, err := os.Lstat(filepath.Dir(target))
	if err != nil {
		t.Fatal(err)
	}
	if !dst.IsDir() || dst.Mode().Perm() != 0o700 || dst.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Fatalf("hand-off directory: mode %v uid %d, want a directory 0700 of uid %d", dst.Mode(), dst.Sys().(*syscall.Stat_t).Uid, os.Geteuid())
	}
	if e := rep.Files[target]; !strings.Contains(e, "permission denied") {
		t.Fatalf("the other uid opening the hand-off file: %q, want permission denied", e)
	}
	page, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	action, code := handoffForm(t, string(page))

	// Nothing of the token or the code is in any /proc file of the opener
	// or of `tsng ui` (this process), whoever may read them.
	for _, pid := range []string{openerPID, strconv.Itoa(os.Getpid())} {
		for _, name := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile("/proc/" + pid + "/" + name)
			if err != nil {
				t.Fatal(err)
			}
			if s := string(b); strings.Contains(s, d.ui.token) || strings.Contains(s, code) {
				t.Errorf("/proc/%s/%s holds the token or the code", pid, name)
			}
		}
	}

	// The browser posts the code from the file (Origin "null") and gets
	// the editor's session; `tsng ui` then removes the file and ends.
	status, body := postHandoff(t, action, code, "null")
	if status != http.StatusOK || !strings.Contains(body, d.ui.token) {
		t.Fatalf("the browser's sign-in: %d %s", status, body)
	}
	if ended == nil {
		select {
		case r := <-done:
			ended = &r
		case <-time.After(30 * time.Second):
			t.Fatal("tsng ui did not end within 30s of the sign-in")
		}
	}
	r := *ended
	if r.code != 0 {
		t.Fatalf("tsng ui: exit %d: %s%s", r.code, r.out, r.errs)
	}
	if want := "http://" + d.UIAddr() + "/\n"; r.out != want {
		t.Errorf("tsng ui printed %q, want only the editor's address %q", r.out, want)
	}
	if strings.Contains(r.out+r.errs, d.ui.token) || strings.Contains(r.out+r.errs, code) {
		t.Errorf("tsng ui printed a secret: %s%s", r.out, r.errs)
	}
	if _, err := os.Lstat(filepath.Dir(target)); !os.IsNotExist(err) {
		t.Errorf("the hand-off directory is still there after the sign-in (%v)", err)
	}
	// The code worked once.
	status, body = postHandoff(t, action, code, "null")
	if status != http.StatusGone || !strings.Contains(body, "already used") || strings.Contains(body, d.ui.token) {
		t.Errorf("a replayed code: %d %s, want 410 already used", status, body)
	}
}

// attackUI is the other uid: it reads what /proc shows it and tries every
// secret it finds.
func attackUI(t *testing.T) {
	addr := os.Getenv("TSNG_UI_ADDR")
	named := map[string]bool{}
	for _, p := range strings.Fields(os.Getenv("TSNG_UI_PIDS")) {
		named["/proc/"+p] = true
	}
	rep := attackReport{Read: map[string]string{}, Files: map[string]string{}}
	var texts []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		for _, name := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(p + "/" + name)
			if err != nil || len(b) == 0 {
				continue
			}
			texts = append(texts, strings.ReplaceAll(string(b), "\x00", "\n"))
			if !named[p] {
				continue
			}
			rep.Read[p+"/"+name] = strings.ReplaceAll(string(b), "\x00", " ")
			if name != "cmdline" {
				continue
			}
			for _, a := range strings.Split(string(b), "\x00") {
				if !filepath.IsAbs(a) {
					continue
				}
				f, err := os.Open(a)
				if err != nil {
					rep.Files[a] = err.Error()
					continue
				}
				data, err := io.ReadAll(io.LimitReader(f, 1<<20))
				f.Close()
				if err != nil {
					rep.Files[a] = err.Error()
					continue
				}
				rep.Files[a] = "read"
				texts = append(texts, string(data))
			}
		}
	}
	secret := regexp.MustCompile(`[0-9a-fA-F]{32,}|(?:token|code)=([^&\s"']+)`)
	seen := map[string]bool{}
	var cands []string
	for _, s := range texts {
		for _, m := range secret.FindAllStringSubmatch(s, -1) {
			c := m[0]
			if m[1] != "" {
				c = m[1]
			}
			if !seen[c] && len(cands) < 200 {
				seen[c] = true
				cands = append(cands, c)
			}
		}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tryToken := func(tok, from string) {
		rep.Tried++
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/api/v1/networks/home/vips", strings.NewReader(fmt.Sprintf(`{"name":"evil%d"}`, rep.Tried)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(uiTokenHeader, tok)
		resp, err := hc.Do(req)
		if err != nil {
			rep.Statuses = append(rep.Statuses, err.Error())
			return
		}
		resp.Body.Close()
		rep.Statuses = append(rep.Statuses, "token "+resp.Status)
		if resp.StatusCode == http.StatusCreated {
			rep.Created = fmt.Sprintf("%q (%s)", tok, from)
		}
	}
	session := regexp.MustCompile(`name="tsng-session" content="([^"]+)"`)
	for _, c := range cands {
		tryToken(c, "as the token")
		resp, err := hc.PostForm("http://"+addr+"/handoff", url.Values{"code": {c}})
		if err != nil {
			rep.Statuses = append(rep.Statuses, err.Error())
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rep.Statuses = append(rep.Statuses, "code "+resp.Status)
		if m := session.FindStringSubmatch(string(b)); m != nil {
			tryToken(m[1], "from the sign-in of code "+c)
		}
	}
	j, _ := json.Marshal(rep)
	fmt.Println("ATTACK " + string(j))
}

// handoffForm returns the sign-in form's action and code from a hand-off
// file.
func handoffForm(t *testing.T, page string) (action, code string) {
	t.Helper()
	a := regexp.MustCompile(`<form [^>]*action="([^"]+)"`).FindStringSubmatch(page)
	c := regexp.MustCompile(`name="code" value="([^"]+)"`).FindStringSubmatch(page)
	if a == nil || c == nil {
		t.Fatalf("no sign-in form in the hand-off file:\n%s", page)
	}
	return a[1], c[1]
}

// postHandoff posts a code as the hand-off file's form does and returns the
// answer.
func postHandoff(t *testing.T, action, code, origin string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, action, strings.NewReader(url.Values{"code": {code}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
