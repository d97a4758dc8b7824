package etcdkv_test

import (
	"fmt"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/etcdkv"
)

// A node that carries a VIP wraps its KV in a QuorumKV, so that a renewal
// its own etcd member answers while cut off from the majority does not
// count.
func ExampleQuorumKV() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://[fd7a::1:1]:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	keys := claim.KeysFor("mesh", netip.MustParseAddr("fd7a::1:100"))
	kv := &etcdkv.QuorumKV{KV: etcdkv.New(cli), Key: keys.Epoch}
	fmt.Println("renewals confirmed by a read of", kv.Key)
	// The controller then takes claim.Config{KV: kv, ...}.
	// Output: renewals confirmed by a read of /keel/mesh/vip/fd7a::1:100/epoch
}
