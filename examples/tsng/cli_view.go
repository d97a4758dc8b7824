package tsng

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipkit/vipkit/vip"
)

// docState is a service's state as list and show print it: a stopped
// network's VIPs route nothing on this node, whatever the configuration.
func docState(d ServiceDoc) string {
	if !d.NetworkUp && d.ServiceView.Err == "" {
		return "network down"
	}
	return state(d.ServiceView)
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
// without a terminal (scripts) it does not ask.
func confirmRemove(ctx context.Context, c *cliCtx, network, sel string) error {
	if !isTerminal(c.env.Stdin) {
		return nil
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

// printStatusTable prints a status sample as the demo does: one row per
// backend with its health, RTT, bindings and counters, and the rates
// since the previous sample when watching.
func printStatusTable(c *cliCtx, raw map[string]any, s Sample) {
	w := c.env.Stdout
	fmt.Fprintf(w, "%s  %s.%s  revision %v\n", s.Time.Format(time.TimeOnly), printable(s.Service), printable(s.Network), raw["revision"])
	if s.Status == nil {
		fmt.Fprintln(w, "  no observation (network down or service not routed)")
		return
	}
	var st vip.ServiceStatus
	if b, err := json.Marshal(s.Status); err != nil || json.Unmarshal(b, &st) != nil {
		fmt.Fprintln(w, "  (unreadable observation; see --json)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	hdr := "LISTENER\tBACKEND\tHEALTH\tRTT\tBINDINGS\tPKTS OUT/IN\tBYTES OUT/IN\tNEXT"
	if s.Rates != nil {
		hdr += "\tBYTES/S OUT/IN"
	}
	fmt.Fprintln(tw, hdr)
	for i, l := range st.Listeners {
		next := "-"
		if l.Next != nil {
			next = fmt.Sprintf("%s:%d", nameOr(*l.Next), l.Next.Port)
		}
		if len(l.Backends) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%d\t%d/%d\t%d/%d\t%s\n", l.Listener, l.Active, l.PacketsOut, l.PacketsIn, l.BytesOut, l.BytesIn, next)
		}
		for j, b := range l.Backends {
			rtt := "-"
			if b.RTTKnown {
				rtt = fmt.Sprintf("%.2fms", b.RTTMillis)
			}
			fmt.Fprintf(tw, "%s\t%s:%d\t%s\t%s\t%d\t%d/%d\t%d/%d\t%s", l.Listener, nameOr(b.BackendRef), b.Port, b.Reason, rtt,
				b.Active, b.PacketsOut, b.PacketsIn, b.BytesOut, b.BytesIn, next)
			if s.Rates != nil {
				p := fmt.Sprintf("listeners.%d.backends.%d.", i, j)
				fmt.Fprintf(tw, "\t%.0f/%.0f", s.Rates[p+"bytes_out"], s.Rates[p+"bytes_in"])
			}
			fmt.Fprintln(tw)
		}
	}
	tw.Flush()
}
