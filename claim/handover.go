package claim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// HandOverChannel is a Channel that can also ask the other member to take
// the VIP over (Controller.HandOver). Client implements it.
type HandOverChannel interface {
	Channel
	// HandOver asks peer to take vip over; nil means it accepted and is
	// promoting itself. A refusal is a *RefusalError (ErrCheckFailing
	// when the peer's service check does not pass).
	HandOver(ctx context.Context, peer netip.Addr, vip netip.Addr) error
}

// HandOverHandler is a Handler that takes hand-over requests. Controller
// implements it.
type HandOverHandler interface {
	Handler
	// HandleHandOver takes the VIP over on the holder's request, if this
	// node's service check passes.
	HandleHandOver(ctx context.Context, from netip.Addr) error
}

var _ HandOverHandler = (*Controller)(nil)

// ErrNoHandOver is returned by HandOver when the controller cannot ask for
// a hand-over: it is not the carrying holder, an observer, or its channel
// has no HandOver.
var ErrNoHandOver = errors.New("claim: no hand-over possible")

// HandOver asks the other member of the pair to take the VIP over, as a
// planned promote of that member: the holder whose service check fails
// calls it. The other member accepts only if it is a replica that holds
// this node's claim and is neither fenced nor unchecked, and its own
// check passes (Config.Healthy); it then promotes itself in the
// background, which asks this node to release (the address is dropped
// before the release is answered) and claims. HandOver returns once the
// other member has answered: nil when it accepted (the move follows); a
// *RefusalError matching ErrCheckFailing when its check does not pass,
// another refusal or error when it cannot or did not answer. In every
// case but nil this node keeps the VIP, unless the other member accepted
// and its answer was lost on the way: the move then follows as for nil,
// through the usual release. No lock of the controller is held
// during the call (CallTimeout bounds it), so a hand-over never delays a
// renewal or the fence; and a hand-over clears no fence.
func (c *Controller) HandOver(ctx context.Context) error {
	hc, ok := c.cfg.Channel.(HandOverChannel)
	if c.cfg.Key == nil || !ok {
		return fmt.Errorf("%w: an observer, or a channel without hand-over", ErrNoHandOver)
	}
	c.mu.Lock()
	closed, holder, carried, pair := c.closed, c.st.Role(c.cfg.Self) == RoleHolder, c.carried, c.st.Pair
	c.unlock()
	switch {
	case closed:
		return ErrClosed
	case !holder || !carried:
		return fmt.Errorf("%w: this node does not carry the VIP", ErrNoHandOver)
	}
	other, ok := pair.Other(c.cfg.Self)
	if !ok {
		return fmt.Errorf("%w: no other member in the pair record", ErrNoHandOver)
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	return hc.HandOver(cctx, other.Addr, c.cfg.VIP)
}

// HandleHandOver implements HandOverHandler: the holder at from asks this
// node to take the VIP over. It is refused unless from is the other
// member of the pair and holds the newest claim this node took, this node
// is neither fenced nor unchecked, and Config.Healthy passes
// (ErrCheckFailing). Once accepted, a promote runs in the background
// (without clearing a fence; errors go to OnError) and HandleHandOver
// returns nil at once; a promote already running is not started again.
func (c *Controller) HandleHandOver(ctx context.Context, from netip.Addr) error {
	if err := c.handOverAllowed(from); err != nil {
		return err
	}
	if c.cfg.Healthy == nil {
		return fmt.Errorf("%w: no service check configured here", ErrCheckFailing)
	}
	// Healthy is a caller's: never under c.mu.
	if err := c.cfg.Healthy(); err != nil {
		return fmt.Errorf("%w: %v", ErrCheckFailing, err)
	}
	c.mu.Lock()
	defer c.unlock()
	if err := c.handOverAllowedLocked(from); err != nil {
		return err
	}
	if c.promoting > 0 {
		return nil // a promote runs already: the move is under way
	}
	// The asker's call is over (its CallTimeout, or the connection gone):
	// it counts the hand-over as unanswered and keeps the VIP, so no move
	// starts. An answer can still be lost after this point; the holder
	// then sees the move as its release request.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("claim: hand-over request ended before it was accepted: %w", err)
	}
	c.promoting++
	c.wg.Add(1)
	go c.takeOver()
	return nil
}

func (c *Controller) handOverAllowed(from netip.Addr) error {
	c.mu.Lock()
	defer c.unlock()
	return c.handOverAllowedLocked(from)
}

// +checklocks:c.mu
func (c *Controller) handOverAllowedLocked(from netip.Addr) error {
	if c.closed {
		return ErrClosed
	}
	if c.cfg.Key == nil {
		return fmt.Errorf("%w: an observer takes no VIP over", ErrNotPairMember)
	}
	other, ok := c.st.Pair.Other(c.cfg.Self)
	switch {
	case !ok || other.Addr != from:
		return fmt.Errorf("%w: hand-over from %v", ErrNotPairMember, from)
	case c.st.Fenced || c.st.Unchecked:
		return fmt.Errorf("%w: a fenced or unchecked node takes no VIP over", ErrFenced)
	case c.st.Held == nil || c.st.Held.Holder != from:
		return fmt.Errorf("%w: %v does not hold the newest claim taken here", ErrNotHolder, from)
	}
	return nil
}

// takeOver is the promote of an accepted hand-over. It runs with
// c.promoting counted by HandleHandOver and ends it.
func (c *Controller) takeOver() {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		c.promoting--
		c.unlock()
	}()
	c.mu.Lock()
	fenced := c.st.Fenced || c.st.Unchecked || c.closed
	c.unlock()
	if fenced {
		return // fenced since the request was accepted: no promote
	}
	var err error
	if c.cfg.KV == nil {
		_, err = c.promoteNoKV(c.ctx, PromoteOptions{})
	} else {
		_, err = c.promoteKV(c.ctx, PromoteOptions{})
	}
	if err != nil {
		c.report(fmt.Errorf("claim: hand-over: %w", err))
	}
}
