package keelvip_test

import (
	"os"
	"testing"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
)

func TestMain(m *testing.M) {
	captureChildInput()    // what the helper hands its children, for the tests to check
	keelvip.DispatchExec() // the controller and listener the helper starts
	registerChildren()     // netns children (tend, etcd) on Linux
	os.Exit(m.Run())
}
