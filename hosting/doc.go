// Package hosting decides which agents host a share, in which role, and
// projects that onto OpenZiti, where terminator precedence does the
// failover: actives bind at precedence required through the share's own
// host.v1, passives at default through a per-identity override that points
// the share's service at a second, "standby" host.v1. It also runs the
// cascades of agent and account deletion and reports what Ziti actually
// has (the hosting status).
//
// The pieces:
//
//   - the model: Share, Hosts (two sorted sets of agent ids), Update with
//     PUT and PATCH semantics (Hosts.Apply; List tells an absent list from
//     null), Hosts.Without for the cascade (promoting every passive when no
//     active remains);
//   - Validator: at least one active; no overlap; at most MaxHosts (8);
//     every agent live and in the share's account, with one message for
//     every agent failure; the messages are the Msg* constants;
//   - Projection: the Ziti writes, in a fixed order (create or add:
//     standby config → overrides → bind policy; remove a passive: bind
//     policy → override → standby config; delete: policies → service →
//     configs), over the Ziti interface, which *ziti.Client implements;
//   - Store and Tx: shares locked in id order at READ COMMITTED; MemStore
//     here, PostgreSQL in hosting/pgstore, one contract suite in
//     hosting/storetest;
//   - Service: create, update, dry run, delete, the cascades
//     (RemoveDeletedAgent, RemoveAccount), consumed events applied exactly
//     once through the inbox (HandleIntake, DecodeIntake against the
//     intake schema: agents created, updated and deleted, accounts and
//     frontdoors deleted), single reads with the hosting
//     block (Get) and listings without it (List); events through the
//     outbox, written in the change's transaction (Options.Outbox), or a
//     Publisher after commit; the audit principal from the context
//     (WithPrincipal); the NetworkAvailability gate of a delete's Ziti
//     clean-up and the Ingress teardown before a cascade;
//   - the event wire format (Event.Message, DecodeAgentDeleted) of
//     docs/hosting-events.md; settings (HealthCheckFromSettings,
//     MaxHostsFromSettings) under frontdoor's property names;
//   - Reconciler: on start, periodically and after a failed compensation
//     (Options.OnDrift), under one lock per deployment (ReconcileLocker)
//     and each share's row lock, it compares the share's Ziti objects
//     with the projection and repairs the drift (Drift, DriftKind); it
//     deletes only orphans tagged with this deployment
//     (ProjectionOptions.DeploymentID), older than a grace period and not
//     named in the outbox; a dry run lists the drift
//     (docs/hosting-reconciler.md);
//   - DeriveStatus and Classify: the precedence × role table and the
//     states; Projection.Status adds each host's Problem (no identity,
//     several, no override, not on the bind policy).
//
// Cascades are per host: a live passive whose identity cannot be resolved
// does not fail another host's cascade (UpdateOptions.SkipBroken). It is
// kept off the bind policy and reported by the status. A rename renames
// every Ziti object of the share: service, both host.v1 configs and the
// bind policy.
//
// Subpackages: hosting/api is the HTTP API (HAL+JSON, problem+json);
// hosting/events the RabbitMQ consumer of the consumed events and the outbox
// relay; hosting/pgstore the PostgreSQL store; hosting/ziti the controller
// client (with updb and certificate login). hosting/zititest is a model
// controller for tests: it checks every request against the published Edge
// Management API specification and config data against the host.v1
// schema, enforces the controller's override rules, and routes circuits to
// the terminators of simulated hosting agents.
//
// Typical wiring:
//
//	hc, err := hosting.HealthCheckFromSettings(settings.Lookup)
//	proj, err := hosting.NewProjection(zitiClient, hosting.ProjectionOptions{FrontdoorID: id, HealthCheck: hc})
//	max, err := hosting.MaxHostsFromSettings(settings.Lookup)
//	svc, err := hosting.NewService(hosting.Options{Store: pgstore.New(pool, pgstore.Options{}), Projection: proj,
//		Outbox: true, Validator: hosting.Validator{MaxHosts: max}})
//	share, err := svc.Create(ctx, hosting.Share{AccountID: acct, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
//		hosting.Update{Active: hosting.Of("agent-1"), Passive: hosting.Of("agent-2")})
//	events, err := svc.RemoveDeletedAgent(ctx, "agent-1") // on an agent DELETED event
package hosting
