package wg

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// UAPIServer answers the WireGuard configuration protocol's get
// operation for one Device on a Unix socket, so that `wg show` and
// `wg showconf` work. It refuses set operations: a `wg set` would put the
// device out of step with whoever configures it (tsng's config file).
type UAPIServer struct {
	d     *Device
	ln    *net.UnixListener
	lock  *os.File // dir/name.lock, flocked while the server runs
	path  string
	log   *slog.Logger
	clock transport.Clock

	// mu guards conns, the connections being served, and closed.
	mu syncx.Mutex
	// +checklocks:mu
	conns map[net.Conn]bool
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup
}

// uapiMaxRequest bounds one request's text; a get is a single line.
const uapiMaxRequest = 64 << 10

// ServeUAPI listens on Dir/name.sock, mode 0600, and serves get
// operations until Close. It must run as root: the directory is created
// with mode 0700 if missing, and an existing one must be a directory
// owned by root that no one else may write to (ErrUAPIDir otherwise). A
// stale socket of a process that is gone is replaced; a live one is an
// error (ErrUAPIInUse), and so is a name another ServeUAPI holds: each
// server keeps Dir/name.lock locked while it runs. Connections are
// accepted only from processes of root or of this process's user
// (SO_PEERCRED).
func (d *Device) ServeUAPI(name string, o UAPIOptions) (*UAPIServer, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || len(name) > 15 {
		return nil, fmt.Errorf("wg: UAPI name %q: want an interface name (1-15 bytes, no /)", name)
	}
	dir := o.Dir
	if dir == "" {
		dir = UAPIDir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("wg: UAPI socket directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("wg: UAPI socket directory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("%w: %s (owner %d, mode %o)", ErrUAPIDir, dir, st.Uid, st.Mode&0o7777)
	}
	// The lock file keeps the name taken for as long as this server
	// runs, even if the socket file is removed under it, and makes the
	// check-then-listen below safe against a second start racing this one.
	lock, err := lockUAPIName(dir, name)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name+".sock")
	ln, err := listenUAPI(path)
	if err != nil {
		unlockUAPIName(lock)
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &UAPIServer{d: d, ln: ln, lock: lock, path: path, log: log, clock: transport.Or(o.Clock), conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Path returns the socket's path.
func (s *UAPIServer) Path() string { return s.path }

// Close stops the server, removes the socket and waits for its
// connections.
func (s *UAPIServer) Close() error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	// After the socket is gone, so that the next holder of the lock
	// finds the name free; only once, since the file may be another
	// server's by a second Close.
	if first {
		unlockUAPIName(s.lock)
	}
	return err
}

// lockUAPIName takes dir/name.lock (flock, not waiting). wg(8) lists only
// the directory's .sock files, so the lock file adds no device to `wg show`.
// The holder removes the file when it lets go (unlockUAPIName), so a lock
// taken on a file that has meanwhile left the path is worthless: it is
// dropped and the path's current file tried again.
func lockUAPIName(dir, name string) (*os.File, error) {
	lp := filepath.Join(dir, name+".lock")
	for range 8 {
		f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("wg: UAPI lock file: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %s is served by another process (its lock %s is held)", ErrUAPIInUse, filepath.Join(dir, name+".sock"), lp)
			}
			return nil, fmt.Errorf("wg: UAPI lock file %s: %w", lp, err)
		}
		var held, now unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("wg: UAPI lock file %s: %w", lp, err)
		}
		if unix.Lstat(lp, &now) == nil && now.Dev == held.Dev && now.Ino == held.Ino {
			return f, nil
		}
		f.Close() // its holder removed it between our open and our lock
	}
	return nil, fmt.Errorf("%w: %s keeps changing (another process takes and releases the name)", ErrUAPIInUse, lp)
}

// unlockUAPIName removes the lock file while still holding it, then
// releases it.
func unlockUAPIName(f *os.File) {
	os.Remove(f.Name())
	f.Close()
}

// listenUAPI listens on path, with the name's lock held. A socket that
// answers belongs to a process that does not take the lock (wireguard-go,
// another implementation): the name is in use. One that refuses is a dead
// process's and is replaced. Any other answer leaves it alone.
func listenUAPI(path string) (*net.UnixListener, error) {
	c, err := net.Dial("unix", path)
	switch {
	case err == nil:
		c.Close()
		return nil, fmt.Errorf("%w: %s is served by another process", ErrUAPIInUse, path)
	case errors.Is(err, syscall.ECONNREFUSED):
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			os.Remove(path) // a dead process's socket
		}
	case errors.Is(err, syscall.ENOENT):
	default:
		return nil, fmt.Errorf("wg: UAPI socket %s: checking for another server: %w", path, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("wg: UAPI socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	// The directory is root's alone, so nobody can reach the socket
	// before its mode is set.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("wg: UAPI socket: %w", err)
	}
	return ln, nil
}

func (s *UAPIServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		if !peerAllowed(c) {
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.serve(c)
		}()
	}
}

// peerAllowed accepts root and this process's own user.
func peerAllowed(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == 0 || int(cred.Uid) == os.Geteuid()
}

// serve answers operations on one connection: "get=1" with the device's
// state, "set=1" with EPERM (and a log line saying why). As in
// wireguard-go, errno is the negated error number.
func (s *UAPIServer) serve(c net.Conn) {
	r := bufio.NewReaderSize(io.LimitReader(c, uapiMaxRequest), 512)
	for {
		_ = c.SetDeadline(s.clock.Now().Add(10 * time.Second))
		op, err := r.ReadString('\n')
		if err != nil {
			return
		}
		switch strings.TrimSpace(op) {
		case "get=1":
			if !drainBlank(r) {
				return
			}
			text, err := s.d.dev.IpcGet()
			errno := 0
			if err != nil {
				text, errno = "", -int(syscall.EIO)
			}
			if _, err := fmt.Fprintf(c, "%serrno=%d\n\n", text, errno); err != nil {
				return
			}
		case "set=1":
			if !drainBlank(r) {
				return
			}
			s.log.Warn("wg: refused a set on the UAPI socket (wg set): the agent's config owns this device; change the config file instead", "socket", s.path)
			if _, err := fmt.Fprintf(c, "errno=%d\n\n", -int(syscall.EPERM)); err != nil {
				return
			}
		default:
			fmt.Fprintf(c, "errno=%d\n\n", -int(syscall.EINVAL))
			return
		}
	}
}

// drainBlank reads the rest of an operation, up to its blank line.
func drainBlank(r *bufio.Reader) bool {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		if line == "\n" {
			return true
		}
	}
}
