// Package vip gives a WireGuard mesh named virtual services: a name such as
// api.home with independent TCP and UDP listeners, each mapping its port to
// backend nodes and application ports. It composes crdt (configuration as
// signed registers), probe (health and RTT) and flow (NAT) on the transport
// seams.
//
// The pieces, in the order an agent wires them:
//
//   - The model: Service, Listener (with its generation, checks and idle
//     timeout), Backend (a node identity and a port); Validate checks every
//     field with a specific message, and Limits bounds listeners, backends,
//     checks, flows and fragments (LimitError names the limit).
//   - The field schema on crdt (Obsolete, CheckField, Rank and the keys
//     documented in schema.go): concurrent edits of different backends
//     merge; one field resolves by crdt's order, a listener register by
//     generation first; backend fields of a removed listener never
//     reappear and are dropped, because the listener's generation is part
//     of their keys and its removal is final; a service's port floor,
//     raised by each listener removal, drops removed listeners' registers
//     too, so any number of distinct ports can come and go; fields that
//     break the schema (names with control characters, generations above
//     MaxGeneration) are refused on merge by every replica alike.
//   - Registry: one network's configuration on a crdt.Replica. Reads carry a
//     Revision; Save replaces a whole draft if the service is still at the
//     revision the editor was shown (ConflictError otherwise, nothing
//     written); Create, PortAdd, BackendAdd/Remove, PortSet, PortRemove and
//     Remove are atomic; BackendDrain puts a backend into maintenance on
//     every client (docs/backend-drain.md). A backend whose node left the
//     member list stays addressable by its node id (and by the name
//     RegistryOptions.FormerNodes knew) and never blocks other edits.
//     Selectors take exact names, full ids and unique id
//     prefixes (AmbiguousError lists candidates). Addresses are allocated
//     from the overlay range from a seed of the service id (ResolveAddresses
//     decides collisions the same way on every node); names that collide
//     with nodes or other services are reported (ResolveNames).
//   - Replicator: whole snapshots to every peer on each local change, and a
//     periodic push-pull digest exchange (DefaultRotation, DefaultFanout)
//     that repairs lost frames and returning replicas without the creator
//     online, over a Carrier the agent supplies.
//   - Engine: a transport.PacketIO wrapper between the host's stack and
//     wireguard-go that NATs connections to VIPs at the client's ingress,
//     picks the eligible backend with the lowest smoothed RTT, probes peers
//     through the tunnel, runs TCP connect checks, fails UDP over on ICMP
//     port unreachable, and reports Status: health and RTT per backend, and
//     cumulative counters per backend, listener and VIP (Totals) that reset
//     only when the engine is rebuilt (docs/counters.md).
//   - DNSServer: answers VIP and node names of the network's domain on the
//     overlay, with a 30 s TTL.
//
// A minimal agent:
//
//	rep, _ := crdt.Open(ctx, crdt.Config{Network: netID, Signer: key, Members: members, Store: store, Obsolete: vip.Obsolete, Check: vip.CheckField, Rank: vip.Rank})
//	var eng *vip.Engine
//	reg, _ := vip.NewRegistry(vip.RegistryOptions{Network: "home", Prefix: overlay, Replica: rep, Nodes: nodes,
//		OnChange: func(ids []vip.ServiceID, local bool) { eng.Apply() }})
//	eng, _ = vip.NewEngine(vip.EngineOptions{Registry: reg, Self: self, Host: host})
//	dev, _ := wg.NewDevice(eng, wgConfig, wg.Options{Bind: bind})
//
// examples/tsng composes all of it into a daemon with a CLI.
package vip
