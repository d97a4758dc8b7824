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
//   - Projection: the Ziti writes, in the spec's order (create or add:
//     standby config → overrides → bind policy; remove a passive: bind
//     policy → override → standby config; delete: policies → service →
//     configs), over the Ziti interface, which *ziti.Client implements;
//   - Store and Tx: shares locked in id order at READ COMMITTED; MemStore
//     here, PostgreSQL in hosting/pgstore, one contract suite in
//     hosting/storetest;
//   - Service: create, update, dry run, delete, the cascades
//     (RemoveDeletedAgent, RemoveAccount), single reads with the hosting
//     block (Get) and listings without it (List); events through Publisher;
//   - DeriveStatus and Classify: the precedence × role table and the states.
//
// A test controller lives in hosting/zititest: an HTTP server that checks
// every request against the published Edge Management API specification
// and enforces the controller's documented override rules.
//
// Typical wiring:
//
//	hc, err := hosting.HealthCheckFromSettings(settings.Lookup)
//	proj, err := hosting.NewProjection(zitiClient, hosting.ProjectionOptions{FrontdoorID: id, HealthCheck: hc})
//	svc, err := hosting.NewService(hosting.Options{Store: pgstore.New(pool, pgstore.Options{}), Projection: proj, Publisher: bus})
//	share, err := svc.Create(ctx, hosting.Share{AccountID: acct, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
//		hosting.Update{Active: hosting.Of("agent-1"), Passive: hosting.Of("agent-2")})
//	events, err := svc.RemoveDeletedAgent(ctx, "agent-1") // on an agent DELETED event
package hosting
