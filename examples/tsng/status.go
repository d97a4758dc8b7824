package tsng

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Sample is one `tsng vip status --watch --json` line: the status at a
// time, and the per-second rates of every cumulative counter (packets and
// bytes) since the previous sample.
type Sample struct {
	Time    time.Time          `json:"time"`
	Network string             `json:"network"`
	Service string             `json:"service"`
	Status  any                `json:"status"`
	Rates   map[string]float64 `json:"rates,omitempty"`
}

// counters flattens the numeric leaves of a JSON document whose path names
// a packet or byte counter ("listeners.0.backends.1.to_backend.bytes").
func counters(v any, prefix string, out map[string]float64) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			counters(e, join(prefix, k), out)
		}
	case []any:
		for i, e := range x {
			counters(e, join(prefix, fmt.Sprint(i)), out)
		}
	case float64:
		low := strings.ToLower(prefix)
		if strings.Contains(low, "packets") || strings.Contains(low, "bytes") {
			out[prefix] = x
		}
	}
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

// rates derives per-second rates from two counter sets; a counter that went
// down (an agent restart resets counters) restarts from zero.
func rates(prev, cur map[string]float64, dt time.Duration) map[string]float64 {
	if dt <= 0 {
		return nil
	}
	out := map[string]float64{}
	for k, v := range cur {
		d := v - prev[k]
		if d < 0 {
			d = v
		}
		if d != 0 {
			out[k] = d / dt.Seconds()
		}
	}
	return out
}

func runStatus(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	sleep := c.env.Sleep
	if sleep == nil {
		sleep = func(ctx context.Context, d time.Duration) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	var prev map[string]float64
	var prevT time.Time
	for n := 0; ; n++ {
		var raw map[string]any
		if err := c.client.Do(ctx, http.MethodGet, vipPath(a[0], a[1]), nil, &raw); err != nil {
			return err
		}
		now := time.Now()
		cur := map[string]float64{}
		counters(raw["status"], "", cur)
		s := Sample{Time: now, Network: fmt.Sprint(raw["network"]), Service: fmt.Sprint(raw["name"]), Status: raw["status"]}
		if prev != nil {
			s.Rates = rates(prev, cur, now.Sub(prevT))
		}
		if c.json {
			if err := json.NewEncoder(c.env.Stdout).Encode(s); err != nil {
				return err
			}
		} else {
			printStatus(c, raw, s)
		}
		prev, prevT = cur, now
		if !o.watch || (o.count > 0 && n+1 >= o.count) {
			return nil
		}
		if err := sleep(ctx, o.interval); err != nil {
			return nil // interrupted: a clean end of a watch
		}
	}
}

func printStatus(c *cliCtx, raw map[string]any, s Sample) {
	w := c.env.Stdout
	fmt.Fprintf(w, "%s  %s.%s  revision %v\n", s.Time.Format(time.TimeOnly), printable(s.Service), printable(s.Network), raw["revision"])
	if s.Status == nil {
		fmt.Fprintln(w, "  no observation (network down or service not routed)")
		return
	}
	b, _ := json.MarshalIndent(s.Status, "  ", "  ")
	fmt.Fprintf(w, "  %s\n", b)
	if len(s.Rates) > 0 {
		keys := make([]string, 0, len(s.Rates))
		for k := range s.Rates {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  RATE\tPER SECOND")
		for _, k := range keys {
			fmt.Fprintf(tw, "  %s\t%.1f\n", k, s.Rates[k])
		}
		tw.Flush()
	}
}
