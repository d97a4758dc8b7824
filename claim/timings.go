package claim

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The margins the controller's timings should keep (docs/defaults.md gives
// the reasons). NewController enforces only 0 < renew < drop < TTL, which
// keeps one holder at a time on paper; CheckTimings checks the margins that
// keep it so when a renewal is slow, lost, or answered by a cut-off etcd
// leader.
const (
	// MinRenewalsPerDrop is the least number of renewals that fit in the
	// drop deadline: DropAfter ≥ MinRenewalsPerDrop × RenewInterval. Two
	// renewals in a row may fail or time out (each call is bounded by one
	// interval), and the third still moves the deadline before it passes.
	MinRenewalsPerDrop = 3
	// TimingSlack is the margin kept beyond the etcd election timeout:
	// DropAfter + ElectionTimeout + TimingSlack ≤ LeaseTTL. It covers
	// etcd keeping TTLs in whole seconds, the step and the drop timer
	// running late on a loaded machine, and the kernel's address lifetime
	// in whole seconds.
	TimingSlack = time.Second
)

// ErrTimingMargin is returned by CheckTimings for timings that keep 0 <
// renew < drop < TTL but not the margins: a slow renewal or a cut-off etcd
// leader could then move the VIP, or let its lease expire while the
// holder still carries it.
var ErrTimingMargin = errors.New("claim: timings leave no margin")

// CheckTimings checks renew, ttl, drop and election (zero: the Default*
// constant, as in Config) against the margin rules:
//
//	drop ≥ MinRenewalsPerDrop × renew
//	drop + election + TimingSlack ≤ ttl
//
// It returns nil when both hold, and otherwise one ErrTimingMargin that
// names each rule broken with its figures. It also reports (as
// ErrInvalidOptions) timings that NewController refuses.
func CheckTimings(renew, ttl, drop, election time.Duration) error {
	if renew == 0 {
		renew = DefaultRenewInterval
	}
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if drop == 0 {
		drop = DefaultDropAfter
	}
	if election == 0 {
		election = DefaultElectionTimeout
	}
	if !(0 < renew && renew < drop && drop < ttl) || election < 0 {
		return fmt.Errorf("%w: need 0 < renew %v < drop %v < ttl %v", ErrInvalidOptions, renew, drop, ttl)
	}
	var bad []string
	// drop / renew ≥ k, without the overflow of k × renew.
	if drop/renew < MinRenewalsPerDrop {
		bad = append(bad, fmt.Sprintf("drop %v holds %d renewals of %v, want at least %d (drop ≥ %d × renew)",
			drop, drop/renew, renew, MinRenewalsPerDrop, MinRenewalsPerDrop))
	}
	// drop + election + slack ≤ ttl, as ttl - drop ≥ election + slack
	// (ttl > drop, so no term overflows).
	if ttl-drop < election || ttl-drop-election < TimingSlack {
		bad = append(bad, fmt.Sprintf("ttl %v leaves %v after the drop at %v, want at least the election timeout %v + %v (drop + election + %v ≤ ttl)",
			ttl, ttl-drop, drop, election, TimingSlack, TimingSlack))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrTimingMargin, strings.Join(bad, "; "))
}
