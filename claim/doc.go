// Package claim moves one IPv6 /128 service VIP between the two members of
// an appliance pair on an overlay mesh, so that at every instant at most one
// node carries it.
//
// # The pieces
//
//   - Claim: the holder's signed statement (label "keel vip 1\n") that it
//     carries the VIP at an epoch. Epochs only grow; equal epochs go to the
//     lower public key (Claim.Newer). The encoding is canonical and
//     versioned (encoding.go documents it; testdata/golden.txt holds golden
//     vectors).
//   - PairRecord: the VIP and both members' keys, signed by both members (or
//     by a trust root in place of a member). Every claim carries it.
//   - TrustStore: node id and overlay address → Ed25519 key, and the trust
//     roots (Trust, LoadTrustFile).
//   - Policy: the acceptance rules. A node takes a claim only if it is newer
//     than the one it holds, at most MaxEpochJump ahead, for this mesh,
//     signed by the trust store's key for the holder, sent from the address
//     it names, and consistent with the kept pair record. A release is taken
//     only from the other member. Each refusal is its own sentinel error and,
//     on the members' channel, a 409 with a reason.
//   - State: the pure state machine (holder, replica, fenced, released),
//     kept by a StateStore (FileStore writes atomically). There is no role
//     field: the primary is the member with the newest claim that is neither
//     fenced nor released. Nothing about the last renewal is persisted.
//   - KV: the slice of etcd that claims need. claim/etcdkv is etcd (clientv3),
//     claim/memkv keeps etcd's semantics in memory on a transport.Clock, and
//     claim/kvtest is the contract suite both pass.
//   - Controller: "tend". With etcd, a claim is one transaction writing
//     /keel/<mesh>/vip/<vip>/epoch (the counter, kept for good) and
//     /keel/<mesh>/vip/<vip>/holder (on the holder's lease), requiring the
//     counter at the revision read and the holder key absent. The holder
//     renews every 2 s (one round trip), the lease's TTL is 20 s, and the
//     holder drops the VIP 10 s after the last renewal etcd answered,
//     counted from when that renewal was sent, and is then fenced. Since
//     etcd cannot expire the lease sooner than 20 s after that renewal,
//     the holder has dropped at least 10 s before anyone can claim. The
//     other member claims once the holder's lease has expired, if it took
//     the counter's claim and is not fenced. A fenced node never claims
//     again by itself; only Promote clears the fence. The claim's
//     transaction also puts /keel/<mesh>/vip/<vip>/held/<node key> (the
//     epoch, no lease, kept for good), so that a node whose state file was
//     lost learns from etcd that it held the VIP before and stays fenced
//     (State.Unchecked; without etcd it asks the other member). The
//     renewal's age is
//     timed on the Clock, which in production is BootClock
//     (CLOCK_BOOTTIME), so a holder waking from suspend drops at once.
//   - Promote: the operator's move, with or without etcd (see
//     Controller.Promote), and the only way a first holder comes to be
//     (see "The first holder").
//   - HandOver: the holder's request that the other member take the VIP
//     over by a planned promote of its own, which that member makes only
//     when its service check passes (Config.Healthy; ErrCheckFailing
//     otherwise, and the holder keeps the VIP). It clears no fence.
//   - FenceToken: the compares (holder key's ModRevision and value) an
//     importer puts into its own etcd transactions so that they fail once
//     the VIP has changed hands (Controller.FenceToken, etcdkv.Cmps).
//   - Watch: a channel of every change of role, epoch, holder, fence,
//     release and carry (Controller.Watch), so an importer need not poll
//     Status. It never blocks the controller: a reader that falls behind
//     by a full queue sees a gap, counted in Change.Missed, then the
//     latest view.
//   - The members' channel: HTTP POST /v1/vip for claims, releases, epoch
//     queries and hand-overs (Server, Client), with body limits and
//     timeouts.
//   - Carrier: the seam to the OS: add or drop the /128 (preferred_lft 0)
//     and route it to the holder in WireGuard's allowed IPs. The reference
//     controller implements it with netlink and wireguard-go;
//     claim/claimtest has a recording fake. A LeasedCarrier also takes the
//     drop deadline (DropAfter after the send of the last answered
//     renewal, on the Clock) and has the OS remove the address at it by
//     itself; every answered renewal moves it on. So the fence holds
//     even when the controller is frozen (SIGSTOP, a cgroup freeze, a
//     paused VM) or dead: nothing of the controller has to run for the
//     address to go.
//
// # Use
//
//	policy := &claim.Policy{Mesh: "home", Trust: trust, Overlay: overlay}
//	ctl, err := claim.NewController(claim.Config{
//		Policy: policy, Self: self, Key: key, VIP: vip, Pair: pair,
//		KV: etcdkv.New(cli), Carrier: carrier,
//		Store: &claim.FileStore{Path: "/var/lib/keel/vip/state.json"},
//		Channel: &claim.Client{}, Peers: peers,
//	})
//	if err != nil {
//		return err
//	}
//	if err := ctl.Start(); err != nil {
//		return err
//	}
//	defer ctl.Close()
//	http.Handle(claim.MembersPath, claim.NewServer(ctl))
//	// Once, on the member chosen as the first primary:
//	//	_, err = ctl.Promote(ctx, claim.PromoteOptions{})
//	for ch := range ctl.Watch(ctx, 0) {
//		// ch.Role, ch.Epoch, ch.Holder, ch.Fenced, ch.Carried
//	}
//
// # The first holder
//
// No controller claims a VIP that nobody has held. A controller fails
// over on its own only from the other member's claim in the counter key
// (State.MayFailover), so while the counter is empty both members of a
// new pair stay replicas, however long they run. The first holder is made
// by an operator's (or installer's) Promote on the member chosen to be
// the primary: with a KV it writes epoch 1 into the counter and holder
// keys, as any claim, and carries once the transaction succeeded; without
// a KV it announces epoch 1 and carries once a majority of the peers that
// answered took it. From then on the VIP moves by failover or Promote.
// ExampleController shows the sequence.
//
// # Time
//
// The Controller reads time only through its Clock (Config.Clock; nil
// means BootClock). That covers the renewal's age, the drop deadline, the
// steps, promote's lease wait and CallTimeout: each KV, Carrier and
// members' channel call gets a context that a Clock timer ends with
// context.DeadlineExceeded (contexts derived from it, such as gRPC's,
// report the same). It has no Deadline of its own, since a Clock's time
// need not be wall-clock time; gRPC therefore sends etcd no deadline, and
// the call ends by cancellation. On a manual clock a call
// that hangs ends when the clock is advanced past CallTimeout (from
// another goroutine than the one stuck in the call).
//
// Only the members' channel's HTTP plumbing runs on the real clock:
// Server.HTTPServer's read, write and idle timeouts, Server.Timeout and
// the 10 s timeout of Client's default http.Client. They are net/http's
// socket deadlines and request bounds, which net/http sets from time.Now;
// they only cut off a slow peer and decide nothing of the fence, which
// depends on the renewal's age on the Clock alone.
//
// claim imports only transport; etcd is confined to claim/etcdkv.
package claim
