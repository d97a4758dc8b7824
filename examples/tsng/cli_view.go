package tsng

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/vip"
)

// docState is a service's state as list and show print it: a stopped
// network's VIPs route nothing on this node, whatever the configuration.
func docState(d ServiceDoc) string {
	st := state(d.ServiceView)
	if !d.NetworkUp && d.ServiceView.Err == "" {
		st = "network down"
	}
	if c := d.AddrCollision; c != nil {
		st += "; address collision: " + c.String()
	}
	return st
}

// nodeName is a backend node's name, or its id's first 12 hex digits.
func (d ServiceDoc) nodeName(id vip.NodeID) string {
	if n := d.NodeNames[id.String()]; n != "" {
		return n
	}
	return id.String()[:12]
}

// isTerminal reports whether r is a terminal.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// errNotRemoved: the user answered no.
var errNotRemoved = errors.New("tsng: not removed")

// confirmRemove asks on a terminal before a VIP is deleted for good;
// without a terminal there is no one to ask, and it refuses (the caller
// skips it for --yes).
func confirmRemove(ctx context.Context, c *cliCtx, network, sel string) error {
	if !isTerminal(c.env.Stdin) {
		return usageError{fmt.Sprintf("vip remove %s %s: stdin is not a terminal, so there is no one to confirm a permanent removal; give --yes to remove it without asking", network, sel)}
	}
	var d ServiceDoc
	if err := c.client.Do(ctx, http.MethodGet, vipPath(network, sel), nil, &d); err != nil {
		return err
	}
	fmt.Fprintf(c.env.Stderr, "Remove %s.%s (%s) permanently? Its id becomes a signed tombstone; creating the name again gives a new VIP. [y/N] ", printable(d.Name), printable(d.Network), d.ID)
	var line []byte
	b := make([]byte, 1)
	for len(line) < 64 {
		n, err := c.env.Stdin.Read(b)
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
		}
		if err != nil {
			break
		}
	}
	switch string(line) {
	case "y", "Y", "yes", "YES", "Yes":
		return nil
	}
	return fmt.Errorf("%w: %s.%s", errNotRemoved, d.Name, d.Network)
}

// printStatusTable prints a status sample: per listener a row of its own
// counters (BACKEND -) and one per backend with its health, RTT and
// sample age, bindings, counters, drops and UDP failovers; the VIP's
// totals and its drops by reason; the departed backends' full node ids;
// and the rates since the previous sample when watching.
func printStatusTable(c *cliCtx, raw map[string]any, s Sample) {
	w := c.env.Stdout
	fmt.Fprintf(w, "%s  %s.%s  revision %v\n", s.Time.Format(time.TimeOnly), printable(s.Service), printable(s.Network), raw["revision"])
	if s.Status == nil {
		fmt.Fprintln(w, "  no observation (network down or service not routed)")
		return
	}
	st, ok := decodeServiceStatus(s.Status)
	if !ok {
		fmt.Fprintln(w, "  (unreadable observation; see --json)")
		return
	}
	if c := st.AddrCollision; c != nil {
		fmt.Fprintln(w, "  address collision:", c.String())
	}
	if s.Reset {
		fmt.Fprintln(w, "  counters restarted (the agent or the network restarted): rates resume from the next sample")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	hdr := "LISTENER\tBACKEND\tHEALTH\tRTT\tAGE\tBINDINGS\tPKTS OUT/IN\tBYTES OUT/IN\tDROPS\tFAILOVERS\tNEXT"
	if s.Rates != nil {
		hdr += "\tBYTES/S OUT/IN"
	}
	fmt.Fprintln(tw, hdr)
	rate := func(key string) string {
		out, okOut := s.Rates[key+".bytes_out"]
		in, okIn := s.Rates[key+".bytes_in"]
		if !okOut || !okIn {
			return "\t-" // new since the previous sample
		}
		return fmt.Sprintf("\t%.0f/%.0f", out, in)
	}
	var departed []string
	for _, l := range st.Listeners {
		next := "-"
		if l.Next != nil {
			next = fmt.Sprintf("%s:%d", nameOr(*l.Next), l.Next.Port)
		}
		// UDP bindings fail over; TCP ones never do.
		failovers := func(n uint64) string {
			if !strings.HasPrefix(l.Listener, "udp/") {
				return "-"
			}
			return strconv.FormatUint(n, 10)
		}
		fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%d\t%d/%d\t%d/%d\t%d\t%s\t%s", l.Listener, l.Active, l.PacketsOut, l.PacketsIn, l.BytesOut, l.BytesIn,
			dropCount(l.Drops), failovers(l.Failovers), next)
		if s.Rates != nil {
			fmt.Fprint(tw, rate(listenerKey(l)))
		}
		fmt.Fprintln(tw)
		rows := append(append([]vip.BackendStatus{}, l.Backends...), l.DrainingBackends...)
		for _, b := range rows {
			rtt := "-"
			if rttCurrent(b) {
				rtt = fmt.Sprintf("%.2fms", b.RTTMillis)
			}
			reason := b.Reason
			if b.Draining {
				reason += " (draining)"
			}
			name := nameOr(b.BackendRef)
			if b.Departed {
				// By the id that selects it whatever this agent knew; the
				// full id and the former name follow the table.
				name = b.Node.String()[:12]
				d := fmt.Sprintf("  %s %s:%d: departed node %s", l.Listener, name, b.Port, b.Node)
				if b.NodeName != "" {
					d += ", formerly " + printable(b.NodeName)
				} else {
					d += " (no former name known)"
				}
				departed = append(departed, d)
			}
			fmt.Fprintf(tw, "%s\t%s:%d\t%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%d\t%s\t%s", l.Listener, name, b.Port, reason, rtt,
				sampleAge(b.SampleAgeMillis), b.Active, b.PacketsOut, b.PacketsIn, b.BytesOut, b.BytesIn, dropCount(b.Drops), failovers(b.Failovers), next)
			if s.Rates != nil {
				fmt.Fprint(tw, rate(backendKey(l, b)))
			}
			fmt.Fprintln(tw)
		}
	}
	t := st.Totals
	fmt.Fprintf(tw, "total\t\t\t\t\t\t%d/%d\t%d/%d\t%d\t%d\t", t.PacketsOut, t.PacketsIn, t.BytesOut, t.BytesIn, dropCount(t.Drops), t.Failovers)
	if s.Rates != nil {
		fmt.Fprint(tw, rate("totals"))
	}
	fmt.Fprintln(tw)
	tw.Flush()
	if len(t.Drops) > 0 {
		fmt.Fprintln(w, "  drops:", dropReasons(t.Drops))
	}
	for _, d := range departed {
		fmt.Fprintln(w, d)
	}
}

// dropCount is the sum of a drop counter map.
func dropCount(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// dropReasons lists drops by reason, in reason order: "capacity 4,
// no-backend 5".
func dropReasons(m map[string]uint64) string {
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", printable(r), m[r]))
	}
	return strings.Join(parts, ", ")
}
