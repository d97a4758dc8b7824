//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/internal/syncx"
)

// ErrUnknownChild is returned by StartChild for a name that RegisterChild
// did not register in this binary.
var ErrUnknownChild = errors.New("netns: unknown child function")

// outputCap is how much of a process's output Process.Output keeps: the last
// 256 KiB.
const outputCap = 256 << 10

// waitDelay bounds how long reaping waits for output from processes that
// escaped the group after the child exited.
const waitDelay = 10 * time.Second

// ProcOptions configures Host.Start and Host.StartChild. The zero value runs
// the program with the parent's environment in the parent's directory, with
// no input, keeping only the tail of its output (Process.Output).
type ProcOptions struct {
	Env   []string  // added to the parent's environment ("KEY=value")
	Dir   string    // working directory; "" means the parent's
	Stdin io.Reader // nil means /dev/null

	// Output receives stdout and stderr, interleaved, as the process writes
	// them (a file, or a test log writer). It is written from another
	// goroutine, and never after Wait or Kill has returned.
	Output io.Writer
}

// Process is a child process running inside a Host's namespace, in a process
// group of its own. It is killed with its whole group when the Host closes,
// when the context given to Start is done, or by Kill; when it exits by
// itself, whatever else is left in its group is killed too. If the parent
// process dies without cleaning up (SIGKILL, a test timeout), the child
// dies by SIGKILL (Pdeathsig), but processes it started itself survive
// unless they set Pdeathsig too (those started with this package do).
//
// Its methods are safe for concurrent use.
type Process struct {
	name string
	cmd  *exec.Cmd
	pid  int
	done chan struct{}
	err  error // Wait's result, set before done closes

	// mu guards reaped. It is held while reaping, so that no signal goes
	// to a reused process id.
	mu syncx.Mutex
	// +checklocks:mu
	reaped bool

	out tailBuffer
}

// Start runs argv[0] (looked up in PATH) with arguments argv[1:] inside the
// host's namespace. The process is forked from a thread that is inside the
// namespace, so it starts there, without `ip netns exec`; that thread stays
// locked until the process is reaped, which keeps Pdeathsig meaningful (Linux
// signals a child when the thread that forked it exits).
func (h *Host) Start(ctx context.Context, argv []string, o ProcOptions) (*Process, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("netns: Start needs a program")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	cmd := &exec.Cmd{Path: path, Args: slices.Clone(argv)}
	return h.start(ctx, argv[0], cmd, o)
}

// Run runs argv inside the host like Start, waits for it to exit (or for
// ctx, which kills it), and returns its output (stdout and stderr
// interleaved, the last 256 KiB) and its exit status as Wait reports it.
func (h *Host) Run(ctx context.Context, argv ...string) ([]byte, error) {
	p, err := h.Start(ctx, argv, ProcOptions{})
	if err != nil {
		return nil, err
	}
	<-p.Done()
	out, _ := p.Output()
	if err := ctx.Err(); err != nil && p.err != nil {
		return out, fmt.Errorf("netns: %s in %s: %w (%w)", argv[0], h.name, err, p.err)
	}
	return out, p.err
}

// StartChild re-executes the running binary (normally the test binary) inside
// the host's namespace and makes it run the function registered under name
// with RegisterChild, with args. The binary must call DispatchChild first
// thing in main (or TestMain); StartChild checks that name is registered in
// this binary and returns ErrUnknownChild if not.
//
// The child sees the flag "-test.run=^$" before "--" and args, so a test
// binary that forgot DispatchChild runs no tests instead of all of them.
func (h *Host) StartChild(ctx context.Context, name string, args []string, o ProcOptions) (*Process, error) {
	childMu.Lock()
	_, ok := children[name]
	childMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownChild, name)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("netns: own executable: %w", err)
	}
	argv := append([]string{exe, "-test.run=^$", "--"}, args...)
	cmd := &exec.Cmd{Path: exe, Args: argv}
	o.Env = append(slices.Clone(o.Env), childEnv+"="+name)
	return h.start(ctx, name, cmd, o)
}

func (h *Host) start(ctx context.Context, name string, cmd *exec.Cmd, o ProcOptions) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &Process{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.Stdin = o.Stdin
	var w io.Writer = &p.out
	if o.Output != nil {
		w = io.MultiWriter(&p.out, o.Output)
	}
	// One writer for both streams: os/exec then uses one pipe, which keeps
	// their order.
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A process that left the group (setsid) and kept the output pipe open
	// cannot hold Wait forever.
	cmd.WaitDelay = waitDelay

	started := make(chan error, 1)
	go p.run(h, started)
	if err := <-started; err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { p.signalGroup(unix.SIGKILL) })
	go func() {
		<-p.done
		stop()
	}()
	if err := h.onClose(p.Kill); err != nil {
		_ = p.Kill()
		return nil, err
	}
	return p, nil
}

// run forks the process from a thread inside the namespace and then holds
// that thread until the process is reaped.
func (p *Process) run(h *Host, started chan<- error) {
	orig, err := lockAndEnter(h.enter)
	if err != nil {
		started <- err
		return
	}
	startErr := p.cmd.Start()
	restored := leave(orig) == nil
	if startErr != nil {
		if restored {
			runtime.UnlockOSThread()
		}
		started <- fmt.Errorf("netns: start %s in %s: %w", p.name, h.name, startErr)
		return
	}
	p.pid = p.cmd.Process.Pid
	started <- nil

	// Wait for the exit without reaping, so that the group id cannot be
	// reused while the rest of the group is killed.
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	p.mu.Lock()
	_ = unix.Kill(-p.pid, unix.SIGKILL)
	p.err = p.cmd.Wait()
	p.reaped = true
	p.mu.Unlock()
	close(p.done)
	if restored {
		runtime.UnlockOSThread()
	}
	// Otherwise the goroutine exits locked and the runtime discards the
	// thread, which was left in the host's namespace.
}

// Pid returns the process id, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit, or for ctx. It returns the exit
// status as os/exec reports it (nil for status 0, an *exec.ExitError
// otherwise), or ctx's error.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ExitCode returns the exit status, -1 when a signal ended the process, or
// -1 while it is still running.
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Signal sends sig to the process's group, unless it has exited.
func (p *Process) Signal(sig unix.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("netns: %s (pid %d): %w", p.name, p.pid, os.ErrProcessDone)
	default:
	}
	if err := p.signalGroup(sig); err != nil {
		return fmt.Errorf("netns: signal %s (pid %d): %w", p.name, p.pid, err)
	}
	return nil
}

// signalGroup signals the group unless its leader has been reaped: until
// then the id cannot be reused by another process.
func (p *Process) signalGroup(sig unix.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return nil
	}
	err := unix.Kill(-p.pid, sig)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// Kill kills the process and its group with SIGKILL and waits until it is
// reaped. It is idempotent and returns nil when the process had already
// exited.
func (p *Process) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	err := p.signalGroup(unix.SIGKILL)
	<-p.done
	if err != nil {
		return fmt.Errorf("netns: kill %s (pid %d): %w", p.name, p.pid, err)
	}
	return nil
}

// Stop asks the process to exit with SIGTERM and waits for it; when ctx is
// done first, it kills the group with SIGKILL. It returns the exit status as
// Wait does, or nil if the process had already been reaped.
func (p *Process) Stop(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.signalGroup(unix.SIGTERM)
	select {
	case <-p.done:
	case <-ctx.Done():
		_ = p.signalGroup(unix.SIGKILL)
		<-p.done
	}
	return p.err
}

// Output returns the last 256 KiB of what the process wrote to stdout and
// stderr so far, and whether earlier output was dropped to keep that limit.
func (p *Process) Output() (out []byte, truncated bool) { return p.out.snapshot() }

// tailBuffer keeps the last outputCap bytes written to it. It holds up to
// twice that and compacts only when full, so a write costs amortized O(its
// length), however many small writes a chatty child makes.
type tailBuffer struct {
	// mu guards buf and dropped.
	mu syncx.Mutex
	// +checklocks:mu
	buf []byte
	// dropped says bytes before buf were discarded.
	// +checklocks:mu
	dropped bool
}

func (b *tailBuffer) Write(q []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(q)
	if len(q) > outputCap {
		b.dropped = true
		q = q[len(q)-outputCap:]
	}
	if len(b.buf)+len(q) > 2*outputCap {
		keep := outputCap - len(q)
		b.dropped = true
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-keep:]...)
	}
	b.buf = append(b.buf, q...)
	return n, nil
}

func (b *tailBuffer) snapshot() ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) > outputCap {
		return slices.Clone(b.buf[len(b.buf)-outputCap:]), true
	}
	return slices.Clone(b.buf), b.dropped
}

// childEnv names the child function in a re-executed binary.
const childEnv = "VIPKIT_NETNS_CHILD"

// ChildFunc is a function that StartChild runs in a child process. ctx is
// cancelled when the child receives SIGTERM or SIGINT; args are what
// StartChild was given. Returning nil exits with status 0, an error prints it
// to stderr and exits with status 1.
type ChildFunc func(ctx context.Context, args []string) error

var (
	// childMu guards children, the registered child functions.
	childMu syncx.Mutex
	// +checklocks:childMu
	children = map[string]ChildFunc{}
)

// RegisterChild makes f runnable by StartChild under name. Call it from an
// init function or from TestMain before DispatchChild, in the binary that is
// re-executed. It panics on an empty or duplicate name, a programming error.
func RegisterChild(name string, f ChildFunc) {
	childMu.Lock()
	defer childMu.Unlock()
	if name == "" || f == nil {
		panic("netns: RegisterChild needs a name and a function")
	}
	if _, dup := children[name]; dup {
		panic("netns: RegisterChild called twice for " + name)
	}
	children[name] = f
}

// IsChild reports whether this process was started by StartChild.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// DispatchChild returns at once in a normal run. In a process started by
// StartChild it runs the registered function instead and exits: status 0
// when it returns nil, 1 when it returns an error (printed to stderr), 2 when
// the name is not registered. Call it at the top of TestMain (or main),
// after RegisterChild and before anything else.
func DispatchChild() {
	name := os.Getenv(childEnv)
	if name == "" {
		return
	}
	os.Exit(runChild(name, os.Args[1:], os.Stderr))
}

// runChild runs the child function name with the arguments after "--" in
// argv and returns the exit status.
func runChild(name string, argv []string, stderr io.Writer) int {
	childMu.Lock()
	f, ok := children[name]
	childMu.Unlock()
	if !ok {
		fmt.Fprintf(stderr, "netns: child %q is not registered in this binary\n", name)
		return 2
	}
	os.Unsetenv(childEnv)
	var args []string
	if i := slices.Index(argv, "--"); i >= 0 {
		args = argv[i+1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	if err := f(ctx, args); err != nil {
		fmt.Fprintf(stderr, "netns: child %s: %v\n", name, err)
		return 1
	}
	return 0
}
