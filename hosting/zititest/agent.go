package zititest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/hosting/ziti"
	"github.com/vipkit/vipkit/transport"
)

// ErrNoTerminator means a dial found no terminator for the service.
var ErrNoTerminator = errors.New("zititest: service has no terminator")

// AgentOptions configure a simulated hosting agent (a tunneler in
// host-only mode).
type AgentOptions struct {
	// Identity is the Ziti identity the agent runs as (required).
	Identity string
	// Clock schedules the port checks; nil means the real clock.
	Clock transport.Clock
	// Resolve maps a host.v1 target ("address:port", an IPv6 literal in
	// brackets) to the address the agent dials on its own host, as each
	// host resolves the share's target itself; nil dials it as it is.
	Resolve func(hostport string) string
}

// HostAgent is a simulated hosting agent. It binds every service its
// identity may bind (a Bind policy names it) that it sees a host.v1 for:
// the override of its identity when there is one, else the service's own.
// It holds one terminator per bound service, at the config's
// listenOptions precedence and cost. When the config it sees changes (the
// SDK's ServiceChanged) it closes the terminator and binds a new one. It
// runs the config's portChecks as real TCP connects to the resolved
// target: after the fail action's consecutiveEvents failures in a row
// "mark unhealthy" drops the terminator to failed, and the first passing
// check ("mark healthy") returns it to the config's precedence.
type HostAgent struct {
	f   *Fake
	o   AgentOptions
	clk transport.Clock

	checks  atomic.Uint64
	stop    chan struct{}
	done    chan struct{}
	checkCh chan checkReq
	once    sync.Once

	// owned by the run goroutine
	bound map[string]*binding // service id → binding
}

type binding struct {
	key      string // config id + data: what the agent saw
	term     string
	baseline string
	checks   []*portCheck
}

type portCheck struct {
	address   string
	interval  time.Duration
	timeout   time.Duration
	failAfter int    // consecutive failures that mark unhealthy; 0: never
	onFail    string // action
	onPass    string
	fails     int
	timer     transport.Timer
}

type checkReq struct {
	service string
	pc      *portCheck
}

// StartAgent starts a simulated agent for an identity. Stop it with Stop
// (the fake's Close stops every agent too).
func (f *Fake) StartAgent(o AgentOptions) (*HostAgent, error) {
	if o.Identity == "" {
		return nil, fmt.Errorf("zititest: an agent needs an identity")
	}
	a := &HostAgent{f: f, o: o, clk: transport.Or(o.Clock), stop: make(chan struct{}), done: make(chan struct{}),
		checkCh: make(chan checkReq, 64), bound: map[string]*binding{}}
	f.mu.Lock()
	f.agents[a] = true
	f.mu.Unlock()
	ch := f.changes() // before the read, so that no change is missed
	a.sync()
	go a.run(ch)
	return a, nil
}

// Identity is the agent's identity id.
func (a *HostAgent) Identity() string { return a.o.Identity }

// Checks is the number of port checks the agent has completed.
func (a *HostAgent) Checks() uint64 { return a.checks.Load() }

// Stop takes the agent offline: its terminators go, as when the edge
// router loses the agent's connection. It waits for the agent to stop.
func (a *HostAgent) Stop() {
	a.once.Do(func() { close(a.stop) })
	<-a.done
}

func (a *HostAgent) run(ch <-chan struct{}) {
	defer close(a.done)
	defer a.unbindAll()
	for {
		select {
		case <-a.stop:
			return
		case <-ch:
			ch = a.f.changes()
			a.sync()
		case r := <-a.checkCh:
			a.runCheck(r)
		}
	}
}

func (a *HostAgent) unbindAll() {
	for svc, b := range a.bound {
		a.unbind(svc, b)
	}
	a.f.mu.Lock()
	delete(a.f.agents, a)
	a.f.mu.Unlock()
}

func (a *HostAgent) unbind(svc string, b *binding) {
	for _, pc := range b.checks {
		if pc.timer != nil {
			pc.timer.Stop()
		}
	}
	a.f.mu.Lock()
	delete(a.f.terms, b.term)
	delete(a.f.termAgent, b.term)
	a.f.mu.Unlock()
	delete(a.bound, svc)
	a.f.bump()
}

// view is what the agent's service detail shows for one service.
type view struct {
	configID string
	data     map[string]any
}

// sync reads the agent's service detail and binds, rebinds or unbinds.
func (a *HostAgent) sync() {
	want := map[string]view{}
	a.f.mu.Lock()
	ident, ok := a.f.idents[a.o.Identity]
	if ok {
		for sid, s := range a.f.services {
			if !a.f.allowed(ident, sid, ziti.PolicyBind) {
				continue
			}
			if v, ok := a.f.hostConfigOf(a.o.Identity, s); ok {
				want[sid] = v
			}
		}
	}
	a.f.mu.Unlock()
	for sid, b := range a.bound {
		if v, ok := want[sid]; !ok || keyOf(v) != b.key {
			a.unbind(sid, b)
		}
	}
	for _, sid := range slices.Sorted(mapKeys(want)) {
		if _, ok := a.bound[sid]; !ok {
			a.bind(sid, want[sid])
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func keyOf(v view) string {
	b, _ := json.Marshal(v.data)
	return v.configID + "\x00" + string(b)
}

// hostConfigOf returns the host.v1 an identity sees for a service: its
// override, else the service's own. f.mu is held.
func (f *Fake) hostConfigOf(ident string, s ziti.Service) (view, bool) {
	var ht string
	for id, ct := range f.ctypes {
		if ct.Name == "host.v1" {
			ht = id
		}
	}
	if cid, ok := f.overrides[ident][[2]string{s.ID, ht}]; ok {
		if c, ok := f.configs[cid]; ok {
			return view{cid, c.Data}, true
		}
	}
	for _, cid := range s.Configs {
		if c, ok := f.configs[cid]; ok && c.ConfigTypeID == ht {
			return view{cid, c.Data}, true
		}
	}
	return view{}, false
}

var (
	costUp   = regexp.MustCompile(`^increase cost ([0-9]+)$`) // +checklocksignore: read-only
	costDown = regexp.MustCompile(`^decrease cost ([0-9]+)$`) // +checklocksignore: read-only
)

func (a *HostAgent) bind(sid string, v view) {
	lo, _ := v.data["listenOptions"].(map[string]any)
	prec, _ := lo["precedence"].(string)
	if prec == "" {
		prec = ziti.PrecedenceDefault
	}
	cost := 0
	if c, ok := lo["cost"].(float64); ok {
		cost = int(c)
	}
	b := &binding{key: keyOf(v), baseline: prec}
	pcs, _ := v.data["portChecks"].([]any)
	for _, x := range pcs {
		m, _ := x.(map[string]any)
		pc := &portCheck{}
		pc.address, _ = m["address"].(string)
		pc.interval = duration(m["interval"])
		pc.timeout = duration(m["timeout"])
		acts, _ := m["actions"].([]any)
		for _, y := range acts {
			am, _ := y.(map[string]any)
			trig, _ := am["trigger"].(string)
			act, _ := am["action"].(string)
			n, _ := am["consecutiveEvents"].(float64)
			switch trig {
			case "fail":
				pc.onFail, pc.failAfter = act, max(1, int(n))
			case "pass":
				pc.onPass = act
			}
		}
		if pc.interval > 0 {
			b.checks = append(b.checks, pc)
		}
	}
	a.f.mu.Lock()
	b.term = a.f.newID("term")
	a.f.terms[b.term] = ziti.Terminator{ID: b.term, ServiceID: sid, HostID: a.o.Identity, Identity: a.o.Identity,
		Precedence: prec, Cost: cost, RouterID: "router-1", Binding: "edge", Address: "hosted:" + b.term}
	a.f.termAgent[b.term] = a
	a.f.mu.Unlock()
	a.bound[sid] = b
	for _, pc := range b.checks {
		a.schedule(sid, pc)
	}
	a.f.bump()
}

func duration(v any) time.Duration {
	s, _ := v.(string)
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0
	}
	return d
}

func (a *HostAgent) schedule(sid string, pc *portCheck) {
	pc.timer = a.clk.AfterFunc(pc.interval, func() {
		select {
		case a.checkCh <- checkReq{sid, pc}:
		case <-a.stop:
		}
	})
}

func (a *HostAgent) resolve(hostport string) string {
	if a.o.Resolve != nil {
		return a.o.Resolve(hostport)
	}
	return hostport
}

// runCheck runs one port check: a TCP connect, closed at once.
func (a *HostAgent) runCheck(r checkReq) {
	b, ok := a.bound[r.service]
	if !ok || !slices.Contains(b.checks, r.pc) {
		return // rebound or unbound since
	}
	pc := r.pc
	ctx, cancel := context.WithTimeout(context.Background(), pc.timeout)
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a.resolve(pc.address))
	cancel()
	if err == nil {
		c.Close()
		pc.fails = 0
		a.apply(b, pc.onPass)
	} else {
		pc.fails++
		if pc.failAfter > 0 && pc.fails >= pc.failAfter {
			a.apply(b, pc.onFail)
		}
	}
	a.checks.Add(1)
	a.schedule(r.service, pc)
}

func (a *HostAgent) apply(b *binding, action string) {
	a.f.mu.Lock()
	t, ok := a.f.terms[b.term]
	if !ok {
		a.f.mu.Unlock()
		return
	}
	switch {
	case action == "mark unhealthy":
		t.Precedence = ziti.PrecedenceFailed
	case action == "mark healthy":
		t.Precedence = b.baseline
	case costUp.MatchString(action):
		n, _ := strconv.Atoi(costUp.FindStringSubmatch(action)[1])
		t.Cost = min(65535, t.Cost+n)
	case costDown.MatchString(action):
		n, _ := strconv.Atoi(costDown.FindStringSubmatch(action)[1])
		t.Cost = max(0, t.Cost-n)
	}
	a.f.terms[b.term] = t
	a.f.mu.Unlock()
}

// dial opens a connection to the target of a bound service, as the
// tunneler does when a circuit arrives.
func (a *HostAgent) dial(ctx context.Context, data map[string]any) (net.Conn, error) {
	addr, _ := data["address"].(string)
	port, _ := data["port"].(float64)
	return (&net.Dialer{}).DialContext(ctx, "tcp", a.resolve(net.JoinHostPort(addr, strconv.Itoa(int(port)))))
}

// bands orders precedences: a circuit goes to the highest band that holds
// a terminator.
var bands = map[string]int{ziti.PrecedenceRequired: 2, ziti.PrecedenceDefault: 1, ziti.PrecedenceFailed: 0}

// Route picks the terminator of a new circuit to a service, as smart
// routing does: the highest band that holds one (required > default >
// failed), then the lowest cost, then round robin among equals, so that
// each new circuit can land on any of them.
func (f *Fake) Route(serviceID string) (ziti.Terminator, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.routeLocked(serviceID)
}

func (f *Fake) routeLocked(serviceID string) (ziti.Terminator, error) {
	var best []ziti.Terminator
	for _, t := range f.terms {
		if t.ServiceID != serviceID {
			continue
		}
		if len(best) == 0 {
			best = append(best, t)
			continue
		}
		b := best[0]
		switch {
		case bands[t.Precedence] > bands[b.Precedence] || bands[t.Precedence] == bands[b.Precedence] && t.Cost < b.Cost:
			best = []ziti.Terminator{t}
		case bands[t.Precedence] == bands[b.Precedence] && t.Cost == b.Cost:
			best = append(best, t)
		}
	}
	if len(best) == 0 {
		return ziti.Terminator{}, fmt.Errorf("%w: %s", ErrNoTerminator, serviceID)
	}
	slices.SortFunc(best, func(x, y ziti.Terminator) int { return strings.Compare(x.ID, y.ID) })
	f.rr++
	return best[f.rr%len(best)], nil
}

// Dial opens a new circuit to a service: Route picks the terminator, and
// the agent that holds it connects to the target on its host. It returns
// the connection and the identity that serves it.
func (f *Fake) Dial(ctx context.Context, serviceID string) (net.Conn, string, error) {
	f.mu.Lock()
	t, err := f.routeLocked(serviceID)
	var a *HostAgent
	var data map[string]any
	if err == nil {
		a = f.termAgent[t.ID]
		if a == nil {
			err = fmt.Errorf("%w: terminator %s has no simulated agent", ErrNoTerminator, t.ID)
		} else if v, ok := f.hostConfigOf(a.o.Identity, f.services[serviceID]); ok {
			data = v.data
		} else {
			err = fmt.Errorf("%w: agent %s sees no host.v1", ErrNoTerminator, a.o.Identity)
		}
	}
	f.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	c, err := a.dial(ctx, data)
	return c, t.HostID, err
}

// changes returns a channel closed at the next change of the fake's
// objects.
func (f *Fake) changes() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// bump wakes the agents: the objects changed.
func (f *Fake) bump() {
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}
