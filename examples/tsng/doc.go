// Package tsng is vipkit's reference agent for named virtual services on a
// WireGuard mesh, composed from vip, crdt, probe, flow and transport. It is
// an example of how the SDK's packages fit together, and the code behind
// the tsng command (cmd/tsng is a thin main).
//
// The agent (`tsng daemon`) joins the networks of its config file and serves
// a local API over HTTP on a Unix socket (mode 0600). The CLI talks to it:
//
//	tsng status [--json]
//	tsng vip list [NET] [--json]
//	tsng vip create NET NAME
//	tsng vip port add NET VIP tcp/443 --backend server1:6443 --backend server2:7443
//	tsng vip backend add|remove|drain|undrain NET VIP PROTO/PORT NODE:PORT
//	tsng vip port set NET VIP PROTO/PORT [--port-check on|off] [--check-interval-ms N]
//	    [--check-timeout-ms N] [--failures N] [--successes N] [--idle-timeout S]
//	tsng vip show NET VIP [--json]
//	tsng vip status NET VIP [--watch] [--json]
//	tsng vip edit NET VIP [--discard]
//	tsng vip port remove NET VIP PROTO/PORT
//	tsng vip remove NET VIP [--yes]
//	tsng vip forward NET VIP PROTO/PORT [--listen 127.0.0.1:PORT]
//	tsng keygen [--json]
//	tsng init --network NAME --overlay CIDR [--address ADDR] [--name NODE] [--config FILE]
//	tsng config check FILE
//	tsng daemon [--config FILE]
//	tsng reload [--json]
//	tsng version (or --version)
//	tsng completion bash|zsh
//
// The CLI finds the agent's socket with --socket PATH (before the
// command), else TSNG_SOCKET, else the socket field of the config file
// (--config FILE before the command, else /etc/tsng/tsng.json; no other
// field is read), else at /run/tsng/tsng.sock. docs/tsng-config.md
// describes the config file, the proxies for host applications in
// netstack mode, DNS and `wg show`.
//
// `tsng status` summarises every network on one screen: up or down, its
// members, and each VIP's address, state and health (how many of its
// backends this node finds eligible: ok, degraded, down, no backends, or
// unknown while the network is down).
//
// Network and VIP selectors accept exact names, full ids and unique id
// prefixes; backend node selectors also accept node names. A backend
// whose node has left the member list stays configured (status: departed)
// and is named by its node id, or by the name this agent knew, to remove
// it; it never blocks other edits. `backend drain` stops new flows to a
// backend on every member while its existing flows go on
// (docs/backend-drain.md). An ambiguous
// selector changes nothing and lists its candidates. Every mutation is
// atomic; `edit` submits one whole draft checked against the revision it
// was read at, and keeps a rejected or invalid file, printing its path.
// The edit file names each backend's node by its name (by its id where
// the node has no name of its own, or is no member) and leaves empty
// fields out. A kept edit lives in $XDG_CACHE_HOME/tsng/edit (or
// ~/.cache/tsng/edit), mode 0600, with the service it was made from
// beside it; running the edit again reopens it. If the service changed
// meanwhile, the kept edit is rebased first: each change of yours (a
// field, a listener, a backend) is applied onto the current service, and
// the editor opens on the result. Where the same thing was changed both
// ways, nothing opens: the file lists each conflict under "conflicts"
// (its path, base, yours and theirs; the service holds yours), the run
// ends with exit 5, and the edit is saved once the conflicts are resolved
// and the list deleted. --discard drops a kept edit and edits the current
// service.
// Configuration updates need the network to be up locally; saved
// configuration stays readable while it is stopped.
//
// `tsng reload` (or SIGHUP) makes the agent re-read its config file and
// apply the changed peers of each network: members join and leave a
// running mesh, and the sessions and NAT bindings of the other members
// stay. A config that is invalid or changes anything else is refused, and
// the running config stays (exit 6); a reload while another runs is
// refused (exit 1).
//
// # Exit statuses
//
//	0  success
//	1  any other failure
//	2  bad command line
//	3  not found (network, service, listener, backend or node)
//	4  ambiguous selector (candidates on stderr)
//	5  stale draft: the service changed since it was read
//	6  invalid configuration (each bad field on stderr), or an invalid edited file
//	7  a limit would be exceeded
//	8  already exists
//	9  the network is not up locally
//	10 the agent's local API is not reachable
package tsng
