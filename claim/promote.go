package claim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vipkit/vipkit/transport"
)

// Handler is the members' channel's view of one VIP on a node: the server
// (Server) decodes requests and calls it. Controller implements it. Errors
// that are refusals (the sentinels of Policy.Accept and AcceptRelease)
// become 409 with a reason; any other error means the node could not act.
type Handler interface {
	// VIP returns the VIP the handler is for; Server routes each request
	// to the handler of the VIP it names.
	VIP() netip.Addr
	// HandleClaim takes an announced claim from the peer at from.
	HandleClaim(ctx context.Context, from netip.Addr, c *Claim) error
	// HandleRelease releases the VIP on the other member's request: the
	// address is dropped first, and only then does it answer, with the
	// claim it held. With a KV, the node's own lease is revoked by its
	// next step.
	HandleRelease(ctx context.Context, from netip.Addr, r *Release) (*Claim, error)
	// HandleEpoch returns the newest claim taken (nil: none).
	HandleEpoch(ctx context.Context) (*Claim, error)
}

var _ Handler = (*Controller)(nil)

// HandleClaim implements Handler: the claim is taken if Policy.Accept
// allows it; a holder that takes another's newer claim drops the VIP and is
// fenced; the VIP is routed to the new holder.
func (c *Controller) HandleClaim(ctx context.Context, from netip.Addr, cl *Claim) error {
	for {
		c.mu.Lock()
		closed, kept := c.closed, c.st.Pair
		c.unlock()
		if closed {
			return ErrClosed
		}
		if cl.VIP != c.cfg.VIP {
			return fmt.Errorf("%w: claim for %v", ErrPairMismatch, cl.VIP)
		}
		// Verify asks the trust store, a caller's: never under c.mu.
		if err := c.cfg.Policy.Verify(kept, cl, from); err != nil {
			return err
		}
		c.mu.Lock()
		if c.st.Pair != kept && !c.closed {
			c.unlock() // the kept record changed meanwhile: verify again
			continue
		}
		err := c.takeClaimLocked(cl)
		c.unlock()
		return err
	}
}

// takeClaimLocked is HandleClaim once cl is verified against the kept
// pair record.
// +checklocks:c.mu
func (c *Controller) takeClaimLocked(cl *Claim) error {
	if c.closed {
		return ErrClosed
	}
	if err := Fresh(c.st.Held, cl); err != nil {
		return err
	}
	self := c.cfg.Self
	if cl.Holder == self {
		// Our own claim, returned to us: nothing we did not know.
		return fmt.Errorf("%w: own claim", ErrWrongSender)
	}
	was := c.st.Role(self)
	c.st = c.st.Take(self, cl)
	if was == RoleHolder {
		c.fenceLocked()
	}
	c.saveLocked()
	c.routeLocked(cl.Holder)
	return nil
}

// HandleRelease implements Handler.
func (c *Controller) HandleRelease(ctx context.Context, from netip.Addr, r *Release) (*Claim, error) {
	for {
		c.mu.Lock()
		closed, held, kept := c.closed, c.st.Held, c.st.Pair
		c.unlock()
		if closed {
			return nil, ErrClosed
		}
		// AcceptRelease asks the trust store, a caller's: never under c.mu.
		accept := c.cfg.Policy.AcceptRelease(c.cfg.Self, held, kept, r, from)
		c.mu.Lock()
		if !c.closed && (c.st.Held != held || c.st.Pair != kept) {
			c.unlock() // the state moved meanwhile: check again
			continue
		}
		held, err := c.releaseLocked(accept)
		c.unlock()
		return held, err
	}
}

// releaseLocked is HandleRelease once the release was checked (accept is
// AcceptRelease's answer) against the claim held and the kept record.
// +checklocks:c.mu
func (c *Controller) releaseLocked(accept error) (*Claim, error) {
	if c.closed {
		return nil, ErrClosed
	}
	held := c.st.Held
	if c.st.Released && held != nil && held.Holder == c.cfg.Self {
		// A retried release: answer again, it has already happened.
		if accept != nil {
			return nil, accept
		}
		return held, nil
	}
	if c.st.Fenced && held != nil && held.Holder == c.cfg.Self {
		return nil, ErrFenced
	}
	if c.st.Role(c.cfg.Self) != RoleHolder {
		return nil, ErrNotHolder
	}
	if accept != nil {
		return nil, accept
	}
	c.dropLocked()
	if c.carried {
		return nil, fmt.Errorf("claim: release: could not drop %v; not released", c.cfg.VIP)
	}
	c.st = c.st.Release()
	c.lastRenew = time.Time{}
	c.saveLocked()
	// The released lease is revoked by this node's next step (renew), not
	// before answering: the claimant's transaction replaces the holder key
	// at the revision read, so the revoke is not on the planned move's
	// critical path (one quorum round trip less of downtime).
	return held, nil
}

// HandleEpoch implements Handler.
func (c *Controller) HandleEpoch(ctx context.Context) (*Claim, error) {
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		return nil, ErrClosed
	}
	return c.st.Held, nil
}

// PromoteOptions tunes Promote.
type PromoteOptions struct {
	// OldPrimaryGone declares the old primary gone: a promote whose holder
	// does not answer the release goes on (without etcd: at once; with
	// etcd: after its lease expires, never revoking it).
	OldPrimaryGone bool
}

// PromoteResult says how a promote ended.
type PromoteResult struct {
	Claim *Claim // this node's claim now held
	// ByController is set when this node's own controller claimed first
	// after the release; this node holds the VIP all the same.
	ByController bool
	// AlreadyHeld is set when this node held the VIP before the promote.
	AlreadyHeld bool
	// Taken and Answered count the peers that took the claim and that
	// answered at all (without etcd, the majority rule).
	Taken, Answered int
}

// Promote makes this node the holder, on an operator's order; it is the
// only way to clear a fence. With a KV: read the keys; ask the holder to
// release (it drops the address, answers, and revokes its own lease in its
// next step); claim with the transaction, which replaces the released
// holder's key in place at the revision read; announce. If the holder does
// not answer, refuse unless OldPrimaryGone, and then wait for its lease to
// expire, up to LeaseTTL plus ElectionTimeout (or until this node's own
// controller has claimed), and claim the absent key. Without a KV: ask
// every peer for its epoch, ask the holder to release for the next epoch,
// announce the claim, and carry only when a majority of the peers that
// answered took it (ErrNoMajority otherwise, carrying nothing).
//
// # Replacing the holder key in place
//
// A plain planned move would have the holder revoke its lease before it
// answers and the claimant require the holder key absent. Here the
// claimant's transaction instead compares the counter's and the holder
// key's ModRevision with those it read before it asked for the release,
// and puts both keys (the holder key on its own lease). That saves a
// quorum round trip and a read in the downtime and gives the same
// guarantee:
//
//   - One claimant per step. The transaction succeeds only if neither key
//     changed since the read, and every claim writes the counter; of two
//     claimants that read the same revisions at most one succeeds,
//     exactly as with the absent-key rule. Renewals do not change a key's
//     revision, so the old holder's renewals neither block nor help it.
//   - The old holder no longer carries. The in-place path is taken only
//     after the holder answered the release, which it does after it has
//     dropped the address and marked itself released; a released node
//     carries again only through a newer claim of its own, which would
//     have written the counter and failed the compare. Without that answer
//     (OldPrimaryGone) the key must be gone, as on any failover.
//   - The old lease cannot take the VIP away. A key belongs to the lease
//     of its latest put: once replaced, the holder key is on the
//     claimant's lease, and the old holder's revoke (its next step) or
//     the old lease's expiry deletes nothing of it.
//
// A fencing token must therefore never be the holder key's
// CreateRevision, which an in-place replacement keeps: FenceToken
// compares the holder key's ModRevision and value, which every claim
// changes.
func (c *Controller) Promote(ctx context.Context, o PromoteOptions) (PromoteResult, error) {
	if c.cfg.Key == nil {
		return PromoteResult{}, fmt.Errorf("%w: an observer cannot promote", ErrInvalidOptions)
	}
	c.mu.Lock()
	if c.closed {
		c.unlock()
		return PromoteResult{}, ErrClosed
	}
	c.st = c.st.Promote()
	c.saveLocked()
	c.promoting++
	c.unlock()
	defer func() {
		c.mu.Lock()
		c.promoting--
		c.unlock()
	}()
	if c.cfg.KV == nil {
		return c.promoteNoKV(ctx, o)
	}
	return c.promoteKV(ctx, o)
}

// askRelease asks the holder to release for next. It returns nil when the
// holder released, a *RefusalError when it refused, ErrHolderUnreachable
// (wrapping the cause) when it did not answer.
func (c *Controller) askRelease(ctx context.Context, holder netip.Addr, next uint64) error {
	if c.cfg.Channel == nil {
		return fmt.Errorf("%w: no members' channel", ErrHolderUnreachable)
	}
	r, err := NewRelease(c.cfg.Key, c.cfg.Policy.Mesh, c.cfg.VIP, c.cfg.Self, next)
	if err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	_, err = c.cfg.Channel.Release(cctx, holder, r)
	var ref *RefusalError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ref):
		return err
	default:
		return fmt.Errorf("%w: %v: %w", ErrHolderUnreachable, holder, err)
	}
}

func (c *Controller) ensureLease(ctx context.Context) (LeaseID, error) {
	c.mu.Lock()
	lease, ok := c.st.Lease, c.renewedLocked()
	c.unlock()
	if lease != 0 && ok {
		return lease, nil
	}
	sent := c.clock.Now()
	cctx, cancel := c.call(ctx)
	defer cancel()
	if lease != 0 {
		if _, err := c.cfg.KV.KeepAliveOnce(cctx, lease); err == nil {
			c.mu.Lock()
			c.lastRenew = sent
			c.armDropLocked()
			c.unlock()
			return lease, nil
		}
	}
	id, _, err := c.cfg.KV.Grant(cctx, c.cfg.LeaseTTL)
	if err != nil {
		return 0, fmt.Errorf("claim: grant: %w", err)
	}
	c.mu.Lock()
	c.st.Lease = id
	c.lastRenew = sent
	c.saveLocked()
	c.armDropLocked()
	c.unlock()
	return id, nil
}

func (c *Controller) promoteKV(ctx context.Context, o PromoteOptions) (PromoteResult, error) {
	read := func() (keyState, error) {
		cctx, cancel := c.call(ctx)
		defer cancel()
		g, err := c.cfg.KV.Get(cctx, c.keys.Prefix, true)
		if err != nil {
			return keyState{}, fmt.Errorf("claim: read keys: %w", err)
		}
		return c.readKeys(g), nil
	}
	ks, err := read()
	if err != nil {
		return PromoteResult{}, err
	}
	c.apply(ks)
	if ks.holderAlive && ks.holder.Holder == c.cfg.Self {
		return PromoteResult{Claim: ks.holder, AlreadyHeld: true}, nil
	}
	if ks.holderAlive {
		next, err := nextEpoch(ks.holder.Epoch)
		if err != nil {
			return PromoteResult{}, err
		}
		err = c.askRelease(ctx, ks.holder.Holder, next)
		switch {
		case err == nil:
			// The holder dropped the address before it answered: claim
			// at once, replacing its holder key at the revision read
			// before the release (the keys are not read again, and the
			// holder's revoke is not waited for: two quorum round trips
			// less in the planned move's downtime). The transaction's
			// compare refuses it if either key changed in between; the
			// retry below then claims from fresh keys.
		case errors.Is(err, ErrHolderUnreachable) && o.OldPrimaryGone:
			// Wait for the old primary's lease to expire; never revoke it.
			// The wait ends when the old holder's key is gone, or when
			// this node's own controller has claimed meanwhile (its
			// failover runs beside the promote).
			deadline := c.clock.Now().Add(c.cfg.LeaseTTL + c.cfg.ElectionTimeout)
			for ks.holderAlive && ks.holder.Holder != c.cfg.Self {
				if !c.clock.Now().Before(deadline) {
					return PromoteResult{}, ErrLeaseWait
				}
				if !transport.Sleep(c.clock, min(c.cfg.RenewInterval, deadline.Sub(c.clock.Now())), ctx.Done()) {
					return PromoteResult{}, ctx.Err()
				}
				if ks, err = read(); err != nil {
					return PromoteResult{}, err
				}
			}
			c.apply(ks)
		default:
			return PromoteResult{}, err
		}
	}
	if ks.holderAlive && ks.holder.Holder == c.cfg.Self {
		return PromoteResult{Claim: ks.holder, ByController: true}, nil
	}
	if _, err := c.ensureLease(ctx); err != nil {
		return PromoteResult{}, err
	}
	// Take the counter's claim if we had not (the txn continues from it).
	cl, err := c.claimTxn(ctx, ks)
	if errors.Is(err, ErrCompareFailed) {
		// Something moved since the keys were read: this node's own
		// controller claimed first, or the keys changed under the
		// promote. Read them again; claim once more if nobody holds.
		if ks2, rerr := read(); rerr == nil {
			c.apply(ks2)
			switch {
			case ks2.holderAlive && ks2.holder.Holder == c.cfg.Self:
				return PromoteResult{Claim: ks2.holder, ByController: true}, nil
			case !ks2.holderAlive:
				cl, err = c.claimTxn(ctx, ks2)
			}
		}
	}
	if err != nil {
		return PromoteResult{}, err
	}
	return PromoteResult{Claim: cl}, nil
}

func (c *Controller) promoteNoKV(ctx context.Context, o PromoteOptions) (PromoteResult, error) {
	c.mu.Lock()
	newest := c.st.Held
	if c.st.Role(c.cfg.Self) == RoleHolder && c.carried {
		c.unlock()
		return PromoteResult{Claim: newest, AlreadyHeld: true}, nil
	}
	pair := c.st.Pair
	c.unlock()
	if c.cfg.Channel != nil {
		if cl, _ := c.askEpochs(ctx, pair); cl != nil && cl.Newer(newest) {
			newest = cl
		}
	}
	var next uint64 = 1
	if newest != nil {
		var err error
		if next, err = nextEpoch(newest.Epoch); err != nil {
			return PromoteResult{}, err
		}
		if newest.Holder != c.cfg.Self {
			if err := c.askRelease(ctx, newest.Holder, next); err != nil {
				if !(errors.Is(err, ErrHolderUnreachable) && o.OldPrimaryGone) {
					return PromoteResult{}, err
				}
			}
		}
	}
	cl, err := NewClaim(c.cfg.Key, c.cfg.Self, next, pair)
	if err != nil {
		return PromoteResult{}, err
	}
	taken, answered := c.announce(ctx, cl)
	res := PromoteResult{Taken: taken, Answered: answered}
	if answered == 0 || taken*2 <= answered {
		return res, fmt.Errorf("%w: %d of %d answering peers took epoch %d", ErrNoMajority, taken, answered, next)
	}
	c.mu.Lock()
	c.st = c.st.Claimed(cl, 0)
	c.stats.Claims++
	c.saveLocked()
	c.carryLocked()
	c.unlock()
	res.Claim = cl
	return res, nil
}
