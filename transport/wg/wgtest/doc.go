// Package wgtest carries wireguard-go's encrypted UDP over the simulated
// network of transporttest: SimBind is a conn.Bind whose packets travel
// through a transporttest.Network, so its latency, jitter, loss, reordering
// and partitions act on the real WireGuard protocol (handshakes,
// retransmits, keepalives, roaming).
//
// It is test support: production code imports transport/wg, which never
// imports this package or transporttest, so neither is linked into an
// importer's binary unless its tests use them.
//
//	n := transporttest.NewNetwork(nil, seed)
//	ba, bb := wgtest.NewSimBind(n, "a"), wgtest.NewSimBind(n, "b")
//	da, _ := wg.NewDevice(ioA, cfgA, wg.Options{Bind: ba}) // cfgA's peer endpoint: bb.Addr()
package wgtest

import "errors"

// ErrBadEndpoint is returned by SimBind.ParseEndpoint for a string that is
// not "ip:port". wg.NewDevice wraps it in wg.ErrBadEndpoint.
var ErrBadEndpoint = errors.New("wgtest: bad endpoint")
