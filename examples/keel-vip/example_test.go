package keelvip_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

// Render writes the wg-quick configuration of the interface with the VIP
// routed to its holder; Drift compares a live device with the mesh file
// and never reports the VIP's move.
func ExampleMesh_Render() {
	doc := meshDoc("/etc/keel")
	delete(doc, "etcd")
	m, err := keelvip.ParseMesh(bytes.NewReader(encode(nil, doc)))
	if err != nil {
		fmt.Println(err)
		return
	}
	b := netip.MustParseAddr("fd00:1::1:2")
	if err := m.Render(os.Stdout, m.VIP, b); err != nil {
		fmt.Println(err)
	}
	live := m.WGConfig()
	live.Peers[0].AllowedIPs = append(live.Peers[0].AllowedIPs, netip.PrefixFrom(m.VIP, 128))
	fmt.Println("drift:", m.Drift(live.Normalize(), m.VIP))
	// Output:
	// # wg0: rendered by keel-vip from the mesh file "m1"; do not edit
	// [Interface]
	// PrivateKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=
	// ListenPort = 51820
	// Address = fd00:1::1:1/128
	// MTU = 1420
	//
	// [Peer]
	// # c
	// PublicKey = Xf7dO2vUf2+ijuFdlp1bsOpTd01Ii9r53xxuASSz7yI=
	// AllowedIPs = 10.9.0.0/24, fd00:1::2:3/128
	//
	// [Peer]
	// # b
	// PublicKey = zo060cy2M+x7cMF4FKXHbs0CloUFDTRHRboFhw5YfVk=
	// Endpoint = 198.18.0.2:51820
	// AllowedIPs = fd00:1::1:2/128, fd00:1::1:100/128
	// PersistentKeepalive = 25
	// drift: []
}

// A status as `keel-vip inspect` prints it: one line per VIP.
func ExampleStatus_InspectLine() {
	s := keelvip.Status{VIP: "fd00:1::1:100", Role: "replica", Epoch: 4, Holder: "b", Fenced: true, RoutedTo: "b"}
	fmt.Println(s.InspectLine())
	// Output: fd00:1::1:100 role=replica epoch=4 holder=b fenced=yes carried=no routed-to=b
}
