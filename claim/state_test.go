package claim_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/claimtest"
)

func TestStateMachine(t *testing.T) {
	f := claimtest.NewFixture()
	a, b := f.A.Addr, f.B.Addr
	var s claim.State
	if s.Role(a) != claim.RoleReplica {
		t.Fatal("empty state is not a replica")
	}
	s = s.Claimed(f.Claim(f.A, 1), 11)
	if s.Role(a) != claim.RoleHolder || s.Role(b) != claim.RoleReplica || s.Lease != 11 || s.Pair == nil {
		t.Fatalf("after own claim: %+v", s)
	}
	// The holder fences: role replica, lease abandoned.
	f1 := s.Fence()
	if f1.Role(a) != claim.RoleReplica || !f1.Fenced || f1.Lease != 0 || f1.Abandoned != 11 {
		t.Fatalf("fenced: %+v", f1)
	}
	// A fenced node that takes a newer claim stays fenced; it may not fail over.
	f2 := f1.Take(a, f.Claim(f.B, 2))
	if !f2.Fenced || f2.MayFailover(a, f.Claim(f.B, 2), false) {
		t.Fatalf("fenced after take: %+v", f2)
	}
	// Only a promote clears the fence.
	if f3 := f2.Promote(); f3.Fenced || !f3.MayFailover(a, f3.Held, false) {
		t.Fatalf("promoted: %+v", f3)
	}
	// A holder that takes another's newer claim without releasing is fenced.
	if t2 := s.Take(a, f.Claim(f.B, 2)); !t2.Fenced {
		t.Fatal("holder superseded without release not fenced")
	}
	// Release: not fenced by a take; LeaseGone of the released lease clears a fence.
	r := s.Release()
	if !r.Released || r.Role(a) != claim.RoleReplica || r.ReleasedLease != 11 || r.Lease != 0 {
		t.Fatalf("released: %+v", r)
	}
	if r.MayFailover(a, r.Held, false) {
		t.Fatal("a released node fails over to its own released claim")
	}
	rf := r.Fence() // a renewal failed after the revoke
	rg := rf.LeaseGone(11)
	if rg.Fenced || rg.ReleasedLease != 0 {
		t.Fatalf("released node still fenced after its revoked lease is gone: %+v", rg)
	}
	if rt := r.Take(a, f.Claim(f.B, 2)); rt.Fenced || rt.Released {
		t.Fatalf("released node taking the successor: %+v", rt)
	}
	// Replica b: may fail over only with the counter's claim taken, the
	// holder gone, not its own claim.
	var sb claim.State
	sb = sb.Take(b, f.Claim(f.A, 1))
	if !sb.MayFailover(b, f.Claim(f.A, 1), false) {
		t.Fatal("replica with the counter's claim may not fail over")
	}
	if sb.MayFailover(b, f.Claim(f.A, 1), true) {
		t.Fatal("replica fails over a live holder")
	}
	if sb.MayFailover(b, f.Claim(f.A, 2), false) {
		t.Fatal("replica fails over without having taken the counter's claim")
	}
}

func TestFileStore(t *testing.T) {
	f := claimtest.NewFixture()
	dir := t.TempDir()
	fs := &claim.FileStore{Path: filepath.Join(dir, "vip.json")}
	if s, err := fs.Load(); err != nil || s.Held != nil {
		t.Fatalf("missing file: %+v %v", s, err)
	}
	want := claim.State{Held: f.Claim(f.B, 4), Pair: f.Pair, Fenced: true, Lease: 9, Abandoned: 3}
	if err := fs.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err := fs.Load()
	if err != nil || !got.Held.Equal(want.Held) || !got.Fenced || got.Lease != 9 || got.Abandoned != 3 || !got.Pair.SameMembers(f.Pair) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	st, _ := os.Stat(fs.Path)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v", st.Mode())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("temporary files left: %d entries", len(ents))
	}
	// Corrupt: refused, and left as it is.
	raw, _ := os.ReadFile(fs.Path)
	bad := append([]byte(nil), raw...)
	bad[len(bad)/2] ^= 0x20
	os.WriteFile(fs.Path, bad, 0o600)
	if _, err := fs.Load(); !errors.Is(err, claim.ErrCorruptState) {
		// A flip inside base64 may still decode to a bad claim: any
		// failure must be ErrCorruptState.
		t.Fatalf("corrupt state: %v", err)
	}
	after, _ := os.ReadFile(fs.Path)
	if string(after) != string(bad) {
		t.Fatal("Load changed a corrupt file")
	}
	// A controller refuses to start on it.
	e := newEnv(t, true)
	m := e.m("a")
	m.Cfg.Store = fs
	if _, err := claim.NewController(m.Cfg); !errors.Is(err, claim.ErrCorruptState) {
		t.Fatalf("controller on a corrupt state file: %v", err)
	}
}

// An unchecked state neither holds nor fails over; HeldCheck ends it,
// fencing a node that held the VIP before and leaving a newcomer a
// replica; a claim of its own ends it too; the flag survives the file.
func TestStateUnchecked(t *testing.T) {
	f := claimtest.NewFixture()
	a := f.A.Addr
	u := claim.State{Unchecked: true}.Take(a, f.Claim(f.B, 2))
	if !u.Unchecked || u.MayFailover(a, u.Held, false) {
		t.Fatalf("unchecked replica may fail over: %+v", u)
	}
	if own := (claim.State{Unchecked: true}).Take(a, f.Claim(f.A, 2)); own.Role(a) != claim.RoleReplica {
		t.Fatalf("unchecked node holds its own claim: %+v", own)
	}
	if n := u.HeldCheck(false); n.Unchecked || n.Fenced || !n.MayFailover(a, n.Held, false) {
		t.Fatalf("newcomer after the check: %+v", n)
	}
	h := u.HeldCheck(true)
	if h.Unchecked || !h.Fenced || h.MayFailover(a, h.Held, false) {
		t.Fatalf("node that held before, after the check: %+v", h)
	}
	if again := h.Promote().HeldCheck(true); again.Fenced {
		t.Fatalf("a checked state was checked again: %+v", again)
	}
	if c := u.Claimed(f.Claim(f.A, 3), 7); c.Unchecked || c.Role(a) != claim.RoleHolder {
		t.Fatalf("own claim does not end the check: %+v", c)
	}
	b, err := claim.MarshalState(u)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := claim.UnmarshalState(b); err != nil || !back.Unchecked {
		t.Fatalf("unchecked lost in the file: %+v %v", back, err)
	}
}

func TestHeldValue(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"1", 1, true},
		{"18446744073709551614", 1<<64 - 2, true},
		{"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 0, false},
		{"0", 0, false}, {"", 0, false}, {"-1", 0, false}, {"+1", 0, false},
		{" 1", 0, false}, {"1e3", 0, false}, {"000000000000000000001", 0, false},
	} {
		got, err := claim.ParseHeldValue([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want || err != nil && !errors.Is(err, claim.ErrMalformed) {
			t.Errorf("ParseHeldValue(%q) = %d, %v", tc.in, got, err)
		}
		if tc.ok && string(claim.HeldValue(got)) != tc.in {
			t.Errorf("HeldValue(%d) = %q", got, claim.HeldValue(got))
		}
	}
}
