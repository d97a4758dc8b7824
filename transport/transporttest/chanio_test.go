package transporttest_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestChanPairBatchesAndOffset(t *testing.T) {
	a, b := transporttest.NewChanPair(transporttest.ChanPairOptions{MTU: 100, BatchSize: 4})
	defer a.Close()
	defer b.Close()
	const off = 16
	var out [][]byte
	for i := range 6 {
		p := make([]byte, off+10+i)
		p[off] = byte(i)
		out = append(out, p)
	}
	out = append(out, make([]byte, off+101)) // over the MTU: dropped
	if n, err := a.Write(out, off); err != nil || n != len(out) {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if a.Drops() != 1 {
		t.Fatalf("drops %d, want 1 oversized", a.Drops())
	}
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, off+100)
	}
	sizes := make([]int, 4)
	n, err := b.Read(bufs, sizes, off)
	if err != nil || n != 4 {
		t.Fatalf("first Read = %d, %v; want a batch of 4", n, err)
	}
	n2, err := b.Read(bufs, sizes[:], off)
	if err != nil || n2 != 2 {
		t.Fatalf("second Read = %d, %v; want the 2 left", n2, err)
	}
	for i := range n2 {
		if sizes[i] != 14+i || bufs[i][off] != byte(4+i) {
			t.Fatalf("packet %d: size %d first byte %d", i, sizes[i], bufs[i][off])
		}
	}
}

func TestChanPairCloseUnblocksRead(t *testing.T) {
	a, b := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	done := make(chan error, 1)
	go func() {
		bufs := [][]byte{make([]byte, 1500)}
		_, err := b.Read(bufs, make([]int, 1), 0)
		done <- err
	}()
	b.Close()
	if err := <-done; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Read after Close = %v", err)
	}
	if _, err := b.Write([][]byte{{0x45}}, 0); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
	a.Close()
	a.Close() // idempotent
}

var _ transport.PacketIO = (*transporttest.ChanIO)(nil)

func BenchmarkChanPair(b *testing.B) {
	x, y := transporttest.NewChanPair(transporttest.ChanPairOptions{BatchSize: 64, Queue: 4096})
	defer x.Close()
	defer y.Close()
	pkts := make([][]byte, 64)
	rbufs := make([][]byte, 64)
	for i := range pkts {
		pkts[i] = make([]byte, 1400)
		rbufs[i] = make([]byte, 1500)
	}
	sizes := make([]int, 64)
	b.ReportAllocs()
	b.SetBytes(64 * 1400)
	for b.Loop() {
		x.Write(pkts, 0)
		got := 0
		for got < 64 {
			n, _ := y.Read(rbufs, sizes, 0)
			got += n
		}
	}
	b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "pkts/s")
}

func TestChanIOReadInterrupter(t *testing.T) {
	a, b := transporttest.NewChanPair(transporttest.ChanPairOptions{})
	defer a.Close()
	transporttest.CheckReadInterrupter(t, b, func(t testing.TB) {
		if _, err := a.Write([][]byte{{0x45, 0, 0, 20}}, 0); err != nil {
			t.Fatal(err)
		}
	})
}
