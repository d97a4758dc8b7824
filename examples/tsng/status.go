package tsng

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/vipkit/vipkit/vip"
)

// Sample is one `tsng vip status --watch --json` line: the status at a
// time, and the per-second rates of the cumulative packet and byte
// counters since the previous sample.
//
// Rates are keyed by what they count, never by position, so a listener or
// backend that comes or goes does not shift the others: "totals.bytes_out"
// for the VIP, "udp/53#GEN.bytes_out" for a listener of generation GEN,
// "udp/53#GEN/NODE:PORT.bytes_out" for a backend (NODE is the node id in
// hex), draining backends included. A counter seen for the first time gets
// its first rate from the next sample. When the counters restarted since
// the previous sample (CountersSince changed, or any counter fell: the
// agent or the network restarted), Reset is set and the sample has no
// rates: it is the new baseline. Rates are therefore never negative.
type Sample struct {
	Time    time.Time `json:"time"`
	Network string    `json:"network"`
	Service string    `json:"service"`
	// CountersSince is when the agent's counters for the network started
	// (zero when the agent does not say).
	CountersSince time.Time          `json:"counters_since,omitzero"`
	Reset         bool               `json:"counters_reset,omitempty"`
	Status        any                `json:"status"`
	Rates         map[string]float64 `json:"rates,omitempty"`
}

// counterKey is a rate's key: see Sample.
func listenerKey(l vip.ListenerStatus) string {
	return l.Listener + "#" + strconv.FormatUint(l.Generation, 10)
}

func backendKey(l vip.ListenerStatus, b vip.BackendStatus) string {
	return listenerKey(l) + "/" + b.Node.String() + ":" + strconv.Itoa(int(b.Port))
}

func addTraffic(out map[string]float64, prefix string, t vip.Traffic) {
	out[prefix+".packets_out"] = float64(t.PacketsOut)
	out[prefix+".bytes_out"] = float64(t.BytesOut)
	out[prefix+".packets_in"] = float64(t.PacketsIn)
	out[prefix+".bytes_in"] = float64(t.BytesIn)
}

// counters returns a service status's cumulative packet and byte
// counters by key (see Sample); nil when there is no observation.
func counters(status any) map[string]float64 {
	st, ok := decodeServiceStatus(status)
	if !ok {
		return nil
	}
	out := map[string]float64{}
	addTraffic(out, "totals", st.Totals.Traffic)
	for _, l := range st.Listeners {
		addTraffic(out, listenerKey(l), l.Traffic)
		for _, b := range l.Backends {
			addTraffic(out, backendKey(l, b), b.Traffic)
		}
		for _, b := range l.DrainingBackends {
			addTraffic(out, backendKey(l, b), b.Traffic)
		}
	}
	return out
}

// decodeServiceStatus reads the status of a ServiceDoc as it arrived
// (decoded into any).
func decodeServiceStatus(status any) (vip.ServiceStatus, bool) {
	var st vip.ServiceStatus
	if status == nil {
		return st, false
	}
	b, err := json.Marshal(status)
	if err != nil || json.Unmarshal(b, &st) != nil {
		return st, false
	}
	return st, true
}

// rttCurrent reports whether b's RTT is worth showing: it is measured and
// the backend is eligible, or drained (out of rotation on purpose) over a
// path that answers. Any other backend has failed or is excluded, and its
// RTT is that of its last probe answer, however old.
func rttCurrent(b vip.BackendStatus) bool {
	return b.RTTKnown && (b.Eligible || b.Drain && b.PathReason == "ok")
}

// withoutFailedRTT is st as the local API serves it: a backend whose RTT
// is not current (rttCurrent) has rtt_known false and no rtt_ms, and keeps
// its sample_age_ms, the age of its last probe answer. The engine's own
// Status (and the metrics) keep the prober's view.
func withoutFailedRTT(st vip.ServiceStatus) vip.ServiceStatus {
	fix := func(bs []vip.BackendStatus) []vip.BackendStatus {
		if bs == nil {
			return nil
		}
		out := slices.Clone(bs)
		for i := range out {
			if !rttCurrent(out[i]) {
				out[i].RTTKnown, out[i].RTTMillis = false, 0
			}
		}
		return out
	}
	st.Listeners = slices.Clone(st.Listeners)
	for i := range st.Listeners {
		l := &st.Listeners[i]
		l.Backends, l.DrainingBackends = fix(l.Backends), fix(l.DrainingBackends)
	}
	return st
}

// sampleAge formats a backend's sample age (milliseconds, negative when
// it has none) for the status table: tenths of a second under a minute.
func sampleAge(ms float64) string {
	if ms < 0 {
		return "-"
	}
	d := time.Duration(ms * float64(time.Millisecond))
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

// counterSample is what the rates of the next sample are derived from.
type counterSample struct {
	at    time.Time
	since time.Time
	c     map[string]float64
}

// rates derives per-second rates from two samples of cumulative counters.
// Counters restart only with the agent's engine; a sample taken across a
// restart (another CountersSince, or any counter lower than before)
// becomes the new baseline: reset is true and there are no rates.
// Counters present in only one of the samples get no rate.
func rates(prev, cur counterSample) (out map[string]float64, reset bool) {
	if prev.c == nil || cur.c == nil {
		return nil, false
	}
	if !prev.since.Equal(cur.since) {
		return nil, true
	}
	for k, v := range cur.c {
		if p, ok := prev.c[k]; ok && v < p {
			return nil, true
		}
	}
	dt := cur.at.Sub(prev.at).Seconds()
	if dt <= 0 {
		return nil, false
	}
	out = map[string]float64{}
	for k, v := range cur.c {
		if p, ok := prev.c[k]; ok {
			out[k] = (v - p) / dt
		}
	}
	return out, false
}

func runStatus(ctx context.Context, c *cliCtx, o *opts, a []string) error {
	sleep := c.env.Sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	var prev counterSample
	for n := 0; ; n++ {
		var raw map[string]any
		if err := c.client.Do(ctx, http.MethodGet, vipPath(a[0], a[1]), nil, &raw); err != nil {
			if !o.watch || n == 0 || !errors.Is(err, ErrAgentUnreachable) {
				return err
			}
			// The agent is restarting: keep watching; its next sample is
			// a new baseline.
			fmt.Fprintln(c.env.Stderr, "tsng:", err, "(retrying)")
			prev = counterSample{}
			if err := sleep(ctx, o.interval); err != nil {
				return nil
			}
			n--
			continue
		}
		cur := counterSample{at: time.Now(), c: counters(raw["status"])}
		if v, ok := raw["counters_since"].(string); ok {
			cur.since, _ = time.Parse(time.RFC3339Nano, v)
		}
		s := Sample{Time: cur.at, Network: fmt.Sprint(raw["network"]), Service: fmt.Sprint(raw["name"]), Status: raw["status"], CountersSince: cur.since}
		s.Rates, s.Reset = rates(prev, cur)
		if c.json {
			if err := json.NewEncoder(c.env.Stdout).Encode(s); err != nil {
				return err
			}
		} else {
			printStatus(c, raw, s)
		}
		prev = cur
		if !o.watch || (o.count > 0 && n+1 >= o.count) {
			return nil
		}
		if err := sleep(ctx, o.interval); err != nil {
			return nil // interrupted: a clean end of a watch
		}
	}
}

func printStatus(c *cliCtx, raw map[string]any, s Sample) { printStatusTable(c, raw, s) }
