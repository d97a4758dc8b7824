// Package netns makes test hosts out of Linux network namespaces: a Host is a
// named namespace (bind-mounted under /run/netns like `ip netns add`, so
// `ip netns exec` works on it) with its loopback up; Connect joins two hosts
// with a veth pair and a Switch joins any number on one L2 segment, with
// addresses from ranges that exist only inside these namespaces
// (198.18.0.0/15 for the underlay, 100.64.0.0/10 and fd00::/8 for overlays);
// CreateTUN and StartWireGuard put a kernel TUN with a wireguard-go device
// (package transport/wg) inside a host, its UDP socket bound in the
// namespace; Start and StartChild run a program, or the test binary itself
// re-executed, inside a host.
//
// Network namespaces belong to threads, not processes. Anything that opens a
// socket, a TUN or a netlink socket for a host runs through Host.Do, which
// locks a thread, switches it into the namespace, and switches it back (or
// discards the thread if it cannot). Sockets keep their namespace for life,
// so only their creation needs Do; Host.Dial, Host.Listen and
// Host.ListenPacket do it for the common cases. wireguard-go opens its Bind from its own
// goroutines, so a Bind for a device in a namespace is wrapped by Host.Bind.
// A server with many goroutines that create sockets (an etcd member) belongs
// in a child process: StartChild.
//
// Everything needs root. The core takes a context and returns errors, so
// end-to-end tests of other packages can import it; the functions ending in
// T (NewHostT, ConnectT, LANT, StartWireGuardT, StartChildT, ...) are for
// tests: they skip without root through internal/testenv (a failure under
// VIPKIT_REQUIRE_ALL=1), and tear everything down with t.Cleanup, including
// when the test fails: processes killed with their process group, devices
// closed, links deleted, namespaces unmounted and removed. Sweep removes the
// namespaces of runs that were killed before their cleanup ran.
//
// A test binary that uses StartChild calls DispatchChild first in TestMain:
//
//	func TestMain(m *testing.M) {
//		netns.RegisterChild("server", runServer)
//		netns.DispatchChild()
//		os.Exit(m.Run())
//	}
package netns
