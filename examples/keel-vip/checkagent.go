package keelvip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// gateDecision is what a node does with its check's result.
type gateDecision uint8

const (
	gateNone     gateDecision = iota // not the holder, or its check is not failing (stale or unknown included)
	gateDeferred                     // failing, but the VIP moved less than MinMoveInterval ago
	gateHandOver                     // failing: ask the other member to take the VIP over
)

// checkGate decides, for the holder, when a failing check hands the VIP
// over. It is pure: the times are given.
type checkGate struct {
	minMove time.Duration
	// holderSince is when this node last became the holder; zero while it
	// is not.
	holderSince time.Time
}

// role records this node's role at now.
func (g *checkGate) role(now time.Time, holder bool) {
	switch {
	case !holder:
		g.holderSince = time.Time{}
	case g.holderSince.IsZero():
		g.holderSince = now
	}
}

// decide says what the holder does at now with the check's result r: a
// hand-over only when r is failing and fresh and the node has held the
// VIP for at least minMove (the least time between two moves caused by
// checks, since each one makes a new holder).
func (g *checkGate) decide(now time.Time, r CheckResult) gateDecision {
	switch {
	case g.holderSince.IsZero() || !r.Failing():
		return gateNone
	case now.Sub(g.holderSince) < g.minMove:
		return gateDeferred
	}
	return gateHandOver
}

// checkCtl is what the check agent needs of the controller.
type checkCtl interface {
	HandOver(ctx context.Context) error
}

// CheckStats counts the check agent's hand-over decisions.
type CheckStats struct {
	// Accepted counts hand-overs the other member accepted; Refused those
	// it refused (its own check does not pass: this node keeps the VIP);
	// Unanswered those that failed otherwise (kept too); Deferred the
	// failing results of a holder that had held the VIP for less than
	// MinMoveInterval.
	Accepted   uint64 `json:"accepted"`
	Refused    uint64 `json:"refused"`
	Unanswered uint64 `json:"unanswered"`
	Deferred   uint64 `json:"deferred"`
}

// report returns the agent's state for status.
func (a *checkAgent) report() *CheckReport {
	r := a.runner.Result()
	return &CheckReport{Kind: a.runner.cfg.Kind(), Status: r.Status.String(), Fresh: r.Fresh, AgeMs: r.Age.Milliseconds(),
		LastErr: r.LastErr, Runs: r.Runs, Failed: r.Failed, HandOvers: a.Stats()}
}

// checkAgent runs a node's check and, on the holder, hands the VIP over
// when the check fails and the other member's passes. It runs beside the
// controller: it never holds the controller's lock, and the controller's
// renewals and fence never wait for it.
type checkAgent struct {
	runner *checkRunner
	ctl    checkCtl
	clock  transport.Clock
	log    *slog.Logger
	wake   chan struct{}

	accepted   atomic.Uint64
	refused    atomic.Uint64
	unanswered atomic.Uint64
	deferred   atomic.Uint64

	// mu guards the gate and the last status and outcome logged.
	mu syncx.Mutex
	// +checklocks:mu
	gate checkGate
	// +checklocks:mu
	lastStatus CheckStatus
	// +checklocks:mu
	lastOutcome string
}

func newCheckAgent(runner *checkRunner, ctl checkCtl, clock transport.Clock, log *slog.Logger) *checkAgent {
	a := &checkAgent{runner: runner, ctl: ctl, clock: transport.Or(clock), log: log, wake: make(chan struct{}, 1),
		gate: checkGate{minMove: runner.cfg.MinMoveInterval}}
	runner.onResult = a.poke
	return a
}

func (a *checkAgent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Stats returns the counts so far.
func (a *checkAgent) Stats() CheckStats {
	return CheckStats{Accepted: a.accepted.Load(), Refused: a.refused.Load(), Unanswered: a.unanswered.Load(), Deferred: a.deferred.Load()}
}

// Healthy is the controller's Config.Healthy: nil when the check passes on
// a fresh result.
func (a *checkAgent) Healthy() error {
	r := a.runner.Result()
	if r.Passing() {
		return nil
	}
	if !r.Fresh {
		return fmt.Errorf("%s check %s, no result within %v", a.runner.cfg.Kind(), r.Status, a.runner.cfg.MaxResultAge())
	}
	return fmt.Errorf("%s check %s: %s", a.runner.cfg.Kind(), r.Status, r.LastErr)
}

// run runs the check and follows the controller's changes until ctx ends
// or the changes end.
func (a *checkAgent) run(ctx context.Context, changes <-chan claim.Change) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rerr := make(chan error, 1)
	go func() { rerr <- a.runner.run(ctx) }()
	for {
		select {
		case <-ctx.Done():
			return <-rerr
		case err := <-rerr:
			return err
		case c, ok := <-changes:
			if !ok {
				cancel()
				return <-rerr
			}
			a.mu.Lock()
			a.gate.role(a.clock.Now(), c.Role == claim.RoleHolder)
			a.mu.Unlock()
		case <-a.wake:
			a.step(ctx)
		}
	}
}

// step acts on the newest result.
func (a *checkAgent) step(ctx context.Context) {
	r := a.runner.Result()
	a.mu.Lock()
	d := a.gate.decide(a.clock.Now(), r)
	since := a.gate.holderSince
	prev := a.lastStatus
	a.lastStatus = r.Status
	a.mu.Unlock()
	if prev != r.Status {
		a.log.Info("check status", "kind", a.runner.cfg.Kind(), "status", r.Status, "was", prev, "last_err", r.LastErr)
	}
	switch d {
	case gateNone:
		a.outcome("", nil)
		return
	case gateDeferred:
		a.deferred.Add(1)
		a.outcome("deferred", func() {
			a.log.Warn("check failing; the VIP moved too recently to hand it over", "last_err", r.LastErr,
				"held_for", a.clock.Now().Sub(since).Round(time.Millisecond), "min_move_interval", a.runner.cfg.MinMoveInterval)
		})
		return
	}
	err := a.ctl.HandOver(ctx)
	switch {
	case err == nil:
		a.accepted.Add(1)
		a.outcome("accepted", func() {
			a.log.Warn("check failing; the other member's check passes: handing the VIP over", "last_err", r.LastErr)
		})
	case errors.Is(err, claim.ErrCheckFailing):
		a.refused.Add(1)
		a.outcome("refused", func() {
			a.log.Warn("check failing here and on the other member: keeping the VIP", "last_err", r.LastErr, "peer", err)
		})
	default:
		a.unanswered.Add(1)
		a.outcome("unanswered", func() {
			a.log.Warn("check failing; the hand-over failed: keeping the VIP", "last_err", r.LastErr, "err", err)
		})
	}
}

// outcome logs (with logf) only when the outcome changes, so a check that
// keeps failing logs once, not every interval.
func (a *checkAgent) outcome(o string, logf func()) {
	a.mu.Lock()
	changed := a.lastOutcome != o
	a.lastOutcome = o
	a.mu.Unlock()
	if changed && logf != nil {
		logf()
	}
}
