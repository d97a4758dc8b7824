package claim

import (
	"errors"
	"fmt"

	"github.com/vipkit/vipkit/transport"
)

// Encoding and signature errors.
var (
	// ErrMalformed is returned when a claim, release or pair record is not a
	// valid canonical encoding: wrong length, trailing bytes, a bad mesh name,
	// an address that is not IPv6, a zero epoch, unsorted or repeated fields.
	ErrMalformed = errors.New("claim: malformed encoding")
	// ErrVersion is returned for an encoding whose version byte this package
	// does not know.
	ErrVersion = errors.New("claim: unsupported encoding version")
	// ErrBadSignature is returned when a signature does not verify under the
	// key the message names.
	ErrBadSignature = errors.New("claim: bad signature")
	// ErrTooLarge is returned when a message or request body exceeds its
	// documented limit.
	ErrTooLarge = errors.New("claim: message too large")
)

// Acceptance errors: each is one rule of Policy.Accept and Policy.AcceptRelease.
var (
	// ErrUnknownNode is returned when the trust store holds no key for the
	// address a claim or release names.
	ErrUnknownNode = errors.New("claim: node not in trust store")
	// ErrUntrustedKey is returned when a message is signed by a key other
	// than the one the trust store holds for its signer.
	ErrUntrustedKey = errors.New("claim: key is not the trust store's key for the node")
	// ErrWrongMesh is returned for a message made for another mesh.
	ErrWrongMesh = errors.New("claim: wrong mesh")
	// ErrWrongSender is returned when a claim or release arrives from a peer
	// other than the address it names.
	ErrWrongSender = errors.New("claim: sender is not the address the message names")
	// ErrStale is returned for a claim that is not newer than the held one
	// (an old claim, or the replay of the held one).
	ErrStale = errors.New("claim: stale epoch")
	// ErrEpochJump is returned for a claim or release more than MaxEpochJump
	// epochs ahead of the held claim.
	ErrEpochJump = errors.New("claim: epoch jump too large")
	// ErrEpochExhausted is returned for a claim or release whose epoch
	// cannot be followed (above MaxEpoch: no next epoch within the jump
	// window), and by a claim or promote that would need such an epoch.
	ErrEpochExhausted = errors.New("claim: epoch cannot be followed")
	// ErrRedirect is returned by Client for a peer that answered with a
	// redirect: the members' channel follows none.
	ErrRedirect = errors.New("claim: members' channel answered with a redirect")
	// ErrPairMismatch is returned when a claim is inconsistent with its pair
	// record: another VIP or mesh, or a holder that is not a member.
	ErrPairMismatch = errors.New("claim: inconsistent with the pair record")
	// ErrPairChanged is returned for a pair record that names other members
	// (or another VIP) than the record the node already keeps.
	ErrPairChanged = errors.New("claim: pair record names other members than the kept one")
	// ErrPairSignatures is returned for a pair record not signed by both
	// members (a trust root may sign in place of a member), or signed by a
	// key that is neither a member nor a trust root.
	ErrPairSignatures = errors.New("claim: pair record not signed by both members")
	// ErrNotPairMember is returned for a release or a hand-over request
	// that does not come from the other member named in the pair record.
	ErrNotPairMember = errors.New("claim: not from the other pair member")
	// ErrNotHolder is returned when a node is asked to release a VIP it does
	// not hold.
	ErrNotHolder = errors.New("claim: not the holder")
	// ErrFenced is returned when a fenced node is asked to release a VIP
	// its newest claim names it for: it has already dropped it.
	ErrFenced = errors.New("claim: node is fenced") // +checklocksignore: never written
	// ErrCheckFailing is returned by a member asked to take the VIP over
	// (HandleHandOver) whose own service check does not pass on a fresh
	// result, or that has no check: the holder keeps the VIP.
	ErrCheckFailing = errors.New("claim: the service check does not pass on this node")
)

// Address errors, from the pair record and from spec validation.
var (
	// ErrVIPIsMember is returned for a VIP equal to a member's own address.
	ErrVIPIsMember = errors.New("claim: vip is a member's own address")
	// ErrVIPOutsideRegion is returned for a VIP outside the /112 of the
	// overlay prefix that holds the holder's own address.
	ErrVIPOutsideRegion = errors.New("claim: vip outside the holder's region /112")
	// ErrVIPOutsidePrefix is returned for a VIP outside the overlay prefix.
	ErrVIPOutsidePrefix = errors.New("claim: vip outside the overlay prefix")
	// ErrVIPInPeerAllowedIPs is returned for a VIP inside a peer's allowed IPs.
	ErrVIPInPeerAllowedIPs = errors.New("claim: vip inside a peer's allowed ips")
	// ErrRegionFull is returned by Allocate when no free /128 is left.
	ErrRegionFull = errors.New("claim: no free vip in the region")
)

// KV and controller errors.
var (
	// ErrLeaseNotFound is returned by a KV for a lease that expired, was
	// revoked or never existed.
	ErrLeaseNotFound = errors.New("claim: lease not found")
	// ErrCompacted is returned (in a WatchResponse) for a watch that starts
	// at a revision the KV no longer keeps.
	ErrCompacted = errors.New("claim: revision compacted")
	// ErrInvalidTTL is returned for a lease TTL below one second or above
	// the KV's maximum.
	ErrInvalidTTL = errors.New("claim: invalid lease ttl")
	// ErrTooManyOps is returned for a transaction with more than MaxTxnOps
	// compares or operations.
	ErrTooManyOps = errors.New("claim: too many operations in transaction")
	// ErrCompareFailed is returned by the controller when a claim's
	// transaction lost its compare: someone else wrote the counter or holder
	// key since it was read. Nothing was written.
	ErrCompareFailed = errors.New("claim: compare failed, claim not written")
	// ErrHolderUnreachable is returned by a promote whose holder did not
	// answer the release, when the old primary was not declared gone.
	ErrHolderUnreachable = errors.New("claim: holder did not answer the release")
	// ErrNoMajority is returned by a promote without etcd when no majority
	// of the peers that answered took the claim (or none answered).
	ErrNoMajority = errors.New("claim: no majority of peers took the claim")
	// ErrLeaseWait is returned by a promote with etcd when the old holder's
	// lease did not expire within the TTL plus one election timeout.
	ErrLeaseWait = errors.New("claim: holder lease did not expire in time")
	// ErrNoCounter is returned by a promote or claim when the counter key
	// holds no valid claim to continue from and the node cannot start one.
	ErrNoCounter = errors.New("claim: no valid counter claim")
	// ErrStateLost is reported (to Config.OnError) when a node whose
	// state held no claim finds its own held key in the KV, or learns
	// from its peer that the newest claim is its own: it once held the
	// VIP, its state file was lost or replaced, and it is fenced until a
	// promote.
	ErrStateLost = errors.New("claim: state file lost; this node held the vip before, fenced") // +checklocksignore: never written
	// ErrCorruptState is returned when a state file cannot be decoded. The
	// file is left untouched.
	ErrCorruptState = errors.New("claim: corrupt state file")
	// ErrNoToken is returned by Controller.FenceToken when this node does
	// not carry the VIP with a KV.
	ErrNoToken = errors.New("claim: no fencing token") // +checklocksignore: never written
	// ErrStarted is returned by Controller.Start when it already started.
	ErrStarted = errors.New("claim: controller already started") // +checklocksignore: never written
	// ErrClosed is returned by a closed Controller. It matches
	// transport.ErrClosed (and so net.ErrClosed).
	ErrClosed = fmt.Errorf("claim: closed: %w", transport.ErrClosed)
	// ErrInvalidOptions is returned by NewController for a Config it
	// cannot use, and by Promote for an observer's.
	ErrInvalidOptions = errors.New("claim: invalid options")
	// ErrConfig is another name for ErrInvalidOptions: the same error
	// value, so errors.Is matches either.
	//
	// Deprecated: use ErrInvalidOptions.
	ErrConfig = ErrInvalidOptions
	// ErrDeadlinePassed is returned by a LeasedCarrier asked to carry a VIP
	// with less than MinCarryLeft before its deadline: it dropped the
	// address instead.
	ErrDeadlinePassed = errors.New("claim: carry deadline passed, address dropped")
)
