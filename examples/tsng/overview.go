package tsng

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/vipkit/vipkit/vip"
)

// The health of a VIP in `tsng status`, from this node's observation.
const (
	HealthOK         = "ok"          // every configured backend is eligible
	HealthDegraded   = "degraded"    // some are not (failed, drained, departed)
	HealthDown       = "down"        // none is
	HealthNoBackends = "no backends" // no listener has a backend: it takes no traffic
	HealthUnknown    = "unknown"     // no observation: network down, or none yet
)

// NetworkOverview is one network in `tsng status --json` (one object per
// line): whether it is up on this node, its members, and its VIPs.
type NetworkOverview struct {
	Name    string        `json:"name"`
	ID      string        `json:"id"`
	Up      bool          `json:"up"`
	Members []NodeDoc     `json:"members"`
	VIPs    []VIPOverview `json:"vips"`
	// AddrCollisions describes each member whose address is a VIP's
	// stored reservation.
	AddrCollisions []string `json:"addr_collisions,omitempty"`
}

// VIPOverview is one VIP in a NetworkOverview: its address and state, and
// how many of its configured backends this node finds eligible.
type VIPOverview struct {
	Name      string        `json:"name"`
	ID        vip.ServiceID `json:"id"`
	Addr      netip.Addr    `json:"addr"`
	State     string        `json:"state"` // as `vip list` prints it
	Listeners int           `json:"listeners"`
	Backends  int           `json:"backends"` // configured, over all listeners
	Eligible  int           `json:"eligible"` // of those, eligible for new flows
	Health    string        `json:"health"`   // one of the Health constants
}

// overviewVIP summarises d. Backends are counted from the configuration,
// eligibility from this node's observation (none while the network is
// down).
func overviewVIP(d ServiceDoc) VIPOverview {
	v := VIPOverview{Name: d.Name, ID: d.ID, Addr: d.Addr, State: docState(d), Listeners: len(d.Listeners)}
	for _, l := range d.Listeners {
		v.Backends += len(l.Backends)
	}
	st, ok := decodeServiceStatus(d.Status)
	switch {
	case v.Backends == 0:
		v.Health = HealthNoBackends
		return v
	case !d.NetworkUp || !ok:
		v.Health = HealthUnknown
		return v
	}
	for _, l := range st.Listeners {
		for _, b := range l.Backends {
			if b.Eligible {
				v.Eligible++
			}
		}
	}
	switch {
	case len(st.Listeners) == 0:
		v.Health = HealthUnknown
	case v.Eligible == 0:
		v.Health = HealthDown
	case v.Eligible >= v.Backends:
		v.Health = HealthOK
	default:
		v.Health = HealthDegraded
	}
	return v
}

// overview asks the agent for every network's summary, members and VIPs.
func overview(ctx context.Context, c *cliCtx) ([]NetworkOverview, error) {
	var all []NetworkSummary
	if err := c.client.Do(ctx, http.MethodGet, "/v1/networks", nil, &all); err != nil {
		return nil, err
	}
	out := make([]NetworkOverview, 0, len(all))
	for _, n := range all {
		o := NetworkOverview{Name: n.Name, ID: n.ID, Up: n.Up, AddrCollisions: n.AddrCollisions, VIPs: []VIPOverview{}}
		base := "/v1/networks/" + url.PathEscape(n.ID)
		if err := c.client.Do(ctx, http.MethodGet, base+"/nodes", nil, &o.Members); err != nil {
			return nil, err
		}
		var docs []ServiceDoc
		if err := c.client.Do(ctx, http.MethodGet, base+"/vips", nil, &docs); err != nil {
			return nil, err
		}
		for _, d := range docs {
			o.VIPs = append(o.VIPs, overviewVIP(d))
		}
		slices.SortStableFunc(o.VIPs, func(a, b VIPOverview) int { return strings.Compare(a.Name, b.Name) })
		out = append(out, o)
	}
	return out, nil
}

func runOverview(ctx context.Context, c *cliCtx, _ *opts, _ []string) error {
	nets, err := overview(ctx, c)
	if err != nil {
		return err
	}
	w := c.env.Stdout
	if c.json {
		enc := json.NewEncoder(w)
		for _, n := range nets {
			if err := enc.Encode(n); err != nil {
				return err
			}
		}
		return nil
	}
	if len(nets) == 0 {
		fmt.Fprintln(w, "no networks")
	}
	for i, n := range nets {
		if i > 0 {
			fmt.Fprintln(w)
		}
		st := "down"
		if n.Up {
			st = "up"
		}
		fmt.Fprintf(w, "network %s (%s): %s, %s, %s\n", printable(n.Name), n.ID[:min(12, len(n.ID))], st,
			plural(len(n.Members), "member"), plural(len(n.VIPs), "VIP"))
		var ms []string
		for _, m := range n.Members {
			ms = append(ms, printable(m.Name)+" "+m.Addr)
		}
		if len(ms) > 0 {
			fmt.Fprintln(w, wrapLine("  members: "+strings.Join(ms, ", "), helpWrap, "    "))
		}
		for _, msg := range n.AddrCollisions {
			fmt.Fprintln(w, wrapLine("  warning: "+printable(msg), helpWrap, "    "))
		}
		if len(n.VIPs) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  VIP\tADDRESS\tSTATE\tHEALTH")
		for _, v := range n.VIPs {
			h := v.Health
			if v.Health == HealthOK || v.Health == HealthDegraded || v.Health == HealthDown {
				h += fmt.Sprintf(" (%d/%d eligible)", v.Eligible, v.Backends)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", printable(v.Name), v.Addr, v.State, h)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// plural is "1 member" or "3 members".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// overviewCommand is `tsng status`.
func overviewCommand() *command {
	return &command{name: "status", args: "[--json]", max: 0, flags: jsonFlag, run: runOverview,
		short: "Summarise every network: up or down, its members, its VIPs and their health.",
		long: "A VIP's health is this node's view of its backends: ok (every backend eligible), " +
			"degraded (some are not: failed, drained or departed), down (none is), " +
			"no backends, or unknown (the network is down, or nothing observed yet). " +
			"`tsng vip status NET VIP` shows one VIP's backends. With --json, one JSON object per network."}
}
