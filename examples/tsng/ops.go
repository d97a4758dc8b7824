package tsng

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/buildinfo"
)

// opsCommands are the commands for operating the agent.
func opsCommands() []*command {
	return []*command{
		{name: "version", short: "Print tsng's module version and VCS revision (also --version).", max: 0,
			run: func(_ context.Context, c *cliCtx, _ *opts, _ []string) error {
				fmt.Fprintln(c.env.Stdout, "tsng", buildinfo.Read())
				return nil
			}},
	}
}

// ErrLocked means another agent holds the data directory.
var ErrLocked = errors.New("tsng: another tsng is running")

// lockDataDir takes the data directory's lock (tsng.lock, flock) and
// writes this process's pid into it; the lock ends with the process or
// when the file is closed.
func lockDataDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, "tsng.lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("tsng: data_dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b[:n]))); perr == nil {
				return nil, fmt.Errorf("%w (pid %d) with data_dir %s", ErrLocked, pid, dir)
			}
			return nil, fmt.Errorf("%w with data_dir %s", ErrLocked, dir)
		}
		return nil, fmt.Errorf("tsng: data_dir lock %s: %w", p, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
