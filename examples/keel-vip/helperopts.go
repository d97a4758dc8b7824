package keelvip

import "io"

// HelperOptions configures RunHelper.
type HelperOptions struct {
	// Mesh is the node's mesh file. Required.
	Mesh *Mesh
	// MeshRaw is the mesh file's bytes, handed to the controller on its
	// stdin (it cannot read the root-only file). Required.
	MeshRaw []byte
	// Exe is the program run as the controller ("control") and the
	// listener ("listen"); "" means this executable. It must be
	// executable by the unprivileged users.
	Exe string
	// Setpriv is the setpriv(1) binary that drops to the unprivileged user
	// with no capabilities; "" means "setpriv" from PATH.
	Setpriv string
	// Log receives the helper's log lines and its children's stderr; nil
	// means os.Stderr.
	Log io.Writer
	// Units, when set, is systemd's split: systemd starts the controller
	// and the listener as their own units, and the helper starts no
	// process (Exe, Setpriv and MeshRaw are unused). See Units.
	Units *Units
}

// Default cgroups of the controller's and the listener's units (the
// shipped keel-vip-control.service and keel-vip-members.service).
const (
	DefaultControllerCgroup = "/system.slice/keel-vip-control.service"
	DefaultListenerCgroup   = "/system.slice/keel-vip-members.service"
)

// Units is how the helper finds the controller and the listener when
// systemd starts them (keel-vip-control.service and
// keel-vip-members.service: a dynamic user each, no capability, their
// RuntimeDirectory= the 0700 directories run/ctl and run/members, the mesh
// file and the pair record as credentials). The helper waits for the two
// directories, puts its own sockets in them (0666: the 0700 directory owned
// by the unit's user is the file-system barrier), and accepts a peer on
// either side only if SO_PEERCRED names the directory's owner and a process
// in the unit's cgroup (read from /proc/PID/cgroup; a process cannot move
// itself into a system unit's cgroup). Without children to start or
// directories to hand over, the helper then needs CAP_NET_ADMIN and
// CAP_DAC_OVERRIDE only (docs/security.md).
type Units struct {
	// ControllerCgroup and ListenerCgroup are the units' cgroup paths as
	// /proc/PID/cgroup shows them; "" means the Default ones.
	ControllerCgroup, ListenerCgroup string
}
