// Package keelvip is the reference pair controller of vipkit: it puts one
// IPv6 service VIP on whichever node of an appliance pair holds it, on a
// WireGuard mesh, composing package claim (signed claims, pair records,
// the fence state machine, the etcd lease controller, promote, the
// members' channel), transport/wg (wireguard-go configured from Go values)
// and netlink. cmd/keel-vip is its thin main.
//
// A node is described by a mesh file (ParseMesh, LoadMesh): the mesh id,
// the overlay prefix, this node's WireGuard and Ed25519 keys and overlay
// address, its peers, appliance.vip (or appliance.observe on a node of no
// pair that only routes the VIP) with the pair record's file, and optional
// etcd endpoints (none: the no-etcd mode, where the VIP moves only by
// promote and the members' channel).
//
// Commands (Main):
//
//	keel-vip keygen       --dir DIR --id ID --addr ADDR [--endpoint HOST:PORT]
//	keel-vip pair propose --mesh FILE --peer ADDR --out FILE
//	keel-vip pair sign    --mesh FILE --in FILE [--root-key FILE]
//	keel-vip tend         --mesh FILE
//	keel-vip promote      --mesh FILE [--old-primary-gone]
//	keel-vip status       --mesh FILE [--json]
//	keel-vip inspect      --mesh FILE [--spec FILE]
//	keel-vip allocate     --mesh FILE [--from-spec FILE] [--reserve ADDR,...]
//	keel-vip check        --mesh FILE
//	keel-vip render       --mesh FILE [--holder ADDR]
//	keel-vip drop-all     --mesh FILE
//	keel-vip --help | --version
//
// keygen (Keygen) writes a new node's keys to DIR/wg.key and DIR/sign.key,
// created with O_EXCL and mode 0600, and prints only the public keys and
// the node's peers stanza (PeerStanza).
//
// Every command takes -h/--help (exit 0; the help fits 80 columns); --version prints the module
// version and the VCS revision from the build info. promote exits 0,
// printing "this node holds the VIP at epoch N", whenever this node holds
// the VIP at the end, whoever claimed it, and non-zero only otherwise.
//
// The privilege split. `tend` is the root helper (RunHelper): it creates the
// kernel TUN and the wireguard-go device, and alone changes the interface
// (LinkCarrier: the VIP /128 with preferred_lft 0, routed to its holder by
// moving the /128 between the peers' allowed IPs). Two unprivileged
// processes of the same binary run beside it, each as its own user with no
// capability in any set (bounding included) and no_new_privs: the
// controller (RunController: claim.Controller over etcd, which asks the
// helper for every carry, drop and route, with the claim that justifies
// it) and the members' channel listener (RunListener: POST /v1/vip on the
// overlay address, forwarded unparsed to the helper). Under systemd
// (HelperOptions.Units, `tend --children units`) they are units of their
// own, with dynamic users and their mesh file as a credential, and the
// helper, which starts nothing, keeps only CAP_NET_ADMIN and
// CAP_DAC_OVERRIDE; without systemd the helper starts them under setpriv.
// With etcd the kernel enforces the fence: the controller asks for every
// carry with the CLOCK_BOOTTIME deadline 10 s after the send of its last
// answered renewal, and every answered renewal moves it on; the helper
// writes the address with valid_lft = floor(time left) seconds (dropping
// it when under a second is left) and drops it at the deadline by its own
// CLOCK_BOOTTIME timer as well (LinkCarrier). A frozen or dead controller,
// or a frozen helper, thus loses the address by the deadline. Suspend: the
// kernel's address timers do not count suspended time, but the helper's
// CLOCK_BOOTTIME timer does and drops the address within half a second of
// the resume. Without etcd the address is carried forever.
//
// The helper checks every claim against the pair record and the trust
// store before it acts or forwards, and talks to each child over a unix
// socket in a 0700 directory owned by the child's user, checking the
// peer's SO_PEERCRED against the child's pid (or, under systemd, the
// directory's owner and the unit's cgroup). The CLI reaches the helper on
// a root-only admin socket. Stopping the helper stops both children and
// drops every VIP the node carries; ExecStopPost (drop-all) does it again
// for a helper that died. The systemd units are in systemd/.
//
// # Local attackers, and why each is impossible
//
// A local unprivileged process is an adversary of the root helper. Each
// attack below is closed by the simplest mechanism that makes it
// impossible rather than unlikely:
//
//   - Keys in the listener. The members' listener, the one
//     network-facing process, is handed only a ListenerConfig (node id,
//     overlay address, port, run directory): on stdin in spawn mode, as
//     the root-owned RunDir/listen.json under systemd. It never holds a
//     private key, so no compromise of it can leak one; nothing needs to
//     be filtered or zeroed.
//   - Symlink races. The helper never chowns or chmods by path in a
//     directory another user owns. Sockets are bound and chmodded in the
//     helper's own 0700 staging directory and renamed into place (rename
//     replaces a symlink, never follows it) and stay root's; directories
//     are changed with fchown/fchmod on an O_NOFOLLOW descriptor inside
//     root-owned parents; the pair copy is written with O_EXCL|O_NOFOLLOW
//     relative to the directory's descriptor, as root's 0644. A racer
//     with the child's uid can thus only break names in its own
//     directory, which makes setup fail, never change another file.
//   - Shared uids. Spawn mode refuses to start unless users.controller_uid
//     and users.listener_uid are distinct and non-zero (ErrUsers); under
//     systemd each unit has its own DynamicUser. The listener's uid can
//     therefore neither enter ctl/ (0700, the controller's) nor write the
//     state directory (0700, the controller's), which holds state.json
//     and pair.rec: no uid but the controller's (and root) can change
//     them.
//   - control.sock. The controller accepts a connection only if
//     SO_PEERCRED says uid 0: only the helper can reach promote, status or
//     the members' channel there, so no other process (the listener, the
//     controller's own uid, any other) can clear the fence or pose as a
//     member. The X-Keel-From header is the helper's statement of which
//     member a forwarded request came from, never read to decide who is
//     calling.
//   - Frozen or crashed processes. The kernel's valid_lft removes the
//     address at the drop deadline with every keel-vip process stopped,
//     and the helper drops every VIP when the controller process exits.
//
// Status and inspect read the interface back live: whether it carries the
// VIP, the peer its /128 is routed to, and any drift of the device from
// the mesh file, where a VIP /128 in any peer's allowed IPs is never drift
// (Mesh.Drift).
//
// Renewals are confirmed by a quorum (etcdkv.QuorumKV), so a holder whose
// local etcd member is the leader and is cut off from the majority stops
// renewing at once instead of one election timeout later.
//
// Every add and remove of the address can be logged with a CLOCK_BOOTTIME
// timestamp (EventLog); the logs of all nodes of one machine merge into
// one timeline (ReadEvents, SortEvents), which the end-to-end test checks
// for any instant with two holders.
package keelvip
