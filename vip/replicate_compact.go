package vip

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/vipkit/vipkit/crdt"
)

// Compaction of deletion markers over the control channel (docs/crdt.md,
// "Deletions without a lifetime cap"; docs/wire.md, "Certificate
// frames").
//
// A certificate frame (type 5) carries a crdt.Certificate encoding: a
// compaction and some of its acknowledgements, in as many frames as the
// control frame limit needs (each frame repeats the compaction and
// carries a run of the acknowledgements). Every rotation the lowest-key
// current member proposes a compaction when it holds tombstones of
// creator-bound services (or its certificate does not name the current
// members), acknowledges it itself, and sends it with the
// acknowledgements gathered so far to every peer. A member that gets a
// compaction it has not acknowledged acknowledges it when its held state
// matches (crdt.Replica.Acknowledge), and answers with a frame of the
// compaction and its acknowledgement. A node that gathers every
// acknowledgement applies the certificate; the proposer then sends it to
// every peer, and each rotation sends the held certificate to the
// rotation's peers, so that returning and joining nodes get it.

// certFrames encodes cert in frames within the limit: the compaction in
// each, the acknowledgements split between them (at least one frame, even
// without acknowledgements). None when the compaction alone does not fit.
func (p *Replicator) certFrames(cert crdt.Certificate) [][]byte {
	base := cert.Compaction.Encode()
	room := p.limit - frameHeader - len(base) - 3
	per := room / (32 + crdt.SignatureSize)
	if per < 1 {
		p.certRefused.Add(1)
		return nil
	}
	var frames [][]byte
	acks := cert.Acks
	for first := true; first || len(acks) > 0; first = false {
		n := min(per, len(acks))
		part := crdt.Certificate{Compaction: cert.Compaction, Acks: acks[:n]}
		f := append([]byte{frameMagic, frameVersion, frameCert}, part.Encode()...)
		frames = append(frames, f)
		acks = acks[n:]
	}
	return frames
}

// lowestMember reports whether this node's key is the lowest of the
// current members.
func lowestMember(r *crdt.Replica) bool {
	ms := r.Members()
	self := r.Author()
	return len(ms) > 0 && ms[0] == self
}

// compactRound runs the proposer's part of a rotation: propose, or send
// the pending compaction again, to every peer. It returns the frames of
// the held certificate for the rotation's peers.
func (p *Replicator) compactRound(ctx context.Context, peers []NodeID) [][]byte {
	if p.o.NoCompaction {
		return nil
	}
	replica := p.o.Registry.Replica()
	var held [][]byte
	if c, ok := replica.Certificate(); ok {
		held = p.certFrames(c)
	}
	if !lowestMember(replica) {
		return held
	}
	c, ok, err := replica.Propose()
	if err != nil {
		p.certRefused.Add(1)
		return held
	}
	if !ok {
		return held
	}
	// The same compaction as the newest pending one (but its epoch) is
	// sent again rather than proposed anew, so that slow
	// acknowledgements still meet.
	pend := replica.Pending()
	if n := len(pend); n > 0 {
		last := pend[n-1].Compaction
		same := c
		same.Epoch = last.Epoch
		if bytes.Equal(same.Encode(), last.Encode()) {
			c = last
		}
	}
	ack, err := replica.Acknowledge(ctx, c)
	if err != nil {
		p.certRefused.Add(1)
		return held
	}
	res, err := replica.AddCertificate(ctx, crdt.Certificate{Compaction: c, Acks: []crdt.Ack{ack}})
	if err != nil {
		p.certRefused.Add(1)
	}
	if res.Applied {
		p.applied(res)
		if cert, ok := replica.Certificate(); ok {
			held = p.certFrames(cert)
		}
		for _, peer := range peers {
			for _, f := range held {
				p.sendCert(ctx, peer, f)
			}
		}
		return nil
	}
	for _, cert := range replica.Pending() {
		if cert.Compaction.Epoch != c.Epoch {
			continue
		}
		frames := p.certFrames(cert)
		for _, peer := range peers {
			for _, f := range frames {
				p.sendCert(ctx, peer, f)
			}
		}
	}
	return held
}

func (p *Replicator) applied(res crdt.CertResult) {
	p.certApplied.Add(1)
	if len(res.Dropped) > 0 {
		ids := make([]ServiceID, len(res.Dropped))
		for i, id := range res.Dropped {
			ids[i] = ServiceID(id)
		}
		p.o.Registry.Merged(ids)
	}
}

func (p *Replicator) sendCert(ctx context.Context, to NodeID, frame []byte) {
	if len(frame) > p.limit {
		p.rejected.Add(1)
		return
	}
	if err := p.o.Carrier.Send(ctx, to, frame); err == nil {
		p.framesSent.Add(1)
		p.bytesSent.Add(uint64(len(frame)))
		p.certSent.Add(1)
	}
}

// handleCert adds a certificate frame's acknowledgements, applies the
// certificate once complete, and acknowledges a compaction this node
// has not acknowledged yet when its state matches, answering the sender
// with the acknowledgement (within the sender's reply budget).
func (p *Replicator) handleCert(ctx context.Context, from NodeID, body []byte) error {
	cert, err := crdt.DecodeCertificate(body)
	if err != nil {
		p.rejected.Add(1)
		return fmt.Errorf("vip: certificate from %s: %w", from.String()[:12], err)
	}
	p.certRecv.Add(1)
	replica := p.o.Registry.Replica()
	res, err := replica.AddCertificate(ctx, cert)
	if res.Applied {
		p.applied(res)
		return err
	}
	if err != nil {
		p.rejected.Add(1)
		return fmt.Errorf("vip: certificate from %s: %w", from.String()[:12], err)
	}
	if res.Stale || p.o.NoCompaction || !slices.Contains(res.Missing, replica.Author()) {
		return nil
	}
	ack, err := replica.Acknowledge(ctx, cert.Compaction)
	if err != nil {
		p.certRefused.Add(1)
		return fmt.Errorf("vip: compaction from %s not acknowledged: %w", from.String()[:12], err)
	}
	own := crdt.Certificate{Compaction: cert.Compaction, Acks: []crdt.Ack{ack}}
	if res, err := replica.AddCertificate(ctx, own); err == nil && res.Applied {
		p.applied(res)
	}
	p.acksSent.Add(1)
	return p.answerFrames(ctx, from, p.certFrames(own), "acknowledgement frames", p.sendCert)
}
