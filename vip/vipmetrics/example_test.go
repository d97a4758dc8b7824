package vipmetrics_test

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipkit/vipkit/vip"
	"github.com/vipkit/vipkit/vip/vipmetrics"
)

// An importer registers the engine's metrics in its own registry; with a
// real engine, Statuses returns []vip.Status{engine.Status()}.
func ExampleNew() {
	statuses := func() []vip.Status {
		return []vip.Status{{Network: "home", Flow: vip.FlowStatus{Capacity: 4096, Active: 2}}}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(vipmetrics.New(vipmetrics.Options{Namespace: "myapp", Statuses: statuses}))
	// Serve it with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP myapp_flow_bindings NAT bindings by state.
# TYPE myapp_flow_bindings gauge
myapp_flow_bindings{network="home",state="active"} 2
myapp_flow_bindings{network="home",state="quarantined"} 0
`), "myapp_flow_bindings")
	fmt.Println(err)
	// Output: <nil>
}
