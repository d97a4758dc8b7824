// Package crdt holds a network's shared service configuration as signed
// field registers: each field is one register (one key of one service),
// signed by the member who wrote it, merged by a total order that every
// replica computes alike, persisted before it is exposed, and carried
// between nodes as whole-service snapshots.
//
// crdt knows nothing of listeners or backends: the vip package owns the
// field schema (which keys exist, what their values mean, listener
// generations, listener and backend limits). crdt gives it a Replica to
//
//   - make local edits (Edit) and deletions (Delete): signed with the
//     node's key, with a Lamport clock past everything seen and the author's
//     next durable counter, committed before they are returned;
//   - merge what other members publish (MergeSnapshot, MergeSnapshots,
//     MergeFields), verified under ZIP-215 rules, in batches;
//   - list services and their fields (Services, Service, Fields), export a
//     service for publishing (EncodedSnapshot, Snapshot);
//   - drop fields the schema calls obsolete (Config.Obsolete), refuse
//     fields that break it (Config.Check), rank a register's values before
//     the clock (Config.Rank), and hold a per-service error state
//     (SetServiceError, ServiceInfo.Err);
//   - report what is held beyond the limits (OverLimit) and what merges
//     refused (Refused);
//   - follow the network's membership (Config.Members, SetMembers) and
//     keep the list of former members (Former, MergeFormer).
//
// A typical use:
//
//	store, err := pebblestore.Open(ctx, dir, nil) // or crdt.NewMemStore()
//	r, err := crdt.Open(ctx, crdt.Config{Network: net, Signer: key, Members: members, Store: store})
//	defer r.Close()
//	fields, err := r.Edit(ctx, svc, rev, crdt.Edit{Key: "name", Value: []byte("api")})
//	snap, _ := r.EncodedSnapshot(svc) // publish snap; peers call MergeSnapshot
//
// # Merge
//
// For each (network, service, key) the field with the highest (rank,
// Lamport clock, author id, canonical bytes) wins, compared in that order,
// the id and the bytes (the field's whole encoding, signature included)
// as unsigned byte strings. The rank is the schema's (Config.Rank, a pure
// function of the field; 0 without it). An edit signs each key with the
// clock held for that key plus one (1 for a new key): it is causally after
// every field of that key the replica has seen, and a field at MaxClock
// pins only its own key (see Edit). The merge is commutative, associative and
// idempotent, so replicas that hold the same fields hold byte-identical
// state whatever the arrival order, duplicates or wall time. Each
// author's counter is durable and strictly increasing: counters are
// reserved in the store (in blocks of 1024, one extra synced write per
// block) before anything is signed with them, the edit commits with the
// counter it used, and a restart continues past the whole reservation, so
// an author never signs two fields with one counter, even across a crash or
// a failed commit. A replica that merges its own author's field continues
// past that field's counter too. Receivers accept counters in any order;
// only the merge order decides a winner.
//
// A service is deleted by a permanent signed tombstone: a field with key
// TombstoneKey and no value. It wins over every other field of the service
// id, which are dropped and never come back by replay; a recreated service
// takes a fresh id. A field missing from a snapshot is never a deletion.
//
// # Creator-bound ids and compaction
//
// Create makes a service whose id is bound to its creator: CreatedID of
// the network, the creator's key and the counter of the service's
// creation field (CreationKey), which the creator signs first and which
// stays beside its tombstone. Markers are compacted by certificates: the
// lowest-key member proposes a Compaction (Propose), every member it
// names acknowledges it when its held live services match it
// (Acknowledge, committed before the acknowledgement is returned), and a
// replica that gathers the acknowledgements (AddCertificate) drops the
// tombstones it covers and from then on refuses every field of a service
// it names deleted (ErrDeleted). So the markers held stay under
// MaxTombstones while deletions are unbounded; ids made before creation
// fields keep their tombstones for good. docs/crdt.md gives the argument.
//
// # Verification
//
// A field is accepted when its network is the replica's, its key is not
// reserved, its clocks are at most MaxClock, its author is a member (or a
// former member and its counter is 1..the member's last counter), the
// schema accepts it (Config.Check) and its signature verifies. Each
// failure has its own error (ErrWrongNetwork, ErrReservedKey,
// ErrLamportRange, ErrNotMember, ErrFormerMember, ErrInvalidField,
// ErrWrongDomain, ErrBadSignature) and is counted by reason
// (Replica.Refused). A field of a non-member, of a former member past its
// last counter, or one the schema refuses is left out while the rest of
// its snapshot merges; the other failures refuse the whole snapshot.
//
// # Former members
//
// A member that leaves (SetMembers, or Open with Config.Members that lack
// it) becomes a former member: its key and the last counter it signed,
// as far as the replica knows (the highest counter of its held fields).
// Replicas exchange the list (Former, MergeFormer; vip's Replicator
// carries it) and merge it by the highest counter per author, so that a
// replica that joins after the member left still accepts what it signed
// while it was a member, its tombstones above all, and refuses what its
// key signs later, since an author's counters only grow. The list is
// bounded (Limits.MaxFormerMembers, the lowest author ids kept) and
// persisted with the member set in the meta record. docs/crdt.md gives
// the argument and what it leaves open. The
// bounds are constants of the wire format, never relative to local
// state, so every replica accepts and refuses the same fields. Signatures follow one rule set, ZIP-215, as implemented
// by github.com/hdevalence/ed25519consensus, for single and batch checks
// alike (crypto/ed25519's stricter Verify would let replicas disagree). A
// snapshot's new fields are verified as one batch; when a batch fails each
// of its fields is verified alone so that the error names the bad ones.
// Fields held byte-identical are not verified again.
//
// # Wire encoding (a contract)
//
// Fields and snapshots are encoded in postcard's wire format, as serde
// encodes the structs below: unsigned integers as LEB128 varints (7 bits a
// byte, least significant group first, 0x80 set on every byte but the last;
// at most 10 bytes for u64 and 5 for u32; decoders accept only the shortest
// form), signed integers (none here) zigzag-mapped first, a byte vector as
// a varint length and the bytes, a fixed array [u8; N] as its N bytes with
// no prefix, an Option as a tag byte 0 (None) or 1 (Some) followed by the
// value, and struct fields in order with nothing between them.
//
// A field, in order:
//
//	network   [u8; 16]         the network id
//	service   [u8; 16]         the service id
//	key       Vec<u8>          varint length (1..MaxKeyBytes) + key bytes
//	value     Option<Vec<u8>>  0x00, or 0x01 + varint length (..MaxValueBytes) + bytes
//	lamport   u64              varint, at most MaxClock
//	author    [u8; 32]         the author's Ed25519 public key
//	counter   u64              varint, at most MaxClock
//	signature Vec<u8>          0x40 + the 64 signature bytes
//
// The signature is Ed25519 over Domain ("tsunagi-vip-field/v1" and a NUL
// byte, 21 bytes) followed by the field's encoding with the signature
// vector empty, that is with a single 0x00 in place of 0x40 and the 64
// bytes.
//
// A snapshot, in order:
//
//	version   u32         varint, SnapshotVersion (1)
//	network   [u8; 16]    every field's network
//	service   [u8; 16]    every field's service
//	fields    Vec<Field>  varint count (at most MaxFieldsPerService+1), then the fields
//
// Exported snapshots list fields in key order (the tombstone, whose key
// starts with 0x00, first); decoders accept any order. A whole encoded
// snapshot must fit Limits.MaxSnapshotBytes, the control frame limit.
// testdata/vectors.txt pins these encodings with golden vectors.
//
// # Storage
//
// A Store holds one meta record and one record per service; MemStore is in
// memory, crdt/pebblestore is on disk (a separate package, so that importers
// that need no disk store do not link pebble). A service record is the
// service's snapshot encoding; the meta record is version u32 (2), network
// [u8; 16], the Lamport high-water mark u64, a vector of (author
// [u8; 32], reserved counter u64), a vector of member authors [u8; 32] and
// a vector of former members (author [u8; 32], last counter u64), each
// vector in strict author order; each record is followed by its CRC-32C
// (Castagnoli, little endian). A version-1 meta record (which ends after
// the counters) still loads: its replica takes Config.Members as the
// member set, has no former members, and rewrites the record as version
// 2 on Open. Open checks every record and
// fails with ErrCorrupt or ErrUnknownVersion rather than reset anything.
// Every change (merged services, Lamport mark, counters, members) is one synced
// Commit, made before the change is visible or returned for publishing.
//
// A Store must never return an older state than the last one it
// acknowledged (a Commit that returned nil): that is what keeps an
// author's counter from being used twice, since the reservation that
// covers every counter signed is itself an acknowledged commit. A store
// that cannot prove it holds the last acknowledged state fails Load with
// ErrCorrupt. pebblestore proves it with a witness file outside pebble's
// log (see its package doc); MemStore holds its state in memory.
//
// # Limits
//
// Limits bounds active services (64), tombstones (1024), signed fields per
// active service (192), key and value bytes, and the encoded snapshot (the
// control frame limit, 64 KiB by default). A local edit that would exceed
// one is refused with the limit's error; deleted services do not count as
// active.
//
// Merges are not refused at these limits, since which fields a replica
// refused would then depend on their arrival order. What merges bring past
// them is held, up to hard caps (Limits.MaxHeld*, twice the limits by
// default), and decided from the held fields alone, the same on every
// replica: the first MaxServices active services in id order are the ones
// to route; the others, and services past MaxFieldsPerService, carry
// ErrServiceLimit or ErrFieldLimit in ServiceInfo.Err, naming the authors
// of their fields; a history of MaxTombstones or more is reported as
// ErrTombstoneLimit, naming the authors of the tombstones (OverLimit), and
// local deletions then fail. Past the hard cap of services, the highest
// ids are not held (counted in OverLimit.Dropped), so the held set is the
// lowest ids whatever the order; past the hard caps of tombstones and
// fields, merges are refused with their error and the service's error
// state is set. Tombstones are dropped only by a compaction certificate.
package crdt
