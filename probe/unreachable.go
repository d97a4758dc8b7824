package probe

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
)

// Defaults of UnreachableConfig.
const (
	DefaultUnreachableHold = 10 * time.Second // an unreachable port is excluded this long
	DefaultUnreachableMax  = 4096             // entries; the flow table's default capacity
)

// UnreachableKey names a backend port reported unreachable: the node, the
// IP protocol (17 for UDP, 6 for TCP) and the application's address and
// port.
type UnreachableKey struct {
	Node  NodeID
	Proto uint8
	Addr  netip.AddrPort
}

// UnreachableConfig tunes an Unreachable table. Zero fields take the
// defaults; negative values are invalid.
type UnreachableConfig struct {
	Hold       time.Duration // exclusion after a report; default 10 s
	MaxEntries int           // unexpired entries kept; default 4096
}

// UnreachableStats are the table's counters.
type UnreachableStats struct {
	Entries  int    // entries held (some may have expired and await reuse)
	Reports  uint64 // reports accepted
	Dropped  uint64 // reports refused with ErrUnreachableFull
	Rejected uint64 // reports with an invalid key
}

// Unreachable tracks backend ports that an explicit ICMP port-unreachable
// error (reported by the flow path) showed to be closed. For UDP this,
// together with the encrypted path probe, is the only health signal: no
// probe datagram is ever sent to an unknown UDP application, and silence
// proves nothing. A reported port is excluded for Hold and then eligible to
// be tried again; a new report extends the exclusion.
//
// Unreachable is safe for concurrent use. Report and Until do not allocate
// once the table has grown to its working size.
type Unreachable struct {
	hold time.Duration
	max  int // +checklocksignore: set by NewUnreachable, read-only after

	// mu guards until and stats.
	mu syncx.Mutex
	// until holds when each reported port's exclusion ends.
	// +checklocks:mu
	until map[UnreachableKey]time.Time
	// +checklocks:mu
	stats UnreachableStats
}

// NewUnreachable returns an empty table.
func NewUnreachable(cfg UnreachableConfig) (*Unreachable, error) {
	if cfg.Hold < 0 || cfg.MaxEntries < 0 {
		return nil, invalid("unreachable hold %v / max entries %d is negative", cfg.Hold, cfg.MaxEntries)
	}
	if cfg.Hold == 0 {
		cfg.Hold = DefaultUnreachableHold
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultUnreachableMax
	}
	return &Unreachable{hold: cfg.Hold, max: cfg.MaxEntries, until: make(map[UnreachableKey]time.Time)}, nil
}

// Report records at now an ICMP port-unreachable error for key: the port is
// excluded until now+Hold, which Report returns. When MaxEntries unexpired
// entries are held, expired ones are purged first; if none has expired the
// report is dropped, counted, and refused with ErrUnreachableFull (the flow
// path then keeps replacing the backend per datagram, as without a report).
func (u *Unreachable) Report(key UnreachableKey, now time.Time) (time.Time, error) {
	if !key.Addr.IsValid() {
		u.mu.Lock()
		u.stats.Rejected++
		u.mu.Unlock()
		return time.Time{}, invalid("unreachable report without an address")
	}
	until := now.Add(u.hold)
	u.mu.Lock()
	defer u.mu.Unlock()
	if old, ok := u.until[key]; ok {
		if until.After(old) {
			u.until[key] = until
		}
		u.stats.Reports++
		return u.until[key], nil
	}
	if len(u.until) >= u.max {
		for k, t := range u.until {
			if !now.Before(t) {
				delete(u.until, k)
			}
		}
		if len(u.until) >= u.max {
			u.stats.Dropped++
			return time.Time{}, fmt.Errorf("%w: %d unexpired entries, %v not recorded", ErrUnreachableFull, u.max, key.Addr)
		}
	}
	u.until[key] = until
	u.stats.Reports++
	u.stats.Entries = len(u.until)
	return until, nil
}

// Until reports whether key is excluded at now, and until when.
func (u *Unreachable) Until(key UnreachableKey, now time.Time) (time.Time, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.until[key]
	if !ok {
		return time.Time{}, false
	}
	if !now.Before(t) {
		delete(u.until, key)
		u.stats.Entries = len(u.until)
		return time.Time{}, false
	}
	return t, true
}

// Clear forgets key, for example when a backend is removed.
func (u *Unreachable) Clear(key UnreachableKey) {
	u.mu.Lock()
	delete(u.until, key)
	u.stats.Entries = len(u.until)
	u.mu.Unlock()
}

// Stats returns the table's counters.
func (u *Unreachable) Stats() UnreachableStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.stats
}
