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
	goleak.VerifyTestMain(m)
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
