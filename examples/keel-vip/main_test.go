package keelvip_test

import (
	"os"
	"testing"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

func TestMain(m *testing.M) {
	keelvip.DispatchExec() // the controller and listener the helper starts
	registerChildren()     // netns children (tend, etcd) on Linux
	os.Exit(m.Run())
}
