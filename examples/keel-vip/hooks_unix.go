//go:build unix

package keelvip

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// runHookCommand runs cfg's command with env in a process group of its
// own and kills the whole group when the command exits, when its timeout
// passes, or when ctx ends: a hook's background children end with it.
func runHookCommand(ctx context.Context, cfg Hooks, env []string) (hookResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	// The output is a pipe of our own: Wait returns as the command exits,
	// not when the last child holding the pipe does, so the group is
	// killed at once.
	pr, pw, err := os.Pipe()
	if err != nil {
		return hookResult{}, err
	}
	out := &limitedBuffer{max: HookOutputMax}
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(out, pr)
		pr.Close()
	}()
	cmd := exec.CommandContext(ctx, cfg.Command[0], cfg.Command[1:]...)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := wallNow()
	err = cmd.Start()
	pw.Close()
	if err != nil {
		<-read
		return hookResult{}, err
	}
	err = cmd.Wait()
	// The group goes too when the command ended by itself: its children
	// end with it, and with them the last writers of the pipe.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-read
	res := hookResult{took: wallNow().Sub(start), timedOut: errors.Is(ctx.Err(), context.DeadlineExceeded)}
	res.output, res.truncated = out.result()
	return res, err
}

// processPrivileged reports whether this process runs as root or holds a
// capability in its effective or permitted set (from /proc/self/status):
// such a process runs no hook.
func processPrivileged() bool {
	if os.Geteuid() == 0 {
		return true
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false // not Linux: the uid check is all there is
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && (k == "CapEff" || k == "CapPrm") && strings.Trim(strings.TrimSpace(v), "0") != "" {
			return true
		}
	}
	return false
}
