//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// RunDir is where named network namespaces are bind-mounted, as by
// `ip netns add`. A Host named N lives at RunDir/N, so `ip netns exec N ...`
// works on it.
const RunDir = "/run/netns"

// NamePrefix starts every name that UniqueName makes. Sweep removes only
// namespaces with this prefix.
const NamePrefix = "vk-"

// maxNameLen bounds a namespace name (a file name under RunDir).
const maxNameLen = 64

var (
	// ErrClosed is returned by operations on a Host (or a Switch, a Link, a
	// WireGuard) after its Close. It matches transport.ErrClosed (and so
	// net.ErrClosed).
	ErrClosed = fmt.Errorf("netns: host closed: %w", transport.ErrClosed)

	// ErrInvalidName is returned by NewHost and UniqueName for a name or label
	// that is empty where one is needed, too long, or has characters other
	// than letters, digits, '-', '_' and '.'.
	ErrInvalidName = errors.New("netns: invalid name")

	// ErrExists is returned by NewHost when a namespace of that name is
	// already mounted under RunDir.
	ErrExists = errors.New("netns: namespace already exists")

	// ErrThreadLost is returned by Do (joined with f's own error) when the
	// thread that ran f could not be switched back to its original
	// namespace. The thread was discarded, so no other goroutine ever runs in
	// the wrong namespace; the error only reports it.
	ErrThreadLost = errors.New("netns: could not restore thread namespace; thread discarded")
)

var nameSeq atomic.Uint64

// UniqueName returns a namespace name unique to this process and call:
// "vk-<pid>-<n>", followed by "-<label>" when label is not empty. The pid in
// the name lets Sweep tell namespaces of live processes from those a killed
// run left behind. It returns ErrInvalidName for a label that is too long or
// has characters other than letters, digits, '-', '_' and '.'.
func UniqueName(label string) (string, error) {
	name := NamePrefix + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(nameSeq.Add(1), 10)
	if label != "" {
		name += "-" + label
	}
	if err := checkName(name); err != nil {
		return "", err
	}
	return name, nil
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > maxNameLen {
		return fmt.Errorf("%w: %q (1 to %d characters)", ErrInvalidName, name, maxNameLen)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return fmt.Errorf("%w: %q has %q (letters, digits, '-', '_', '.')", ErrInvalidName, name, c)
		}
	}
	return nil
}

// Host is a named Linux network namespace used as a test host: its own
// interfaces (loopback up from the start), addresses, routes and sockets.
// Links (Connect, Switch), a kernel TUN with wireguard-go (StartWireGuard) and
// child processes (Start, StartChild) are added to it, and Close removes all
// of them with the namespace.
//
// A Host is made by NewHost (or NewHostT in tests); it has no useful zero
// value. Its methods are safe for concurrent use. Everything it made is torn
// down by Close, which is idempotent; after Close other methods return
// ErrClosed.
type Host struct {
	name string
	path string
	ino  uint64

	// mu guards fd, closed, cleanup and ifSeq. A thread entering the
	// namespace holds it for reading, so Close cannot close fd under it.
	mu syncx.RWMutex
	// +checklocks:mu
	fd int
	// +checklocks:mu
	closed bool
	// nl is set by NewHost and closed by Close, after closed is set.
	nl *netlink.Handle
	// cleanup is run in reverse order by Close.
	// +checklocks:mu
	cleanup []func() error
	// ifSeq is the number of the next ethN.
	// +checklocks:mu
	ifSeq int
}

// NewHost creates a network namespace called name (UniqueName("") when name
// is empty), bind-mounted at RunDir/name the way `ip netns add` does it, and
// brings its loopback interface up. Interfaces added later skip IPv6
// duplicate address detection (accept_dad=0), so their addresses, link-local
// ones included, are usable at once. It needs root (CAP_SYS_ADMIN).
//
// The namespace exists until Close, or until the process dies: a killed test
// leaves it mounted, and Sweep removes it later. It returns ErrInvalidName,
// ErrExists, or the system's error.
func NewHost(ctx context.Context, name string) (*Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if name == "" {
		var err error
		if name, err = UniqueName(""); err != nil {
			return nil, err
		}
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := prepareRunDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(RunDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: %s", ErrExists, path)
		}
		return nil, fmt.Errorf("netns: create %s: %w", path, err)
	}
	f.Close()

	fd, err := createNamespace(path)
	if err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		_ = unmount(path)
		return nil, fmt.Errorf("netns: stat %s: %w", path, err)
	}
	h := &Host{name: name, path: path, fd: fd, ino: st.Ino}
	err = h.Do(func() error {
		var err error
		h.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("netns: netlink in %s: %w", name, err)
		}
		lo, err := h.nl.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("netns: loopback of %s: %w", name, err)
		}
		if err := h.nl.LinkSetUp(lo); err != nil {
			return fmt.Errorf("netns: loopback up in %s: %w", name, err)
		}
		// No duplicate address detection on interfaces made later: an IPv6
		// address added without IFA_F_NODAD (a link-local address, or a VIP
		// that a test moves with netlink) would otherwise stay tentative,
		// and unusable, for a second or more. Without IPv6 there is nothing
		// to set.
		for _, conf := range []string{"default", "all"} {
			p := "/proc/sys/net/ipv6/conf/" + conf + "/accept_dad"
			if err := os.WriteFile(p, []byte("0"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("netns: %s in %s: %w", p, name, err)
			}
		}
		return nil
	})
	if err != nil {
		_ = h.Close()
		return nil, err
	}
	return h, nil
}

// createNamespace unshares a new network namespace on a locked thread, binds
// it to path, and returns an open descriptor of it. The thread is moved back
// to its namespace, or discarded if that fails.
func createNamespace(path string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		orig, err := lockAndEnter(func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("netns: unshare: %w", err)
			}
			return nil
		})
		if err != nil {
			ch <- result{-1, err}
			return
		}
		r := result{fd: -1}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			r.err = fmt.Errorf("netns: bind-mount %s: %w", path, err)
		} else if r.fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			r.err = fmt.Errorf("netns: open %s: %w", path, err)
			r.fd = -1
			_ = unmount(path)
		}
		if err := leave(orig); err != nil {
			// Leave the thread locked: it exits with this goroutine.
			if r.fd >= 0 {
				unix.Close(r.fd)
				_ = unmount(path)
			}
			ch <- result{-1, err}
			return
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	return r.fd, r.err
}

var (
	// runDirMu serialises prepareRunDir and guards runDirReady.
	runDirMu syncx.Mutex
	// runDirReady says prepareRunDir succeeded once in this process.
	// +checklocks:runDirMu
	runDirReady bool
)

// prepareRunDir makes RunDir exist and be a shared mount point, as iproute2
// does, so that namespace mounts propagate into mount namespaces made later
// (`ip netns exec` makes one). A file lock keeps concurrent processes from
// stacking two self-bind-mounts.
func prepareRunDir() error {
	runDirMu.Lock()
	defer runDirMu.Unlock()
	if runDirReady {
		return nil
	}
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(RunDir), ".vipkit-netns.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("netns: lock: %w", err)
	}
	bound := false
	for {
		err := unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			runDirReady = true
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("netns: make %s shared: %w", RunDir, err)
		}
		// Not a mount point yet: bind it onto itself, then retry.
		if err := unix.Mount(RunDir, RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netns: bind %s: %w", RunDir, err)
		}
		bound = true
	}
}

func unmount(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netns: unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns: remove %s: %w", path, err)
	}
	return nil
}

// Name returns the namespace's name (its file under RunDir).
func (h *Host) Name() string { return h.name }

// Path returns RunDir/Name, the namespace's bind mount.
func (h *Host) Path() string { return h.path }

// Inode returns the namespace's inode number: /proc/PID/ns/net of a process
// inside it reads "net:[Inode]".
func (h *Host) Inode() uint64 { return h.ino }

// String returns the name.
func (h *Host) String() string { return h.name }

// Netlink returns the host's rtnetlink handle, whose sockets live in the
// namespace: everything done through it (links, addresses, routes, neighbours)
// acts inside the host. It is safe for concurrent use and is closed by Close;
// do not close it yourself.
func (h *Host) Netlink() *netlink.Handle { return h.nl }

// Do runs f on an OS thread locked to the goroutine and switched into the
// host's namespace, and waits for it. Sockets, listeners, TUN devices and
// netlink sockets that f opens belong to the namespace for their whole life,
// whichever thread uses them later. Goroutines that f starts do not run in
// the namespace.
//
// Afterwards the thread is switched back; if that fails it is discarded
// (never returned to the scheduler) and Do reports ErrThreadLost joined with
// f's error. A panic in f is re-raised in Do's caller, and runtime.Goexit in
// f (t.Fatal, say) ends the caller's goroutine too, once the thread is
// restored. Do returns ErrClosed after Close. It is safe for concurrent use;
// f must not call Close on the same Host.
func (h *Host) Do(f func() error) error {
	type result struct {
		err      error
		panicked bool
		value    any
		goexit   bool
	}
	ch := make(chan result, 1)
	go func() {
		orig, err := lockAndEnter(h.enter)
		if err != nil {
			ch <- result{err: err}
			return
		}
		var r result
		returned := false
		defer func() {
			if !returned {
				// f panicked or called runtime.Goexit.
				if v := recover(); v != nil {
					r.panicked, r.value = true, v
				} else {
					r.goexit = true
				}
			}
			if err := leave(orig); err != nil {
				// Stay locked: the runtime terminates the thread when this
				// goroutine exits.
				r.err = errors.Join(r.err, err)
			} else {
				runtime.UnlockOSThread()
			}
			ch <- r
		}()
		r.err = f()
		returned = true
	}()
	r := <-ch
	switch {
	case r.panicked:
		panic(r.value)
	case r.goexit:
		runtime.Goexit()
	}
	return r.err
}

// lockAndEnter locks the calling goroutine to its OS thread and runs enter,
// which moves the thread into another network namespace. It returns a
// descriptor of the thread's own namespace, for leave. If it fails, the
// thread is where it was and unlocked again.
func lockAndEnter(enter func() error) (orig int, err error) {
	runtime.LockOSThread()
	orig, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("netns: open own namespace: %w", err)
	}
	if err := enter(); err != nil {
		unix.Close(orig)
		runtime.UnlockOSThread()
		return -1, err
	}
	return orig, nil
}

// leave moves the thread locked by lockAndEnter back into orig, and closes
// orig. The caller unlocks the thread once leave returns nil. An error wraps
// ErrThreadLost: the thread is still in the other namespace and must stay
// locked, so that the runtime discards it when its goroutine exits.
func leave(orig int) error {
	defer unix.Close(orig)
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("%w: %w", ErrThreadLost, err)
	}
	return nil
}

// enter switches the calling (locked) thread into the namespace.
func (h *Host) enter() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return fmt.Errorf("%w: %s", ErrClosed, h.name)
	}
	if err := unix.Setns(h.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("netns: enter %s: %w", h.name, err)
	}
	return nil
}

// onClose registers f to run at Close, before the namespace is removed and in
// reverse order of registration. It reports ErrClosed (and does not keep f)
// when the host is already closed.
func (h *Host) onClose(f func() error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fmt.Errorf("%w: %s", ErrClosed, h.name)
	}
	h.cleanup = append(h.cleanup, f)
	return nil
}

// OnClose registers f to run when the host closes, before its namespace is
// removed, in reverse order of registration (last registered, first run).
// Use it for sockets and servers opened with Do, which would otherwise keep
// the namespace alive after its name is gone. It returns ErrClosed after
// Close.
func (h *Host) OnClose(f func() error) error { return h.onClose(f) }

// Close tears down what was made in the host, newest first: child
// processes are killed with their groups, WireGuard devices and TUNs closed,
// links deleted (a veth's peer in another host goes with it), OnClose
// functions run. Then it closes the host's netlink handle and unmounts and
// removes the namespace. It returns the errors it met, joined; it is
// idempotent, and later calls return nil.
//
// The kernel frees the namespace when nothing refers to it any more: a
// socket opened with Do and never closed keeps it alive, nameless, until
// it is closed (register its Close with OnClose).
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	cleanup := h.cleanup
	h.cleanup = nil
	h.mu.Unlock()

	var errs []error
	for _, f := range slices.Backward(cleanup) {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	if h.nl != nil {
		h.nl.Close()
	}
	// No thread can be entering: enter holds the read lock and checks closed.
	h.mu.Lock()
	if h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
	h.mu.Unlock()
	if err := unmount(h.path); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Sweep removes namespaces under RunDir that UniqueName named for a process
// that no longer exists: what a killed or crashed run left behind (its
// cleanup never ran). Namespaces of live processes, and names that UniqueName
// did not make, are left alone. It returns the names it removed and the
// errors it met.
//
// A namespace that still has processes or open sockets in it loses its name
// but lives until they are gone; children started by this package die with
// their parent, so that does not outlast a killed run.
func Sweep(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		pid, ok := ownerPID(e.Name())
		if !ok || processAlive(pid) {
			continue
		}
		if err := unmount(filepath.Join(RunDir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// ownerPID parses the pid out of a UniqueName name.
func ownerPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, NamePrefix)
	if !ok {
		return 0, false
	}
	p, rest, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, _, _ := strings.Cut(rest, "-")
	// Only the canonical decimals that UniqueName writes: no sign, no
	// leading zeros.
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil || strconv.FormatUint(seq, 10) != n {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != p {
		return 0, false
	}
	return pid, true
}

// processAlive reports whether pid names a process (zombies included).
func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// List returns the names of the namespaces under RunDir, sorted.
func List() ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names, nil
}
