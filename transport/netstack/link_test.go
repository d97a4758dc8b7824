package netstack

import (
	"math/rand/v2"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/vipkit/vipkit/internal/testenv"
)

// TestLinkQueueModel drives the outbound queue with random batches of
// packets from the stack side and random Reads (batch sizes, buffer sizes,
// offsets), and checks every result against a naive FIFO model with the
// same capacity: which packets come out, in which order, and what is
// dropped where.
func TestLinkQueueModel(t *testing.T) {
	seed := testenv.Seed(t, 42)
	rng := rand.New(rand.NewPCG(seed, 0))
	const capacity, batch = 16, 8
	l := newLink(1500, capacity, batch)
	defer l.Close()

	// Packets carry their serial number in their first two bytes; their
	// size varies so that some do not fit small buffers.
	type pkt struct{ id, size int }
	var model []pkt
	var modelQueueFull, modelTooBig, modelOut uint64
	next := 0
	mk := func(size int) *stack.PacketBuffer {
		b := make([]byte, size)
		b[0], b[1] = byte(next>>8), byte(next)
		for i := 2; i < size; i++ {
			b[i] = byte(next + i)
		}
		return stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	}
	bufs := make([][]byte, 12)
	sizes := make([]int, 12)
	for step := range 5000 {
		if rng.IntN(2) == 0 || len(model) == 0 {
			// The stack sends 1–10 packets.
			var list stack.PacketBufferList
			k := 1 + rng.IntN(10)
			for range k {
				size := 2 + rng.IntN(300)
				p := mk(size)
				list.PushBack(p)
				if len(model) < capacity {
					model = append(model, pkt{next, size})
				} else {
					modelQueueFull++
				}
				next++
			}
			if n, err := l.WritePackets(list); n != k || err != nil {
				t.Fatalf("step %d: WritePackets = %d, %v", step, n, err)
			}
			list.DecRef()
			continue
		}
		// A Read with 1–12 buffers of 50–400 bytes after a 0–20 byte offset.
		nb := 1 + rng.IntN(len(bufs))
		off := rng.IntN(21)
		for i := range nb {
			bufs[i] = make([]byte, off+50+rng.IntN(351))
		}
		// The model: take up to min(nb, batch) packets; those too big for
		// their buffer are dropped and refilled from the queue.
		var want []pkt
		limit := min(nb, batch)
		for len(want) < limit && len(model) > 0 {
			p := model[0]
			model = model[1:]
			if p.size > len(bufs[len(want)])-off {
				modelTooBig++
				continue
			}
			want = append(want, p)
		}
		if len(want) == 0 {
			// Everything was too big and the queue is empty: a real Read
			// would drop them all and block. Drop them the same way
			// without blocking, then compare.
			l.readMu.Lock()
			for l.queued() > 0 {
				k, _ := l.take(l.scratch[:1], false)
				for i := range k {
					l.scratch[i].DecRef()
					l.scratch[i] = nil
				}
				l.outTooBig.Add(uint64(k))
			}
			l.readMu.Unlock()
			if got := l.outTooBig.Load(); got != modelTooBig {
				t.Fatalf("step %d: outTooBig %d, model %d", step, got, modelTooBig)
			}
			continue
		}
		n, err := l.read(bufs[:nb], sizes[:nb], off)
		if err != nil {
			t.Fatalf("step %d: read: %v", step, err)
		}
		if n != len(want) {
			t.Fatalf("step %d: read %d packets, model %d", step, n, len(want))
		}
		for i, p := range want {
			got := bufs[i][off : off+sizes[i]]
			if sizes[i] != p.size || int(got[0])<<8|int(got[1]) != p.id&0xffff {
				t.Fatalf("step %d: packet %d is #%d of %d bytes, model #%d of %d", step, i, int(got[0])<<8|int(got[1]), sizes[i], p.id, p.size)
			}
			for j := 2; j < len(got); j++ {
				if got[j] != byte(p.id+j) {
					t.Fatalf("step %d: packet #%d corrupt at byte %d", step, p.id, j)
				}
			}
		}
		modelOut += uint64(n)
		if got := l.outTooBig.Load(); got != modelTooBig {
			t.Fatalf("step %d: outTooBig %d, model %d", step, got, modelTooBig)
		}
		if l.queued() != len(model) {
			t.Fatalf("step %d: %d queued, model %d", step, l.queued(), len(model))
		}
	}
	if got := l.outQueueFull.Load(); got != modelQueueFull {
		t.Errorf("outQueueFull %d, model %d", got, modelQueueFull)
	}
	if got := l.outPackets.Load(); got != modelOut {
		t.Errorf("outPackets %d, model %d", got, modelOut)
	}
	if modelQueueFull == 0 || modelTooBig == 0 || modelOut == 0 {
		t.Errorf("the run did not exercise every path: full %d, too big %d, out %d", modelQueueFull, modelTooBig, modelOut)
	}
}
