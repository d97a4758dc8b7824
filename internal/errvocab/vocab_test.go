package errvocab

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/flow"
	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/probe"
	"github.com/vipkit/vipkit/transport"
	"github.com/vipkit/vipkit/transport/netstack"
	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/tunwrap"
	"github.com/vipkit/vipkit/vip"
)

// closedErrors maps each package's closed sentinel to its name; the
// platform files add their own (closedErrorsOS).
var closedErrors = map[string]error{
	"flow.ErrClosed":      flow.ErrClosed,
	"probe.ErrClosed":     probe.ErrClosed,
	"claim.ErrClosed":     claim.ErrClosed,
	"crdt.ErrClosed":      crdt.ErrClosed,
	"hosting.ErrClosed":   hosting.ErrClosed,
	"tunwrap.ErrClosed":   tunwrap.ErrClosed,
	"vip.ErrEngineClosed": vip.ErrEngineClosed,
	"wg.ErrDeviceClosed":  wg.ErrDeviceClosed,
}

// TestClosedMatchesTransport: one errors.Is(err, transport.ErrClosed) (or
// net.ErrClosed) recognises a closed object of any package.
func TestClosedMatchesTransport(t *testing.T) {
	all := map[string]error{}
	for k, v := range closedErrors {
		all[k] = v
	}
	for k, v := range closedErrorsOS {
		all[k] = v
	}
	for name, err := range all {
		if !errors.Is(err, transport.ErrClosed) || !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s (%q) does not match transport.ErrClosed and net.ErrClosed", name, err)
		}
		// A wrapped one too, as the packages return it.
		if w := errors.Join(errors.New("context"), err); !errors.Is(w, transport.ErrClosed) {
			t.Errorf("%s wrapped: does not match transport.ErrClosed", name)
		}
	}
	// wireguard-go stops its TUN goroutines on os.ErrClosed.
	if !errors.Is(tunwrap.ErrClosed, os.ErrClosed) {
		t.Errorf("tunwrap.ErrClosed (%q) does not match os.ErrClosed", tunwrap.ErrClosed)
	}
}

// TestOptionsErrors: each constructor reports bad options with its
// package's ErrInvalidOptions, whose message says "invalid options".
func TestOptionsErrors(t *testing.T) {
	_, crdtErr := crdt.Open(context.Background(), crdt.Config{Limits: crdt.Limits{MaxServices: -1}})
	_, claimErr := claim.NewController(claim.Config{})
	_, probeErr := probe.NewProber(probe.ProberConfig{Interval: -1})
	_, vipErr := vip.NewEngine(vip.EngineOptions{})
	_, registryErr := vip.NewRegistry(vip.RegistryOptions{})
	_, replicatorErr := vip.NewReplicator(vip.ReplicatorOptions{})
	_, dnsErr := vip.NewDNSServer(vip.DNSOptions{})
	_, consumerErr := events.NewConsumer(events.ConsumerOptions{})
	_, relayErr := events.NewRelay(events.RelayOptions{})
	_, projErr := hosting.NewProjection(nil, hosting.ProjectionOptions{})
	_, svcErr := hosting.NewService(hosting.Options{})
	_, flowErr := flow.New(flow.Options{})
	_, netstackErr := netstack.New(netstack.Options{MTU: -1})
	_, wgErr := wg.NewDevice(nil, wg.Config{}, wg.Options{})
	_, apiErr := api.New(api.Options{})
	for _, c := range []struct {
		name     string
		err      error
		sentinel error
		prefix   string
	}{
		{"crdt.Open", crdtErr, crdt.ErrInvalidOptions, "crdt: "},
		{"claim.NewController", claimErr, claim.ErrInvalidOptions, "claim: "},
		{"probe.NewProber", probeErr, probe.ErrInvalidOptions, "probe: "},
		{"vip.NewEngine", vipErr, vip.ErrInvalidOptions, "vip: "},
		{"vip.NewRegistry", registryErr, vip.ErrInvalidOptions, "vip: "},
		{"vip.NewReplicator", replicatorErr, vip.ErrInvalidOptions, "vip: "},
		{"vip.NewDNSServer", dnsErr, vip.ErrInvalidOptions, "vip: "},
		{"events.NewConsumer", consumerErr, events.ErrInvalidOptions, "events: "},
		{"events.NewRelay", relayErr, events.ErrInvalidOptions, "events: "},
		{"hosting.NewProjection", projErr, hosting.ErrInvalidOptions, "hosting: "},
		{"hosting.NewService", svcErr, hosting.ErrInvalidOptions, "hosting: "},
		{"flow.New", flowErr, flow.ErrInvalidOptions, "flow: "},
		{"netstack.New", netstackErr, netstack.ErrInvalidOptions, "netstack: "},
		{"wg.NewDevice", wgErr, wg.ErrInvalidOptions, "wg: "},
		{"api.New", apiErr, api.ErrInvalidOptions, "api: "},
	} {
		if !errors.Is(c.err, c.sentinel) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.sentinel)
			continue
		}
		if want := c.prefix + "invalid options"; c.sentinel.Error() != want || !strings.HasPrefix(c.err.Error(), want) {
			t.Errorf("%s: %q (sentinel %q), want it to start with %q", c.name, c.err, c.sentinel, want)
		}
	}
	// A bad network or domain name is an option and a name: it matches
	// ErrInvalidOptions and, as before, vip.ErrInvalid.
	_, netErr := vip.NewRegistry(vip.RegistryOptions{Replica: &crdt.Replica{}, Nodes: func() []vip.NodeInfo { return nil }, Network: "bad name!"})
	_, domErr := vip.NewDNSServer(vip.DNSOptions{Lookup: func(string) (netip.Addr, bool) { return netip.Addr{}, false }, Domain: "bad name!"})
	for _, err := range []error{netErr, domErr} {
		if !errors.Is(err, vip.ErrInvalidOptions) || !errors.Is(err, vip.ErrInvalid) {
			t.Errorf("bad name: %v, want both ErrInvalidOptions and ErrInvalid", err)
		}
	}
	// hosting's options errors still match ErrSettings, which they were
	// reported as.
	if !errors.Is(projErr, hosting.ErrSettings) || !errors.Is(svcErr, hosting.ErrSettings) {
		t.Errorf("hosting options errors %v, %v do not match ErrSettings", projErr, svcErr)
	}
}

// TestOptionsApartFromInput: bad options and bad input (a service's
// configuration, a share) are different errors.
func TestOptionsApartFromInput(t *testing.T) {
	for _, c := range []struct {
		name           string
		options, input error
	}{
		{"vip", vip.ErrInvalidOptions, vip.ErrInvalid},
		{"hosting", hosting.ErrInvalidOptions, hosting.ErrInvalid},
	} {
		if errors.Is(c.options, c.input) || errors.Is(c.input, c.options) {
			t.Errorf("%s: ErrInvalidOptions and ErrInvalid match each other", c.name)
		}
	}
	if errors.Is(hosting.ErrSettings, hosting.ErrInvalidOptions) {
		t.Error("hosting.ErrSettings matches ErrInvalidOptions: bad settings are not bad options")
	}
	if errors.Is(&vip.ValidationError{}, vip.ErrInvalidOptions) {
		t.Error("a vip.ValidationError matches ErrInvalidOptions")
	}
}
