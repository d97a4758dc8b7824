// Package modpin holds the imports that exist only to put a version of a
// module into vipkit's go.mod, where every importer's module graph reads it.
// Nothing imports this package.
//
// google.golang.org/genproto: pebble's github.com/cockroachdb/errors requires
// the monolithic genproto of April 2023, which still contains
// googleapis/rpc/... and googleapis/api/..., the packages that later moved
// into their own modules (google.golang.org/genproto/googleapis/rpc and
// .../api, which etcd and gRPC require). An importer whose graph selects that
// old genproto together with the split modules fails `go mod tidy` with
// "ambiguous import". Inside vipkit gVisor's go.mod raises genproto past the
// split, but an importer's pruned module graph reads only vipkit's own go.mod
// (and those of the modules it imports packages from), so an importer of
// crdt/pebblestore and claim/etcdkv without transport/netstack never saw that
// requirement. A requirement written into go.mod by hand does not survive
// `go mod tidy`, which keeps only modules that provide a package; this import
// of a post-split genproto package makes genproto such a module, so tidy
// keeps the requirement and MVS selects a genproto without the moved
// packages for every importer. The package imported is an alias of
// google.golang.org/protobuf's fieldmaskpb: it adds no code.
//
// scripts/importer-check.sh fails when this pin is missing.
package modpin

import _ "google.golang.org/genproto/protobuf/field_mask" // see the package doc
