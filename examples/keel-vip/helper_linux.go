//go:build linux

package keelvip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport/wg"
)

// socket paths under the run directory.
func ctlDir(m *Mesh) string     { return filepath.Join(m.RunDir, "ctl") }
func membersDir(m *Mesh) string { return filepath.Join(m.RunDir, "members") }

// AdminSocket returns the path of the helper's admin socket (root, 0600).
func AdminSocket(m *Mesh) string { return filepath.Join(m.RunDir, "admin.sock") }

// ExecEnv names the environment variable that makes DispatchExec run a
// subcommand of Main: the helper starts the controller and the listener by
// re-executing its own binary with it set.
const ExecEnv = "KEELVIP_EXEC"

// peerCred returns the SO_PEERCRED of a unix connection.
func peerCred(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("%w: not a unix socket", ErrPeerCred)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

// credListener accepts only the connections whose SO_PEERCRED check
// accepts (the controller's or the listener's process).
type credListener struct {
	net.Listener
	check func(*unix.Ucred) error
	onBad func(error)
}

func (l credListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cr, err := peerCred(c)
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrPeerCred, err)
		} else {
			err = l.check(cr)
		}
		if err != nil {
			l.onBad(err)
			c.Close()
			continue
		}
		return credConn{Conn: c, cred: *cr}, nil
	}
}

// credConn is an accepted connection with the SO_PEERCRED it was accepted
// on; the HTTP servers put it in each request's context (peerOf).
type credConn struct {
	net.Conn
	cred unix.Ucred
}

type credKey struct{}

// connContext is the servers' ConnContext: it keeps the peer's
// credentials for the handlers.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(credConn); ok {
		return context.WithValue(ctx, credKey{}, cc.cred)
	}
	return ctx
}

// peerOf returns the credentials of the peer that sent the request.
func peerOf(ctx context.Context) (unix.Ucred, bool) {
	cr, ok := ctx.Value(credKey{}).(unix.Ucred)
	return cr, ok
}

// pidPeer accepts the process pid() running as uid.
func pidPeer(pid func() int, uid uint32) func(*unix.Ucred) error {
	return func(cr *unix.Ucred) error {
		if want := pid(); int(cr.Pid) != want || cr.Uid != uid {
			return fmt.Errorf("%w: pid %d uid %d, want pid %d uid %d", ErrPeerCred, cr.Pid, cr.Uid, want, uid)
		}
		return nil
	}
}

// unitPeer accepts a process of the unit whose cgroup is cgroup, running
// as uid.
func unitPeer(cgroup string, uid uint32) func(*unix.Ucred) error {
	return func(cr *unix.Ucred) error {
		if cr.Uid != uid {
			return fmt.Errorf("%w: pid %d uid %d, want uid %d (%s)", ErrPeerCred, cr.Pid, cr.Uid, uid, cgroup)
		}
		got, err := procCgroup(int(cr.Pid))
		if err != nil {
			return fmt.Errorf("%w: pid %d: %v", ErrPeerCred, cr.Pid, err)
		}
		if !slices.Contains(got, cgroup) {
			return fmt.Errorf("%w: pid %d in cgroup %q, want %q", ErrPeerCred, cr.Pid, got, cgroup)
		}
		return nil
	}
}

// procCgroup returns the cgroup paths of pid: the unified hierarchy's
// ("0::PATH") and systemd's named v1 hierarchy's ("N:name=systemd:PATH")
// on a hybrid system.
func procCgroup(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		_, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		ctrl, path, ok := strings.Cut(rest, ":")
		if ok && (ctrl == "" || ctrl == "name=systemd") {
			out = append(out, path)
		}
	}
	return out, nil
}

// waitUnitDir waits for dir, the RuntimeDirectory= of a unit with a
// dynamic user: a 0700 directory owned by some user other than root. It
// returns that user.
func waitUnitDir(ctx context.Context, dir string) (uint32, error) {
	for {
		fi, err := os.Stat(dir)
		if err == nil {
			st := fi.Sys().(*syscall.Stat_t)
			if !fi.IsDir() || fi.Mode().Perm() != 0o700 || st.Uid == 0 {
				return 0, fmt.Errorf("keelvip: %s: mode %v owner %d, want a 0700 directory of the unit's user", dir, fi.Mode(), st.Uid)
			}
			return st.Uid, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("keelvip: waiting for %s: %w", dir, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The helper never changes an owner or a mode by path inside a directory
// another user owns: a racer with that user's uid could swap the name for
// a symlink between the helper's check and its chown, and have root hand
// it any file. Instead:
//
//   - Sockets are bound in a private staging directory (RunDir/.stage,
//     root's, 0700), chmodded there (no one else can reach that name),
//     and renamed into place: rename(2) replaces a name without following
//     a symlink at it. They stay root's; the 0700 directory of the child's
//     user is the file-system barrier, SO_PEERCRED the check.
//   - Directories are opened with O_NOFOLLOW|O_DIRECTORY and changed with
//     fchown/fchmod on that descriptor, inside parents checked to be
//     root's and writable by no one else (checkRootDir).
//   - The controller's copy of the pair record is created with
//     O_CREAT|O_EXCL|O_NOFOLLOW relative to the descriptor of the state
//     directory, written as root's 0644 (it holds only public keys and
//     signatures: the controller needs to read it, not own it), and
//     renamed into place relative to the same descriptor.

// stageDir returns the helper's private staging directory for sockets.
func stageDir(m *Mesh) string { return filepath.Join(m.RunDir, ".stage") }

// listenUnix creates a unix socket at path with mode perm, owned by root,
// through the staging directory (see above).
func listenUnix(m *Mesh, path string, perm os.FileMode) (net.Listener, error) {
	stage := stageDir(m)
	if err := os.Mkdir(stage, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := checkRootDir(stage, 0o700); err != nil {
		return nil, err
	}
	tmp := filepath.Join(stage, filepath.Base(path))
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	err = os.Chmod(tmp, perm) // in root's 0700 directory: nobody else reaches this name
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		l.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	return l, nil
}

// checkRootDir checks that dir is a directory (not a symlink) owned by
// root that no one else can write to, and whose mode is at most max.
func checkRootDir(dir string, max os.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || st.Uid != 0 || fi.Mode().Perm()&^max != 0 || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s: mode %v owner %d, want a directory of root's with mode %v or less (group and others may not write)",
			ErrRunDir, dir, fi.Mode(), st.Uid, max)
	}
	return nil
}

// prepareRunDir makes the run directory (root's, 0755) or checks the one
// there: root's, writable by root only, and enterable by others (the
// controller and the listener reach their directories through it).
func prepareRunDir(m *Mesh) error {
	if err := os.Mkdir(m.RunDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: run_dir: %w", ErrRunDir, err)
	}
	fi, err := os.Lstat(m.RunDir)
	if err != nil {
		return fmt.Errorf("%w: run_dir: %w", ErrRunDir, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	perm := fi.Mode().Perm()
	if !fi.IsDir() || st.Uid != 0 || perm&0o022 != 0 || perm&0o001 == 0 {
		return fmt.Errorf("%w: run_dir %s: mode %v owner %d: want a directory of root's with mode 0755 (or 0711): the controller and the listener must be able to enter it, and only root to write it",
			ErrRunDir, m.RunDir, fi.Mode(), st.Uid)
	}
	return nil
}

// privateDir makes dir (whose parent must be checkRootDir-safe) with mode
// 0700 owned by uid:gid, by fchown/fchmod on a descriptor opened without
// following a symlink.
func privateDir(dir string, uid, gid uint32) error {
	if err := checkRootDir(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("keelvip: open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
		return fmt.Errorf("keelvip: chown %s: %w", dir, err)
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("keelvip: chmod %s: %w", dir, err)
	}
	return nil
}

// writeInDir writes data as name in the directory dir, root's with mode
// perm: a new file (O_EXCL|O_NOFOLLOW, relative to dir's descriptor)
// renamed over name, so no symlink in dir is ever followed.
func writeInDir(dir, name string, data []byte, perm uint32) error {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("keelvip: open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	tmp := fmt.Sprintf(".%s.%d", name, os.Getpid())
	_ = unix.Unlinkat(dfd, tmp, 0)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("keelvip: create %s/%s: %w", dir, tmp, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	err = unix.Fchmod(fd, perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("keelvip: write %s/%s: %w", dir, name, err)
	}
	return nil
}

// prepareSpawn makes what the children of spawn mode need: their 0700
// directories and the controller's copy of the pair record. Nothing here
// follows a symlink or changes an owner or mode by path in a directory
// another user owns.
func (h *helper) prepareSpawn() error {
	m := h.m
	if err := privateDir(ctlDir(m), m.ControllerUID, m.ControllerGID); err != nil {
		return err
	}
	if err := privateDir(membersDir(m), m.ListenerUID, m.ListenerGID); err != nil {
		return err
	}
	if err := privateDir(m.StateDir, m.ControllerUID, m.ControllerGID); err != nil {
		return err
	}
	if h.pair != nil {
		// The controller cannot read root's pair file: hand it a copy.
		b, _ := EncodePairFile(h.pair)
		if err := writeInDir(m.StateDir, "pair.rec", b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// helper is the running root helper.
type helper struct {
	m       *Mesh
	pol     *claim.Policy
	pair    *claim.PairRecord
	carrier *LinkCarrier
	log     *slog.Logger

	ctx context.Context // the helper's life
	// reload asks the etcd TLS watch for a read now (SIGHUP, or the
	// admin socket's reload); set before the admin socket serves.
	reload chan os.Signal

	// mu guards the fields below it.
	mu syncx.Mutex
	// +checklocks:mu
	ctlProc int // the controller process whose requests the helper serves now (0: none)
	// +checklocks:mu
	newest *claim.Claim // newest claim the helper checked
	// +checklocks:mu
	kept *claim.PairRecord // an observer's: the first valid record seen
	// +checklocks:mu
	ctlPid int // the controller process the helper started
	// +checklocks:mu
	lisPid int // the listener process the helper started
	// +checklocks:mu
	ctlHTTP *http.Client // the client to the controller's control socket
}

// RunHelper is `keel-vip tend`: the root helper. It creates the WireGuard
// interface (a kernel TUN with wireguard-go, configured from the mesh
// file), starts the controller and the members' listener as unprivileged
// processes with no capabilities (setpriv), serves them on private sockets,
// checks every claim it is asked to act on against the pair record, and
// alone changes the interface. It returns when ctx ends, after stopping
// both children and dropping every VIP the node carries.
func RunHelper(ctx context.Context, o HelperOptions) (err error) {
	m := o.Mesh
	logw := o.Log
	if logw == nil {
		logw = os.Stderr
	}
	if o.Units == nil {
		if err := m.CheckSpawnUsers(); err != nil {
			return err
		}
	}
	// etcd's TLS is checked before anything starts (the controller checks
	// it again with what it is handed).
	if _, err := m.EtcdTLSConfig(wallNow()); err != nil {
		return err
	}
	h := &helper{m: m, log: newLog(logw, m.Self.ID, "helper"), ctx: ctx}
	warnTimings(h.log, m)
	if h.pol, err = m.Policy(); err != nil {
		return err
	}
	if m.VIP.IsValid() {
		if h.pair, err = LoadPair(m); err != nil {
			return err
		}
	}
	exe, setpriv := o.Exe, o.Setpriv
	if o.Units == nil {
		if exe == "" {
			if exe, err = os.Executable(); err != nil {
				return err
			}
		}
		if setpriv == "" {
			if setpriv, err = exec.LookPath("setpriv"); err != nil {
				return fmt.Errorf("keelvip: setpriv: %w", err)
			}
		}
	}

	// The interface: kernel TUN, our address, up, the overlay routed in.
	t, err := tun.CreateTUN(m.Interface, m.MTU)
	if err != nil {
		return fmt.Errorf("keelvip: create %s: %w", m.Interface, err)
	}
	nl := &netlink.Handle{}
	bind := wg.NewUDPBind(wg.UDPBindOptions{Seed: uint64(os.Getpid())})
	if err := bind.SetDefault(m.Impair); err != nil {
		t.Close()
		return err
	}
	dev, err := wg.NewDevice(wg.PacketIOFromTUN(t), m.WGConfig(), wg.Options{Bind: bind, Logger: h.log})
	if err != nil {
		t.Close()
		return err
	}
	defer dev.Close()
	lk, err := nl.LinkByName(m.Interface)
	if err != nil {
		return err
	}
	self := &netlink.Addr{IPNet: &net.IPNet{IP: m.Self.Addr.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
	if err := nl.AddrReplace(lk, self); err != nil {
		return fmt.Errorf("keelvip: address %v: %w", m.Self.Addr, err)
	}
	if err := nl.LinkSetUp(lk); err != nil {
		return err
	}
	ov := m.Overlay
	if err := nl.RouteReplace(&netlink.Route{LinkIndex: lk.Attrs().Index, Dst: &net.IPNet{IP: ov.Addr().AsSlice(), Mask: net.CIDRMask(ov.Bits(), 128)}}); err != nil {
		return fmt.Errorf("keelvip: route %v: %w", ov, err)
	}
	var evlog *EventLog
	if m.EventLog != "" {
		if evlog, err = OpenEventLog(m.EventLog, m.Self.ID, bootNow); err != nil {
			return err
		}
		defer evlog.Close()
	}
	h.carrier = NewLinkCarrier(nl, m.Interface, dev, m, evlog)
	// A VIP left behind by a previous run is dropped before anything.
	if err := h.carrier.DropAll(ctx); err != nil {
		return err
	}
	defer func() {
		derr := h.carrier.DropAll(context.Background())
		if derr != nil {
			h.log.Error("drop every vip", "err", derr)
		}
		err = errors.Join(err, derr)
	}()

	// Directories and sockets.
	if err := prepareRunDir(m); err != nil {
		return err
	}
	if err := writeInDir(m.RunDir, listenConfigName, m.ListenerConfig(), 0o644); err != nil {
		return err
	}
	// The servers outlive ctx: a stopping controller still drops the VIP
	// through helper.sock. They stop once the children have (the deferred
	// stop below runs after stopChild).
	srvCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	serve := func(l net.Listener, hd http.Handler) {
		s := &http.Server{Handler: hd, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, WriteTimeout: 60 * time.Second,
			ConnContext: connContext}
		wg.Add(2)
		go func() { defer wg.Done(); _ = s.Serve(l) }()
		go func() { defer wg.Done(); <-srvCtx.Done(); _ = s.Close() }()
	}
	bad := func(err error) { h.log.Warn("refused connection", "err", err) }
	// New etcd certificates reach the running controller: read every
	// tlsPollInterval, or at once on SIGHUP.
	hup := make(chan os.Signal, 1)
	h.reload = hup
	signal.Notify(hup, unix.SIGHUP)
	defer signal.Stop(hup)
	tctx, tcancel := context.WithCancel(ctx)
	tlsDone := make(chan struct{})
	go func() {
		defer close(tlsDone)
		watchEtcdTLS(tctx, m.EtcdTLS, tlsPollInterval, hup, h.pushEtcdTLS, h.log)
	}()
	defer func() { tcancel(); <-tlsDone }()
	al, err := listenUnix(m, AdminSocket(m), 0o600)
	if err != nil {
		return err
	}
	serve(credListener{Listener: al, onBad: bad}.rootOnly(), http.HandlerFunc(h.serveAdmin))
	if o.Units != nil {
		return h.runUnits(ctx, *o.Units, serve, bad)
	}

	if err := h.prepareSpawn(); err != nil {
		return err
	}
	hl, err := listenUnix(m, filepath.Join(ctlDir(m), "helper.sock"), 0o666)
	if err != nil {
		return err
	}
	serve(credListener{Listener: hl, check: pidPeer(h.controllerPid, m.ControllerUID), onBad: bad}, http.HandlerFunc(h.serveCarrier))
	ml, err := listenUnix(m, filepath.Join(membersDir(m), "members.sock"), 0o666)
	if err != nil {
		return err
	}
	serve(credListener{Listener: ml, check: pidPeer(h.listenerPid, m.ListenerUID), onBad: bad}, http.HandlerFunc(h.serveMembers))

	// The children.
	ctlIn, err := inlineEtcdTLS(m, o.MeshRaw)
	if err != nil {
		return err
	}
	ctl, err := h.start(ctx, setpriv, exe, "control", m.ControllerUID, m.ControllerGID, ctlIn, logw)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.ctlPid = ctl.pid()
	h.ctlHTTP = unixHTTP(filepath.Join(ctlDir(m), "control.sock"), dialCheck(pidPeer(h.controllerPid, m.ControllerUID)), 90*time.Second)
	h.mu.Unlock()
	// The listener gets its address, port and run directory, no key.
	lis, err := h.start(ctx, setpriv, exe, "listen", m.ListenerUID, m.ListenerGID, m.ListenerConfig(), logw)
	if err != nil {
		h.stopChild(ctl)
		return err
	}
	h.mu.Lock()
	h.lisPid = lis.pid()
	h.mu.Unlock()
	h.log.Info("tending", "vip", addrString(m.Tended()), "controller_pid", ctl.pid(), "listener_pid", lis.pid())

	exited := make(chan string, 2)
	for name, c := range map[string]*child{"controller": ctl, "listener": lis} {
		go func() { <-c.done; exited <- name }()
	}
	select {
	case <-ctx.Done():
	case name := <-exited:
		err = fmt.Errorf("keelvip: the %s exited", name)
	}
	h.stopChild(lis)
	h.stopChild(ctl)
	return err
}

// dialCheck turns a peer check into unixHTTP's check of the server end.
func dialCheck(check func(*unix.Ucred) error) func(net.Conn) error {
	return func(c net.Conn) error {
		cr, err := peerCred(c)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPeerCred, err)
		}
		return check(cr)
	}
}

// runUnits is the rest of RunHelper under systemd's split (Units): wait
// for the units' directories, serve them, and tend until ctx ends.
func (h *helper) runUnits(ctx context.Context, u Units, serve func(net.Listener, http.Handler), bad func(error)) error {
	m := h.m
	if u.ControllerCgroup == "" {
		u.ControllerCgroup = DefaultControllerCgroup
	}
	if u.ListenerCgroup == "" {
		u.ListenerCgroup = DefaultListenerCgroup
	}
	ctlUID, err := waitUnitDir(ctx, ctlDir(m))
	if err != nil {
		return err
	}
	lisUID, err := waitUnitDir(ctx, membersDir(m))
	if err != nil {
		return err
	}
	ctlPeer, lisPeer := unitPeer(u.ControllerCgroup, ctlUID), unitPeer(u.ListenerCgroup, lisUID)
	// 0666 root-owned sockets inside the units' 0700 directories: only
	// the unit's user reaches them, and no chown (no CAP_CHOWN) is needed.
	hl, err := listenUnix(m, filepath.Join(ctlDir(m), "helper.sock"), 0o666)
	if err != nil {
		return err
	}
	serve(credListener{Listener: hl, check: ctlPeer, onBad: bad}, http.HandlerFunc(h.serveCarrier))
	ml, err := listenUnix(m, filepath.Join(membersDir(m), "members.sock"), 0o666)
	if err != nil {
		return err
	}
	serve(credListener{Listener: ml, check: lisPeer, onBad: bad}, http.HandlerFunc(h.serveMembers))
	h.mu.Lock()
	h.ctlHTTP = unixHTTP(filepath.Join(ctlDir(m), "control.sock"), dialCheck(ctlPeer), 90*time.Second)
	h.mu.Unlock()
	h.log.Info("tending", "vip", addrString(m.Tended()), "controller_unit", u.ControllerCgroup, "controller_uid", ctlUID,
		"listener_unit", u.ListenerCgroup, "listener_uid", lisUID)
	<-ctx.Done()
	return nil
}

// rootOnlyListener returns l accepting only uid 0, any pid: the
// controller's control.sock, which only the root helper may use.
func rootOnlyListener(l net.Listener, onBad func(error)) (net.Listener, error) {
	return credListener{Listener: l, onBad: onBad}.rootOnly(), nil
}

// rootOnly returns l accepting only uid 0, any pid.
func (l credListener) rootOnly() net.Listener { return rootListener{l.Listener, l.onBad} }

type rootListener struct {
	net.Listener
	onBad func(error)
}

func (l rootListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cr, err := peerCred(c)
		if err != nil || cr.Uid != 0 {
			if err == nil {
				err = fmt.Errorf("pid %d uid %d", cr.Pid, cr.Uid)
			}
			l.onBad(fmt.Errorf("%w: needs uid 0: %v", ErrPeerCred, err))
			c.Close()
			continue
		}
		return credConn{Conn: c, cred: *cr}, nil
	}
}

func (h *helper) controllerPid() int { h.mu.Lock(); defer h.mu.Unlock(); return h.ctlPid }
func (h *helper) listenerPid() int   { h.mu.Lock(); defer h.mu.Unlock(); return h.lisPid }

// start runs exe as sub under setpriv (its process title "keel-vip
// control NODE" or "keel-vip listen NODE"; DispatchExec, which runs first,
// reads ExecEnv and ignores the arguments): the unprivileged uid:gid, no
// supplementary groups, every capability cleared from the inheritable,
// ambient and bounding sets, no_new_privs, and SIGKILL when the helper
// dies. The mesh file goes in on stdin.
func (h *helper) start(ctx context.Context, setpriv, exe, sub string, uid, gid uint32, meshRaw []byte, logw io.Writer) (*child, error) {
	argv := []string{setpriv,
		"--reuid=" + strconv.Itoa(int(uid)), "--regid=" + strconv.Itoa(int(gid)), "--clear-groups",
		"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs",
		"--pdeathsig=KILL", "--", exe, sub, h.m.Self.ID}
	cmd := &exec.Cmd{Path: setpriv, Args: argv, Dir: "/"}
	cmd.Env = append(os.Environ(), ExecEnv+"="+sub)
	cmd.Stdout, cmd.Stderr = logw, logw
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// Its own process group: a signal to the helper's group does not reach
	// it, so the helper stops it in order (and setpriv's --pdeathsig kills
	// it if the helper dies).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("keelvip: start %s: %w", sub, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	_, werr := stdin.Write(meshRaw)
	cerr := stdin.Close()
	if err := errors.Join(werr, cerr); err != nil {
		h.stopChild(c)
		return nil, fmt.Errorf("keelvip: hand the mesh file to %s: %w", sub, err)
	}
	return c, nil
}

// child is one of the helper's two unprivileged processes. done is closed
// once it has exited and been reaped (by the one goroutine that waits for
// it).
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stopChild asks c to stop (SIGTERM), kills it after 10 s, and returns once
// it has been reaped.
func (h *helper) stopChild(c *child) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	}
	_ = c.cmd.Process.Kill()
	<-c.done
}

// verify checks a claim the controller asks the helper to act on: a valid
// claim for the node's VIP under the pair record, and not older than the
// newest the helper has seen.
func (h *helper) verify(vip netip.Addr, raw string) (*claim.Claim, error) {
	if vip != h.m.Tended() {
		return nil, fmt.Errorf("%w: %v", claim.ErrUnknownVIP, vip)
	}
	c, err := parseB64Claim(raw)
	if err != nil {
		return nil, err
	}
	if c.VIP != vip {
		return nil, fmt.Errorf("%w: claim for %v", claim.ErrPairMismatch, c.VIP)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := h.pair
	if kept == nil {
		kept = h.kept
	}
	if err := h.pol.Verify(kept, c, netip.Addr{}); err != nil {
		return nil, err
	}
	if kept == nil {
		h.kept = c.Pair
	}
	if h.newest != nil && h.newest.Newer(c) {
		return nil, fmt.Errorf("%w: epoch %d, the helper saw %d", claim.ErrStale, c.Epoch, h.newest.Epoch)
	}
	h.newest = c
	return c, nil
}

// serveCarrier serves the controller's carry, drop and route requests.
func (h *helper) serveCarrier(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != carrierPath || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	body, ok := readBody(w, r, maxPrivateBody)
	if !ok {
		return
	}
	var req carrierRequest
	if err := decodeStrict(body, &req); err != nil {
		writeErr(w, err)
		return
	}
	vip, err := parseOptAddr(req.VIP)
	if err == nil && !vip.IsValid() {
		err = fmt.Errorf("%w: no vip", claim.ErrMalformed)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	holder, err := parseOptAddr(req.Holder)
	if err != nil {
		writeErr(w, err)
		return
	}
	ctx := r.Context()
	if cr, ok := peerOf(ctx); ok {
		h.controllerSeen(int(cr.Pid))
	}
	switch req.Op {
	case "drop": // always allowed: dropping is the safe direction
		if vip != h.m.Tended() {
			err = fmt.Errorf("%w: %v", claim.ErrUnknownVIP, vip)
		} else {
			err = h.carrier.Drop(ctx, vip)
		}
	case "carry":
		var c *claim.Claim
		if h.pair == nil {
			err = fmt.Errorf("%w: this node is not a member", claim.ErrNotHolder)
		} else if c, err = h.verify(vip, req.Claim); err == nil {
			if c.Holder != h.m.Self.Addr {
				err = fmt.Errorf("%w: claim names %v, not this node", claim.ErrNotHolder, c.Holder)
			} else if req.UntilBootNs != 0 {
				err = h.carrier.CarryUntil(ctx, vip, time.Unix(0, req.UntilBootNs))
			} else if len(h.m.Etcd) > 0 {
				// With etcd the lease is the fence: no address without
				// the deadline of its last answered renewal.
				err = fmt.Errorf("%w: carry with etcd needs a deadline", claim.ErrMalformed)
			} else {
				err = h.carrier.Carry(ctx, vip)
			}
		}
	case "route":
		if !holder.IsValid() || holder == h.m.Self.Addr {
			if vip != h.m.Tended() {
				err = fmt.Errorf("%w: %v", claim.ErrUnknownVIP, vip)
			} else {
				err = h.carrier.Route(ctx, vip, netip.Addr{})
			}
			break
		}
		var c *claim.Claim
		if c, err = h.verify(vip, req.Claim); err == nil {
			if c.Holder != holder {
				err = fmt.Errorf("%w: claim names %v, route to %v", claim.ErrPairMismatch, c.Holder, holder)
			} else {
				err = h.carrier.Route(ctx, vip, holder)
			}
		}
	default:
		err = fmt.Errorf("%w: op %q", claim.ErrMalformed, req.Op)
	}
	if err != nil {
		h.log.Warn("carrier request refused", "op", req.Op, "err", err)
		writeErr(w, fmt.Errorf("%w: %w", ErrRefused, err))
		return
	}
	jsonx.Write(w, http.StatusOK, struct{}{})
}

// controllerSeen notes that the controller process pid sent a request.
// A process the helper has not served before is a new controller (a
// restart, under systemd's split): it carries nothing until it asks, so
// the helper first drops every VIP (the reconciliation: what the new
// controller does not hold is not on the interface). It then watches the
// process, and drops every VIP the moment it exits (a crash, an OOM kill,
// a crash loop), without waiting for the drop deadline.
func (h *helper) controllerSeen(pid int) {
	h.mu.Lock()
	if h.ctlProc == pid {
		h.mu.Unlock()
		return
	}
	prev := h.ctlProc
	h.ctlProc = pid
	h.mu.Unlock()
	if prev != 0 {
		h.log.Info("new controller process: dropping every vip it does not hold", "pid", pid, "was", prev)
		h.dropAll("controller restarted")
	}
	go h.watchController(pid)
}

// watchController waits for the controller process pid to exit (a pidfd,
// or /proc when pidfds are unavailable) and then drops every VIP, unless
// another controller process took over meanwhile.
func (h *helper) watchController(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err == nil {
		defer unix.Close(fd)
	}
	for h.ctx.Err() == nil {
		if err == nil {
			n, perr := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 500)
			if n > 0 || (perr != nil && perr != unix.EINTR) {
				break
			}
			continue
		}
		if _, serr := os.Stat(fmt.Sprintf("/proc/%d", pid)); serr != nil {
			break
		}
		select {
		case <-h.ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	if h.ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	cur := h.ctlProc == pid
	if cur {
		h.ctlProc = 0
	}
	h.mu.Unlock()
	if cur {
		h.log.Info("controller process gone: dropping every vip", "pid", pid)
		h.dropAll("controller gone")
	}
}

func (h *helper) dropAll(why string) {
	if err := h.carrier.DropAll(context.WithoutCancel(h.ctx)); err != nil {
		h.log.Error("drop every vip", "why", why, "err", err)
	}
}

// serveMembers takes a members' channel request from the listener,
// verifies claims and releases, and forwards it to the controller.
func (h *helper) serveMembers(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != claim.MembersPath || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	from, err := netip.ParseAddr(r.Header.Get(fromHeader))
	if err != nil {
		jsonx.Write(w, http.StatusBadRequest, errorReply{Error: "sender: " + err.Error(), Code: "malformed"})
		return
	}
	body, ok := readBody(w, r, claim.MaxRequestBody)
	if !ok {
		return
	}
	if err := h.checkMembers(body, from.Unmap()); err != nil {
		h.log.Debug("members' channel: refused", "from", from.Unmap(), "err", err)
		writeErr(w, err)
		return
	}
	h.forward(w, r.Context(), claim.MembersPath, body, from.Unmap())
}

// checkMembers verifies what it can of a request before the controller
// sees it: a claim valid under the pair record from its holder's address,
// a release from the other member.
func (h *helper) checkMembers(body []byte, from netip.Addr) error {
	var req struct {
		Op      string `json:"op"`
		Claim   string `json:"claim,omitempty"`
		Release string `json:"release,omitempty"`
		VIP     string `json:"vip,omitempty"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	switch req.Op {
	case "claim":
		c, err := parseB64Claim(req.Claim)
		if err != nil {
			return err
		}
		if c.VIP != h.m.Tended() {
			return fmt.Errorf("%w: %v", claim.ErrUnknownVIP, c.VIP)
		}
		h.mu.Lock()
		kept := h.pair
		if kept == nil {
			kept = h.kept
		}
		h.mu.Unlock()
		return h.pol.Verify(kept, c, from)
	case "release":
		raw, err := decodeB64(req.Release)
		if err != nil {
			return err
		}
		rel, err := claim.ParseRelease(raw)
		if err != nil {
			return err
		}
		if rel.VIP != h.m.Tended() {
			return fmt.Errorf("%w: %v", claim.ErrUnknownVIP, rel.VIP)
		}
		if h.pair == nil {
			return fmt.Errorf("%w: this node is not a member", claim.ErrNotHolder)
		}
		o, _ := h.pair.Other(h.m.Self.Addr)
		if rel.From != o.Addr || rel.FromKey != o.Key {
			return fmt.Errorf("%w: %v", claim.ErrNotPairMember, rel.From)
		}
		if from != rel.From {
			return fmt.Errorf("%w: from %v", claim.ErrWrongSender, from)
		}
		return nil
	case "epoch":
		return nil
	case "handover":
		if vip, err := netip.ParseAddr(req.VIP); err != nil || vip != h.m.Tended() {
			return fmt.Errorf("%w: %q", claim.ErrUnknownVIP, req.VIP)
		}
		// Only the other member (the holder whose check fails) may ask
		// this node to take the VIP over.
		pair := h.pair
		if pair == nil {
			return fmt.Errorf("%w: this node is not a member", claim.ErrNotPairMember)
		}
		if o, _ := pair.Other(h.m.Self.Addr); from != o.Addr {
			return fmt.Errorf("%w: hand-over from %v", claim.ErrNotPairMember, from)
		}
		return nil
	}
	return fmt.Errorf("%w: op %q", claim.ErrMalformed, req.Op)
}

// pushEtcdTLS hands new etcd TLS contents to the controller.
func (h *helper) pushEtcdTLS(ctx context.Context, req etcdTLSRequest) (etcdTLSReply, error) {
	hc := h.controller()
	if hc == nil {
		return etcdTLSReply{}, errors.New("keelvip: the controller is not started")
	}
	return pushTLS(ctx, hc, "http://control", req)
}

func (h *helper) controller() *http.Client {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ctlHTTP
}

// forward sends body to the controller's path and copies its answer.
func (h *helper) forward(w http.ResponseWriter, ctx context.Context, path string, body []byte, from netip.Addr) {
	hc := h.controller()
	if hc == nil {
		jsonx.Write(w, http.StatusServiceUnavailable, errorReply{Error: "controller not started"})
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://control"+path, bytesReader(body))
	if err != nil {
		writeErr(w, err)
		return
	}
	if from.IsValid() {
		req.Header.Set(fromHeader, from.String())
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		jsonx.Write(w, http.StatusServiceUnavailable, errorReply{Error: "controller: " + err.Error()})
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, maxPrivateBody))
}

// Status returns the node's status: the controller's view and the live
// interface.
func (h *helper) status(ctx context.Context) (Status, error) {
	m := h.m
	vip := m.Tended()
	s := Status{Mesh: m.ID, Node: m.Self.ID, VIP: addrString(vip), Etcd: len(m.Etcd) > 0, RenewalAgeMs: -1, Role: claim.RoleReplica.String()}
	if !vip.IsValid() {
		return s, ErrNoVIP
	}
	if h.pair == nil {
		s.Role = "observer"
	}
	var cs controlStatus
	if hc := h.controller(); hc != nil {
		if err := callJSON(ctx, hc, http.MethodGet, "http://control"+statusPath, nil, &cs, nil); err != nil {
			return s, fmt.Errorf("keelvip: controller status: %w", err)
		}
	}
	if h.pair != nil {
		s.Role = cs.Role
	}
	s.Epoch, s.Holder, s.Fenced, s.Released, s.Lease, s.RenewalAgeMs = cs.Epoch, cs.Holder, cs.Fenced, cs.Released, cs.Lease, cs.RenewalAgeMs
	s.EtcdCert, s.Check = cs.EtcdCert, cs.Check
	if id, ok := h.nodeID(s.Holder); ok {
		s.Holder = id
	}
	var err error
	if s.Carried, err = h.carrier.Carried(vip); err != nil {
		return s, err
	}
	p, ok, err := h.carrier.RoutedTo(vip)
	if err != nil {
		return s, err
	}
	if ok {
		s.RoutedTo = p.ID
	}
	live, err := h.carrier.dev.Config()
	if err != nil {
		return s, err
	}
	s.Drift = m.Drift(live, vip)
	return s, nil
}

func (h *helper) nodeID(addr string) (string, bool) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return "", false
	}
	if a == h.m.Self.Addr {
		return h.m.Self.ID, true
	}
	p, ok := h.m.PeerByAddr(a)
	return p.ID, ok
}

// serveAdmin serves the CLI: status and promote.
func (h *helper) serveAdmin(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == statusPath && r.Method == http.MethodGet:
		s, err := h.status(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		jsonx.Write(w, http.StatusOK, s)
	case r.URL.Path == reloadPath && r.Method == http.MethodPost:
		select {
		case h.reload <- unix.SIGHUP:
		default: // a read is already due
		}
		jsonx.Write(w, http.StatusOK, struct{}{})
	case r.URL.Path == promotePath && r.Method == http.MethodPost:
		body, ok := readBody(w, r, maxPrivateBody)
		if !ok {
			return
		}
		var req promoteRequest
		if err := decodeStrict(body, &req); err != nil {
			writeErr(w, err)
			return
		}
		b, _ := json.Marshal(req)
		h.forward(w, r.Context(), promotePath, b, netip.Addr{})
	default:
		http.NotFound(w, r)
	}
}
