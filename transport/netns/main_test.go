//go:build linux

package netns

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	RegisterChild("nsinfo", childNSInfo)
	RegisterChild("mkns", childMakeNamespace)
	RegisterChild("echo-server", childEchoServer)
	DispatchChild()
	code := m.Run()
	if code == 0 {
		// After every test: no goroutine left, no thread of this process
		// left in another namespace, no namespace of this process left.
		for _, check := range []func() error{func() error { return goleak.Find() }, threadsHome, ownNamespacesGone} {
			if err := check(); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL:", err)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// threadsHome reports any thread of this process whose network namespace is
// not the process's initial one (the one its main thread is in).
func threadsHome() error {
	home, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", os.Getpid()))
	if err != nil {
		return err
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	var bad []string
	for _, task := range tasks {
		ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if err != nil {
			continue // the thread exited meanwhile
		}
		if ns != home {
			bad = append(bad, task.Name()+" in "+ns)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("threads left outside %s: %v", home, bad)
	}
	return nil
}

// ownNamespacesGone reports namespaces this process named that are still
// mounted.
func ownNamespacesGone() error {
	names, err := List()
	if err != nil {
		return err
	}
	var left []string
	for _, n := range names {
		if pid, ok := ownerPID(n); ok && pid == os.Getpid() {
			left = append(left, n)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("namespaces left behind: %v", left)
	}
	return nil
}

// childNSInfo prints its network namespace and interfaces, starts a
// grandchild in its own process group, prints the grandchild's pid, and
// waits to be killed.
func childNSInfo(ctx context.Context, args []string) error {
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return err
	}
	fmt.Printf("ns=%s\n", ns)
	out, err := exec.Command("ip", "-o", "addr").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip addr: %v: %s", err, out)
	}
	fmt.Printf("%s", out)
	gc := exec.Command("sleep", "1000")
	if err := gc.Start(); err != nil {
		return err
	}
	fmt.Printf("grandchild=%d\n", gc.Process.Pid)
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}

// childMakeNamespace creates a namespace with NewHost, prints its name and
// then blocks without ever closing it: the parent kills it to leave a stale
// namespace for Sweep.
func childMakeNamespace(ctx context.Context, args []string) error {
	h, err := NewHost(ctx, "")
	if err != nil {
		return err
	}
	fmt.Printf("name=%s\n", h.Name())
	<-ctx.Done()
	return h.Close()
}

// childEchoServer listens on args[0] (its whole process is in the host's
// namespace, so every goroutine's sockets are too), echoes every connection
// on its own goroutine, prints "listening=ADDR" and "ready", and serves
// until it is told to stop.
func childEchoServer(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one address, got %q", args)
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	fmt.Printf("listening=%s\nready\n", ln.Addr())
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}
