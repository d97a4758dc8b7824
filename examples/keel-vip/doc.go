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
//	keel-vip pair propose --mesh FILE --peer ADDR --out FILE
//	keel-vip pair sign    --mesh FILE --in FILE [--root-key FILE]
//	keel-vip tend         --mesh FILE
//	keel-vip promote      --mesh FILE [--old-primary-gone]
//	keel-vip status       --mesh FILE [--json]
//	keel-vip inspect      --mesh FILE
//	keel-vip render       --mesh FILE [--holder ADDR]
//	keel-vip drop-all     --mesh FILE
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
// Status and inspect read the interface back live: whether it carries the
// VIP, the peer its /128 is routed to, and any drift of the device from
// the mesh file, where a VIP /128 in any peer's allowed IPs is never drift
// (Mesh.Drift).
//
// Renewals are confirmed by a quorum (QuorumKV), so a holder whose local
// etcd member is the leader and is cut off from the majority stops
// renewing at once instead of one election timeout later.
//
// Every add and remove of the address can be logged with a CLOCK_BOOTTIME
// timestamp (EventLog); the logs of all nodes of one machine merge into
// one timeline (ReadEvents, SortEvents), which the end-to-end test checks
// for any instant with two holders.
package keelvip
