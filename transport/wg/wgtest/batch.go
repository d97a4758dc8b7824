package wgtest

import "golang.zx2c4.com/wireguard/conn"

// Batch is one receive batch for a conn.ReceiveFunc: the packet buffers,
// the sizes it fills in and the endpoints it sets, one of each per packet.
//
//	rx := wgtest.NewBatch(bind.BatchSize(), 2048)
//	n, err := recv(rx.Bufs, rx.Sizes, rx.Eps) // packet i: rx.Bufs[i][:rx.Sizes[i]] from rx.Eps[i]
type Batch struct {
	Bufs  [][]byte
	Sizes []int
	Eps   []conn.Endpoint
}

// NewBatch returns a batch of n buffers of size bytes each.
func NewBatch(n, size int) *Batch {
	b := &Batch{Bufs: make([][]byte, n), Sizes: make([]int, n), Eps: make([]conn.Endpoint, n)}
	for i := range b.Bufs {
		b.Bufs[i] = make([]byte, size)
	}
	return b
}
