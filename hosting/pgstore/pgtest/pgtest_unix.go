//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running test server.
type Server struct {
	Dir  string
	Port int
	bin  string
	cred *syscall.Credential
	n    atomic.Int64
}

// BinDir returns the newest /usr/lib/postgresql/*/bin holding pg_ctl, or
// the directory of pg_ctl on PATH.
func BinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(m)))
	for _, d := range m {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("%w: no initdb/pg_ctl under /usr/lib/postgresql/*/bin or on PATH", ErrUnavailable)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = s.Dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "HOME=" + s.Dir}
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgtest: %s: %w: %s", name, err, out.Bytes())
	}
	return nil
}

// Start initialises and starts a server. Stop it with Stop.
func Start(ctx context.Context) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	dir, err := os.MkdirTemp("", "vipkit-pg-")
	if err != nil {
		return nil, err
	}
	s.Dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%w: running as root and no postgres user: %v", ErrUnavailable, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if s.Port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := s.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100", s.Port, dir)
	if err := s.run(ctx, "pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// ConnString returns the connection string of database db.
func (s *Server) ConnString(db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s sslmode=disable", s.Port, db)
}

// NewDatabase creates a fresh database and returns its connection string.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.n.Add(1))
	c, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return s.ConnString(name), nil
}

// Stop stops the server (fast shutdown) and removes its directory.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.run(ctx, "pg_ctl", "-D", filepath.Join(s.Dir, "data"), "-m", "fast", "-w", "stop")
	return errors.Join(err, os.RemoveAll(s.Dir))
}
