//go:build unix

package rmqtest

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
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// Server is a running test broker.
type Server struct {
	Dir string
	// Port, Dist and EPMD are the AMQP, distribution and epmd ports.
	// They are declared one a line: the analyzer misplaces the
	// annotations of a struct that declares several fields on one line.
	Port int
	Dist int
	EPMD int
	node string
	cred *syscall.Credential
	env  []string
	// epmd is started once by startOnce and stopped by Stop.
	epmd *exec.Cmd
	// mu guards the broker's process, its exit and its output.
	mu syncx.Mutex
	// +checklocks:mu
	broker *exec.Cmd
	// +checklocks:mu
	brokerDone chan error
	// +checklocks:mu
	log *bytes.Buffer
}

const bin = "/usr/lib/rabbitmq/bin/rabbitmq-server"

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start prepares a node and starts it; stop it with Stop. Its free ports
// are picked by binding port 0 and closing it, so another process may take
// one before the broker binds it: a start that fails is tried again, on
// new ports, up to three times.
func Start(ctx context.Context) (*Server, error) {
	var errs []error
	for i := 0; i < 3; i++ {
		s, err := startOnce(ctx)
		if err == nil {
			return s, nil
		}
		if errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startOnce(ctx context.Context) (*Server, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%w: %s: %v (install rabbitmq-server)", ErrUnavailable, bin, err)
	}
	epmd, err := exec.LookPath("epmd")
	if err != nil {
		return nil, fmt.Errorf("%w: epmd: %v", ErrUnavailable, err)
	}
	dir, err := os.MkdirTemp("", "vipkit-rmq-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir}
	fail := func(err error) (*Server, error) {
		s.Stop()
		return nil, err
	}
	uid, gid := os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("rabbitmq")
		if err != nil {
			return fail(fmt.Errorf("%w: running as root and no rabbitmq user: %v", ErrUnavailable, err))
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	for _, p := range []*int{&s.Port, &s.Dist, &s.EPMD} {
		if *p, err = freePort(); err != nil {
			return fail(err)
		}
	}
	s.node = fmt.Sprintf("vipkit%d@localhost", s.Port)
	conf := fmt.Sprintf(`listeners.tcp.default = 127.0.0.1:%d
log.console = false
log.file.level = warning
disk_free_limit.absolute = 10MB
vm_memory_high_watermark.absolute = 256MB
`, s.Port)
	files := map[string]string{
		"rabbitmq.conf":     conf,
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "",
		".erlang.cookie":    fmt.Sprintf("VIPKITTEST%dCOOKIE", s.Port),
	}
	for name, body := range files {
		mode := os.FileMode(0o644)
		if name == ".erlang.cookie" {
			mode = 0o400
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), mode); err != nil {
			return fail(err)
		}
	}
	for _, d := range []string{"mnesia", "log", "plugins-expand"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return fail(err)
		}
	}
	if s.cred != nil {
		err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, gid)
		})
		if err != nil {
			return fail(err)
		}
	}
	s.env = []string{
		"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL=C.UTF-8", "HOME=" + dir,
		"ERL_EPMD_PORT=" + strconv.Itoa(s.EPMD),
		"RABBITMQ_NODENAME=" + s.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(s.Port),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(s.Dist),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PLUGINS_EXPAND_DIR=" + filepath.Join(dir, "plugins-expand"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=" + filepath.Join(dir, "log", "rabbit.log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbit.pid"),
	}
	s.epmd = exec.Command(epmd, "-port", strconv.Itoa(s.EPMD), "-address", "127.0.0.1")
	s.epmd.Env = s.env
	s.epmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	if err := s.epmd.Start(); err != nil {
		return fail(fmt.Errorf("rmqtest: epmd: %w", err))
	}
	if err := s.start(ctx); err != nil {
		return fail(err)
	}
	return s, nil
}

// URL is the AMQP URL of the broker (the default guest user, which the
// broker allows from loopback).
func (s *Server) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", s.Port) }

func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	s.log = &bytes.Buffer{}
	cmd := exec.Command(bin)
	cmd.Dir, cmd.Env = s.Dir, s.env
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("rmqtest: start: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	s.broker, s.brokerDone = cmd, done
	s.mu.Unlock()
	// Ready once an AMQP connection opens. The wait is on a real server,
	// so on the real clock.
	clock := transport.RealClock{}
	deadline := clock.Now().Add(90 * time.Second)
	for {
		c, err := amqp.Dial(s.URL())
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("rmqtest: the broker exited (%v): %s", err, s.Log())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if !transport.Sleep(clock, 100*time.Millisecond, ctx.Done()) { // poll interval
			return ctx.Err()
		}
		if clock.Now().After(deadline) {
			return fmt.Errorf("rmqtest: the broker did not open its port: %v: %s", err, s.Log())
		}
	}
}

// Log returns what the broker wrote to its output and log file.
func (s *Server) Log() string {
	s.mu.Lock()
	out := s.log.String()
	s.mu.Unlock()
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log", "rabbit.log"))
	return out + string(b)
}

// stopBroker stops the node: SIGTERM (a clean shutdown), then SIGKILL to
// its process group after 60 s.
func (s *Server) stopBroker() error {
	s.mu.Lock()
	cmd, done := s.broker, s.brokerDone
	s.broker = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	expired := make(chan struct{}) // a real process: the real clock
	t := transport.RealClock{}.AfterFunc(60*time.Second, func() { close(expired) })
	defer t.Stop()
	select {
	case <-done:
	case <-expired:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return errors.New("rmqtest: the broker did not stop within 60s; killed")
	}
	// Whatever the node left in its group (erl_child_setup, inet_gethost).
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return nil
}

// Restart stops the node and starts it again on the same ports and data.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.stopBroker(); err != nil {
		return err
	}
	return s.start(ctx)
}

// StopBroker stops the node only (its data stays), for a test that starts
// it again with StartBroker.
func (s *Server) StopBroker() error { return s.stopBroker() }

// StartBroker starts a node stopped by StopBroker.
func (s *Server) StartBroker(ctx context.Context) error { return s.start(ctx) }

// Stop stops the node and its epmd and removes the directory.
func (s *Server) Stop() error {
	err := s.stopBroker()
	if s.epmd != nil && s.epmd.Process != nil {
		_ = syscall.Kill(-s.epmd.Process.Pid, syscall.SIGKILL)
		_ = s.epmd.Wait()
	}
	return errors.Join(err, os.RemoveAll(s.Dir))
}
