//go:build !linux

package keelvip

import (
	"context"
	"errors"
	"net"
	"os"
	"os/signal"
)

var errLinuxOnly = errors.New("keelvip: tend and drop-all need Linux")

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt)
}

func runHelper(context.Context, HelperOptions) error { return errLinuxOnly }

func dropAll(context.Context, *Mesh) error { return errLinuxOnly }

// AdminSocket returns the path of the helper's admin socket (root, 0600).
func AdminSocket(m *Mesh) string { return m.RunDir + "/admin.sock" }

func ctlDir(m *Mesh) string     { return m.RunDir + "/ctl" }
func membersDir(m *Mesh) string { return m.RunDir + "/members" }

// ExecEnv names the environment variable that makes DispatchExec run a
// subcommand of Main.
const ExecEnv = "KEELVIP_EXEC"

// rootOnlyListener needs SO_PEERCRED (Linux).
func rootOnlyListener(l net.Listener, _ func(error)) (net.Listener, error) {
	l.Close()
	return nil, errLinuxOnly
}

func connContext(ctx context.Context, _ net.Conn) context.Context { return ctx }
