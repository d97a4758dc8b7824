package tunwrap_test

import (
	"sync/atomic"
	"testing"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/transport/transporttest"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/tunwrap"
)

// watchedTUN records an inner Write made while a Filter call is running.
type watchedTUN struct {
	tun.Device
	inFilter *atomic.Bool
	inside   atomic.Int32
}

func (w *watchedTUN) Write(bufs [][]byte, offset int) (int, error) {
	if w.inFilter.Load() {
		w.inside.Add(1)
	}
	return w.Device.Write(bufs, offset)
}

// An inbound injection made from inside the Filter (flow's Emit does it,
// with the NAT's lock held) is only queued: the Wrapper takes no lock and
// writes nothing from inside the Filter, and the Read or Write running the
// Filter writes it once the Filter returns. Before, the injection took the
// write lock (TryLock, which the lock-order build reports as recursive
// from inside Write) and wrote the inner TUN from inside the Filter.
func TestFilterInjectionWrittenAfterFilter(t *testing.T) {
	var inFilter atomic.Bool
	var w *tunwrap.Wrapper
	inject := func() tunwrap.Verdict {
		inFilter.Store(true)
		defer inFilter.Store(false)
		if err := w.InjectInbound(udp(t, vipAddr, 9, "from-filter")); err != nil {
			t.Error(err)
		}
		return tunwrap.Drop
	}
	h := &hooks{
		out: func([]byte) tunwrap.Verdict { return inject() },
		in:  func([]byte, flow.PeerID, bool) tunwrap.Verdict { return inject() },
	}
	host, dev := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	inner := &watchedTUN{Device: wg.TUNFromPacketIO(dev), inFilter: &inFilter}
	w = tunwrap.Wrap(inner, tunwrap.Options{Filter: h})
	t.Cleanup(func() { w.Close(); host.Close() })

	// Outbound: Read runs the Filter.
	hostSend(t, host, "out")
	bufs, sizes := batch(4)
	if _, err := w.Read(bufs, sizes, tunwrap.Offset); err != nil {
		t.Fatal(err)
	}
	if g := hostReadN(t, host, 1); g[0] != "from-filter" {
		t.Fatalf("host read %v", g)
	}
	// Inbound: Write runs the Filter.
	if _, err := w.Write([][]byte{append(make([]byte, tunwrap.Offset), udp(t, beAddr, 1, "in")...)}, tunwrap.Offset); err != nil {
		t.Fatal(err)
	}
	if g := hostReadN(t, host, 1); g[0] != "from-filter" {
		t.Fatalf("host read %v", g)
	}
	if n := inner.inside.Load(); n != 0 {
		t.Fatalf("%d inner TUN writes ran inside the Filter", n)
	}
}
