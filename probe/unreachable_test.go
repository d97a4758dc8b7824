package probe

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipkit/vipkit/internal/testenv"
)

func udpKey(port uint16) UnreachableKey {
	return UnreachableKey{Node: nodeID(2), Proto: ProtoUDP, Addr: netip.AddrPortFrom(addrB, port)}
}

func TestUnreachableHold(t *testing.T) {
	u, err := NewUnreachable(UnreachableConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k := udpKey(53)
	until, err := u.Report(k, at(time.Second))
	if err != nil || !until.Equal(at(11*time.Second)) {
		t.Fatalf("report: %v %v", until.Sub(t0), err)
	}
	if got, ok := u.Until(k, at(11*time.Second-1)); !ok || !got.Equal(until) {
		t.Fatalf("1 ns before 10 s: %v %v", got, ok)
	}
	if _, ok := u.Until(UnreachableKey{Node: k.Node, Proto: ProtoTCP, Addr: k.Addr}, at(2*time.Second)); ok {
		t.Fatal("the same port over TCP is not excluded by a UDP report")
	}
	if _, ok := u.Until(k, at(11*time.Second)); ok {
		t.Fatal("still excluded at 10 s: eligible to retry")
	}
	// A new report extends; an older one never shortens.
	u.Report(k, at(20*time.Second))
	u.Report(k, at(15*time.Second))
	if got, _ := u.Until(k, at(21*time.Second)); !got.Equal(at(30 * time.Second)) {
		t.Fatalf("extended until %v", got.Sub(t0))
	}
	u.Clear(k)
	if _, ok := u.Until(k, at(21*time.Second)); ok {
		t.Fatal("cleared")
	}
	if _, err := u.Report(UnreachableKey{}, t0); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no address: %v", err)
	}
	if _, err := NewUnreachable(UnreachableConfig{Hold: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative hold: %v", err)
	}
}

func TestUnreachableLimit(t *testing.T) {
	u, _ := NewUnreachable(UnreachableConfig{Hold: 10 * time.Second, MaxEntries: 2})
	u.Report(udpKey(1), at(0))
	u.Report(udpKey(2), at(time.Second))
	_, err := u.Report(udpKey(3), at(5*time.Second))
	if !errors.Is(err, ErrUnreachableFull) || !strings.Contains(err.Error(), "2 unexpired") {
		t.Fatalf("third entry: %v", err)
	}
	// Refreshing a held entry is never refused.
	if _, err := u.Report(udpKey(1), at(6*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Once an entry expired, its room is reused.
	if _, err := u.Report(udpKey(3), at(11*time.Second)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if st := u.Stats(); st.Dropped != 1 || st.Reports != 4 || st.Entries != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestUnreachableZeroAlloc(t *testing.T) {
	testenv.SkipIfLockOrder(t)
	u, _ := NewUnreachable(UnreachableConfig{})
	k := udpKey(53)
	now := t0
	u.Report(k, now)
	if n := testing.AllocsPerRun(100, func() {
		u.Report(k, now)
		u.Until(k, now)
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
