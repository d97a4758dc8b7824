//go:build linux

package netns

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	RegisterChild("nsinfo", childNSInfo)
	RegisterChild("mkns", childMakeNamespace)
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
