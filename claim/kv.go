package claim

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
)

// KV is the small slice of etcd's API that claims need. Package
// claim/etcdkv implements it over etcd's clientv3; package claim/memkv
// keeps etcd's semantics in memory on a transport.Clock; package
// claim/kvtest holds the contract suite both pass.
//
// Every method is one round trip to the cluster and takes a context.
// Implementations are safe for concurrent use. Errors: ErrLeaseNotFound for
// a lease that is gone, ErrInvalidTTL, ErrTooManyOps, ErrTooLarge; any
// other error (timeouts, no leader, connection loss) means the outcome is
// unknown.
type KV interface {
	// Get reads key, or every key with the prefix key when prefix is set, at
	// the latest revision.
	Get(ctx context.Context, key string, prefix bool) (GetResponse, error)

	// Txn runs If's compares atomically and then the Then ops when all hold,
	// else the Else ops.
	Txn(ctx context.Context, t Txn) (TxnResponse, error)

	// Grant creates a lease of ttl (rounded up to whole seconds, as etcd
	// keeps them) and returns its id and the TTL granted.
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, time.Duration, error)

	// KeepAliveOnce renews the lease to its full TTL and returns that TTL.
	KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error)

	// Revoke ends the lease and deletes every key attached to it.
	Revoke(ctx context.Context, id LeaseID) error

	// TimeToLive returns the lease's remaining time.
	TimeToLive(ctx context.Context, id LeaseID) (time.Duration, error)

	// Watch streams every change to keys with the prefix from revision rev
	// on (rev ≤ 0: from the next change). The channel closes when ctx ends;
	// a response with Err set (ErrCompacted, or a lost stream) is the last.
	Watch(ctx context.Context, prefix string, rev int64) <-chan WatchResponse
}

// LeaseID names a lease; 0 is no lease.
type LeaseID int64

// KeyValue is one key as the KV stores it. Revisions are etcd's: the
// cluster-wide revision of the key's creation and last modification.
type KeyValue struct {
	Key            string
	Value          []byte
	CreateRevision int64
	ModRevision    int64
	Version        int64
	Lease          LeaseID
}

// GetResponse is the answer to Get: the store's revision when read and the
// keys found, sorted by key.
type GetResponse struct {
	Revision int64
	KVs      []KeyValue
}

// CompareTarget is what a Compare looks at.
type CompareTarget uint8

// Compare targets. On a missing key ModRevision and CreateRevision read
// as 0, as in etcd, and a Value compare fails whatever Value is (etcd
// cannot tell a missing value from an empty one, so it never holds).
const (
	ModRevision CompareTarget = iota + 1
	CreateRevision
	Value
)

// Compare holds when the key's target equals Revision (ModRevision,
// CreateRevision) or Value (Value).
type Compare struct {
	Key      string
	Target   CompareTarget
	Revision int64
	Value    []byte
}

// OpKind is the kind of an Op.
type OpKind uint8

// Op kinds.
const (
	OpPut OpKind = iota + 1
	OpDelete
	OpGet
)

// Op is one operation of a transaction branch.
type Op struct {
	Kind   OpKind
	Key    string
	Value  []byte  // OpPut
	Lease  LeaseID // OpPut: attach the key to this lease (0: none)
	Prefix bool    // OpGet, OpDelete: every key with the prefix Key
}

// Put returns a put of value at key, attached to lease (0: none).
func Put(key string, value []byte, lease LeaseID) Op {
	return Op{Kind: OpPut, Key: key, Value: value, Lease: lease}
}

// Delete returns a delete of key.
func Delete(key string) Op { return Op{Kind: OpDelete, Key: key} }

// GetOp returns a read of key (or of the prefix).
func GetOp(key string, prefix bool) Op { return Op{Kind: OpGet, Key: key, Prefix: prefix} }

// Txn is an etcd transaction: If all compares hold, Then runs, else Else.
type Txn struct {
	If   []Compare
	Then []Op
	Else []Op
}

// MaxTxnOps is the most compares, and the most ops in a branch, of a
// transaction: etcd's default --max-txn-ops.
const MaxTxnOps = 128

// MaxValueSize is the largest value a KV stores, in bytes (below etcd's
// default request limit of 1.5 MiB).
const MaxValueSize = 1 << 20

// Validate checks a transaction against MaxTxnOps, MaxValueSize and the
// shape of its ops.
func (t Txn) Validate() error {
	if len(t.If) > MaxTxnOps || len(t.Then) > MaxTxnOps || len(t.Else) > MaxTxnOps {
		return fmt.Errorf("%w: %d/%d/%d", ErrTooManyOps, len(t.If), len(t.Then), len(t.Else))
	}
	for _, c := range t.If {
		if c.Key == "" || c.Target < ModRevision || c.Target > Value {
			return fmt.Errorf("claim: invalid compare on %q", c.Key)
		}
		if len(c.Value) > MaxValueSize {
			return fmt.Errorf("%w: compared value of %d bytes for %q", ErrTooLarge, len(c.Value), c.Key)
		}
	}
	for _, ops := range [][]Op{t.Then, t.Else} {
		for _, o := range ops {
			if o.Key == "" || o.Kind < OpPut || o.Kind > OpGet {
				return fmt.Errorf("claim: invalid op %d on %q", o.Kind, o.Key)
			}
			if len(o.Value) > MaxValueSize {
				return fmt.Errorf("%w: value of %d bytes for %q", ErrTooLarge, len(o.Value), o.Key)
			}
		}
	}
	return nil
}

// TxnResponse is the answer to Txn: whether the compares held, the revision
// after it, and one GetResponse per OpGet of the branch that ran, in order.
type TxnResponse struct {
	Succeeded bool
	Revision  int64
	Gets      []GetResponse
}

// EventType says what a WatchEvent did.
type EventType uint8

// Event types.
const (
	EventPut EventType = iota + 1
	EventDelete
)

// WatchEvent is one change: the key after a put, or the key (with its
// deletion's ModRevision) after a delete.
type WatchEvent struct {
	Type EventType
	KV   KeyValue
}

// WatchResponse carries changes of one revision, or the error that ends a
// watch.
type WatchResponse struct {
	Revision int64
	Events   []WatchEvent
	Err      error
}

// Keys names the keys of a VIP in the KV.
type Keys struct {
	Prefix string // /keel/<mesh>/vip/<vip>/
	Epoch  string // the counter: the newest claim, kept for good
	Holder string // the holder's claim, attached to its lease
	// Held is the prefix of the per-node keys: HeldKey(k) holds, in
	// decimal, the epoch of the newest claim the node with key k wrote,
	// kept for good (no lease). It is how a node whose state file was
	// lost learns that it once held the VIP (see State.Unchecked). There
	// is one per member key that ever claimed: at most two per VIP, since
	// the pair record fixes the members.
	Held string
}

// KeysFor returns the keys of vip in mesh.
func KeysFor(mesh string, vip fmt.Stringer) Keys {
	p := "/keel/" + mesh + "/vip/" + vip.String() + "/"
	return Keys{Prefix: p, Epoch: p + "epoch", Holder: p + "holder", Held: p + "held/"}
}

// HeldKey returns the held key of the node whose Ed25519 key is k:
// Held followed by k in lower-case hex.
func (k Keys) HeldKey(node PublicKey) string { return k.Held + hex.EncodeToString(node[:]) }

// HeldValue encodes epoch as a held key's value: decimal ASCII.
func HeldValue(epoch uint64) []byte { return strconv.AppendUint(nil, epoch, 10) }

// ParseHeldValue decodes a held key's value: a decimal epoch of 1 to
// math.MaxUint64, digits only. Anything else is ErrMalformed.
func ParseHeldValue(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, fmt.Errorf("%w: held value of %d bytes", ErrMalformed, len(b))
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: held value %q is not decimal", ErrMalformed, b)
		}
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("%w: held value %q is not an epoch", ErrMalformed, b)
	}
	return v, nil
}
