package claim

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Role is what a node of a pair is for a VIP. There is no role field
// anywhere: the role is derived from State. The primary (RoleHolder) is the
// node of the pair with the newest claim that is neither fenced nor
// released; the other is the replica.
type Role uint8

// Roles.
const (
	RoleReplica Role = iota
	RoleHolder
)

func (r Role) String() string {
	if r == RoleHolder {
		return "primary"
	}
	return "replica"
}

// State is a node's durable view of one VIP. Its methods are pure: each
// returns the next State and touches nothing else, so the state machine is
// tested without a KV, a clock or a network. Nothing about the last lease
// renewal is kept here: a renewal's age lives only in the controller's
// memory, timed on the Clock, and a node that starts carries nothing until
// it has renewed its lease itself.
type State struct {
	Held          *Claim      // the newest claim taken, this node's or the other's
	Pair          *PairRecord // the kept pair record (nil: none yet)
	Fenced        bool        // lost the VIP without releasing it; cleared only by a promote
	Released      bool        // released Held (its own claim) to the other member
	Lease         LeaseID     // this node's lease (the holder key's, when holding)
	ReleasedLease LeaseID     // the lease revoked by the release, until found gone
	Abandoned     LeaseID     // the lease a fenced holder stops renewing and revokes
	// Unchecked is set on a member that started with no claim in its
	// state (a new node, or one whose state file was lost or replaced)
	// until it has learnt whether it held the VIP before: with a KV from
	// its held key (Keys.HeldKey), without one from the other member's
	// newest claim. Meanwhile it is treated as fenced: it never holds and
	// never fails over. HeldCheck clears it; so does a claim of its own.
	// It is kept in the state, so a restart before the check (after the
	// node took a claim from the channel, say) does not skip it.
	Unchecked bool
}

// Role returns self's role: RoleHolder when it holds the newest claim and is
// neither fenced, released nor unchecked.
func (s State) Role(self netip.Addr) Role {
	if s.Held != nil && s.Held.Holder == self && !s.Fenced && !s.Released && !s.Unchecked {
		return RoleHolder
	}
	return RoleReplica
}

// Take returns the state after self took c, a claim newer than Held. If
// self was the holder, neither fenced nor released, and c names another
// node, self lost the VIP without releasing it and is fenced. A taken claim
// of the other member ends a release. A fenced node stays fenced.
func (s State) Take(self netip.Addr, c *Claim) State {
	if c.Holder != self && s.Role(self) == RoleHolder {
		s.Fenced = true
	}
	if c.Holder != self {
		s.Released = false
	}
	s.Held = c
	if s.Pair == nil {
		s.Pair = c.Pair
	}
	return s
}

// Claimed returns the state after self's own claim c was written (to the KV
// or, without it, taken by a majority of peers): c is held and lease (0
// without a KV) is the lease its holder key hangs on.
func (s State) Claimed(c *Claim, lease LeaseID) State {
	s.Held, s.Fenced, s.Released, s.Unchecked, s.Lease = c, false, false, false, lease
	if s.Pair == nil {
		s.Pair = c.Pair
	}
	return s
}

// Fence returns the state after the node dropped the VIP because its
// renewal aged past the release time or its lease was found gone. The lease
// its holder key hangs on is abandoned: the node stops renewing it and
// revokes it when it can, so the other member can fail over instead of
// waiting behind a holder key a fenced node keeps alive.
func (s State) Fence() State {
	s.Fenced = true
	if s.Lease != 0 {
		s.Abandoned, s.Lease = s.Lease, 0
	}
	return s
}

// Release returns the state after the holder released the VIP on request:
// the address was dropped and the lease (if any) revoked.
func (s State) Release() State {
	s.Released = true
	s.ReleasedLease, s.Lease = s.Lease, 0
	return s
}

// LeaseGone returns the state after lease id was found gone (or revoked).
// A node that released is no longer fenced once the lease it released is
// gone (a renewal that failed after the release may have fenced it); the
// released lease is forgotten even if the node has since taken the other
// member's claim, which ends the release.
func (s State) LeaseGone(id LeaseID) State {
	if id == 0 {
		return s
	}
	if id == s.ReleasedLease {
		if s.Released {
			s.Fenced = false
		}
		s.ReleasedLease = 0
	}
	if id == s.Lease {
		s.Lease = 0
	}
	if id == s.Abandoned {
		s.Abandoned = 0
	}
	return s
}

// HeldCheck returns the state after an unchecked node learnt whether it
// held the VIP before (heldBefore): with a KV, whether its held key
// exists; without one, whether the other member's newest claim is its
// own. A node that held it is fenced, since its lost state may have been
// fenced and only a promote may clear that; a node that never held it (a
// legitimate newcomer) is an ordinary replica. A checked state is
// returned unchanged.
func (s State) HeldCheck(heldBefore bool) State {
	if !s.Unchecked {
		return s
	}
	s.Unchecked = false
	if heldBefore {
		s.Fenced = true
	}
	return s
}

// Promote returns the state after an operator's promote on this node: the
// only way to clear a fence.
func (s State) Promote() State {
	s.Fenced = false
	return s
}

// MayFailover reports whether self's controller may claim on its own: the
// holder's lease has expired (holderAlive is false), self has taken the
// counter's claim, that claim is the other member's, and self is neither
// fenced, released nor unchecked.
func (s State) MayFailover(self netip.Addr, counter *Claim, holderAlive bool) bool {
	return !holderAlive && counter != nil && !s.Fenced && !s.Released && !s.Unchecked &&
		s.Held.Equal(counter) && counter.Holder != self
}

// StateStore keeps a node's State across restarts. Implementations are safe
// for concurrent use. The Controller calls Save with its lock held (a state
// is durable before any peer hears of it), so Save must not call the
// Controller.
type StateStore interface {
	// Load returns the stored state; a store never written returns the zero
	// State. A state that cannot be decoded is ErrCorruptState.
	Load() (State, error)
	// Save replaces the stored state atomically.
	Save(State) error
}

type stateJSON struct {
	Version       int    `json:"version"`
	Held          string `json:"held,omitempty"`
	Pair          string `json:"pair,omitempty"`
	Fenced        bool   `json:"fenced"`
	Released      bool   `json:"released"`
	Lease         int64  `json:"lease,omitempty"`
	ReleasedLease int64  `json:"released_lease,omitempty"`
	Abandoned     int64  `json:"abandoned_lease,omitempty"`
	Unchecked     bool   `json:"unchecked,omitempty"`
}

// MarshalState encodes s as the state file's JSON.
func MarshalState(s State) ([]byte, error) {
	j := stateJSON{Version: 1, Fenced: s.Fenced, Released: s.Released, Lease: int64(s.Lease), ReleasedLease: int64(s.ReleasedLease), Abandoned: int64(s.Abandoned), Unchecked: s.Unchecked}
	if s.Held != nil {
		j.Held = base64.StdEncoding.EncodeToString(s.Held.Encode())
	}
	if s.Pair != nil {
		b, err := s.Pair.Encode()
		if err != nil {
			return nil, err
		}
		j.Pair = base64.StdEncoding.EncodeToString(b)
	}
	return json.MarshalIndent(j, "", "  ")
}

// UnmarshalState decodes a state file. Every claim and record in it is
// parsed and its signatures checked; any failure is ErrCorruptState.
func UnmarshalState(b []byte) (State, error) {
	var j stateJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return State{}, fmt.Errorf("%w: %v", ErrCorruptState, err)
	}
	if j.Version != 1 {
		return State{}, fmt.Errorf("%w: version %d", ErrCorruptState, j.Version)
	}
	s := State{Fenced: j.Fenced, Released: j.Released, Lease: LeaseID(j.Lease), ReleasedLease: LeaseID(j.ReleasedLease), Abandoned: LeaseID(j.Abandoned), Unchecked: j.Unchecked}
	if j.Held != "" {
		raw, err := base64.StdEncoding.DecodeString(j.Held)
		if err != nil {
			return State{}, fmt.Errorf("%w: held: %v", ErrCorruptState, err)
		}
		if s.Held, err = ParseClaim(raw); err == nil {
			err = s.Held.Pair.verifySigs()
		}
		if err != nil {
			return State{}, fmt.Errorf("%w: held: %w", ErrCorruptState, err)
		}
	}
	if j.Pair != "" {
		raw, err := base64.StdEncoding.DecodeString(j.Pair)
		if err != nil {
			return State{}, fmt.Errorf("%w: pair: %v", ErrCorruptState, err)
		}
		if s.Pair, err = ParsePairRecord(raw); err != nil {
			return State{}, fmt.Errorf("%w: pair: %w", ErrCorruptState, err)
		}
	}
	return s, nil
}

// FileStore is a StateStore in one JSON file, written atomically: a
// temporary file in the same directory, fsynced, renamed over the old one,
// and the directory fsynced. A crash leaves the old or the new state, never
// a mix. A corrupt file is reported and never overwritten by Load.
type FileStore struct {
	Path string // +checklocksignore: set before use, read-only after
	// mu serializes Load and Save, so that one never reads a half-done other.
	mu syncx.Mutex
}

var _ StateStore = (*FileStore)(nil)

// Load implements StateStore.
func (f *FileStore) Load() (State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("claim: state file: %w", err)
	}
	return UnmarshalState(b)
}

// Save implements StateStore.
func (f *FileStore) Save(s State) error {
	b, err := MarshalState(s)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := filepath.Dir(f.Path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return fmt.Errorf("claim: state file: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("claim: state file: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("claim: state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("claim: state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("claim: state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("claim: state file: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("claim: state file: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("claim: state file: %w", err)
	}
	return nil
}

// MemStore is a StateStore in memory, for tests and simulations: it
// survives a controller's "crash" the way a disk does. The zero value is an
// empty store.
type MemStore struct {
	// mu guards s and saves.
	mu syncx.Mutex
	// +checklocks:mu
	s State
	// +checklocks:mu
	saves int
}

// Load implements StateStore.
func (m *MemStore) Load() (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s, nil
}

// Save implements StateStore.
func (m *MemStore) Save(s State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.s = s
	m.saves++
	return nil
}
