package claimtest

import (
	"net/netip"
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/syncx"
)

// Member is one member of a test's Members: its fixture node, its fakes
// and the configuration its controller starts from.
type Member struct {
	Name    string
	Node    Node
	KV      *CountingKV // nil for a member without a KV
	Carrier *FakeCarrier
	Store   *claim.MemStore
	Cfg     claim.Config

	ms *Members
}

// Ctl returns the member's running controller, nil while it is stopped.
func (m *Member) Ctl() *claim.Controller {
	m.ms.mu.Lock()
	defer m.ms.mu.Unlock()
	return m.ms.ctls[m]
}

// Members runs the controllers of a test's members by name: Start starts
// (or restarts) a member's controller from its Cfg and Store, Stop closes
// it, and Running hands the running controller to an in-process channel
// (DirectChannel's Target). Every controller still running is closed when
// the test ends. Safe for concurrent use.
type Members struct {
	t testing.TB

	mu syncx.Mutex
	// +checklocks:mu
	byAddr map[netip.Addr]*Member
	// +checklocks:mu
	order []*Member
	// +checklocks:mu
	ctls map[*Member]*claim.Controller // the running ones
}

// NewMembers returns an empty set of members for the test t.
func NewMembers(t testing.TB) *Members {
	ms := &Members{t: t, byAddr: map[netip.Addr]*Member{}, ctls: map[*Member]*claim.Controller{}}
	t.Cleanup(func() {
		ms.mu.Lock()
		var ctls []*claim.Controller
		for _, m := range ms.order {
			if c := ms.ctls[m]; c != nil {
				ctls = append(ctls, c)
			}
		}
		clear(ms.ctls)
		ms.mu.Unlock()
		for _, c := range ctls {
			c.Close()
		}
	})
	return ms
}

// Add adds m (by m.Node.Addr) and returns it.
func (ms *Members) Add(m *Member) *Member {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m.ms = ms
	ms.byAddr[m.Node.Addr] = m
	ms.order = append(ms.order, m)
	return m
}

// M returns the member called name; the test fails when there is none.
func (ms *Members) M(name string) *Member {
	ms.mu.Lock()
	for _, m := range ms.order {
		if m.Name == name {
			ms.mu.Unlock()
			return m
		}
	}
	ms.mu.Unlock()
	ms.t.Fatalf("claimtest: no member %s", name)
	return nil
}

// All returns every member, in the order they were added.
func (ms *Members) All() []*Member {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return append([]*Member(nil), ms.order...)
}

// Start closes the member's running controller, if any, then starts a new
// one from its Cfg (and so from what its Store holds); the test fails on
// an error.
func (ms *Members) Start(name string) *claim.Controller {
	ms.t.Helper()
	m := ms.M(name)
	ms.Stop(name)
	ctl, err := claim.NewController(m.Cfg)
	if err != nil {
		ms.t.Fatalf("claimtest: start %s: %v", name, err)
	}
	ms.Put(name, ctl)
	if err := ctl.Start(); err != nil {
		ms.t.Fatalf("claimtest: start %s: %v", name, err)
	}
	return ctl
}

// Put makes ctl, a controller the test made itself, the member's running
// one (closed with the others when the test ends).
func (ms *Members) Put(name string, ctl *claim.Controller) {
	m := ms.M(name)
	ms.mu.Lock()
	ms.ctls[m] = ctl
	ms.mu.Unlock()
}

// Stop closes the member's running controller, if any.
func (ms *Members) Stop(name string) {
	m := ms.M(name)
	ms.mu.Lock()
	ctl := ms.ctls[m]
	delete(ms.ctls, m)
	ms.mu.Unlock()
	if ctl != nil {
		ctl.Close()
	}
}

// Running returns the running controller of the member at addr, or nil
// when there is no such member or it is stopped.
func (ms *Members) Running(addr netip.Addr) *claim.Controller {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.ctls[ms.byAddr[addr]]
}
