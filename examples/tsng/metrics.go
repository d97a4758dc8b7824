package tsng

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipkit/vipkit/vip"
	"github.com/vipkit/vipkit/vip/vipmetrics"
)

// metricsHandler serves the agent's Prometheus metrics: the engines'
// observations through vipmetrics (names prefixed tsng_), and the control
// channels' counters.
func (d *Daemon) metricsHandler() http.Handler {
	return promhttp.HandlerFor(d.metricsRegistry(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

func (d *Daemon) metricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(vipmetrics.New(vipmetrics.Options{Namespace: "tsng", Statuses: d.statuses}), controlCollector{d})
	return reg
}

// nameOr is a backend's node as tsng prints it: its name, or its id's
// first 12 hex digits.
func nameOr(b vip.BackendRef) string { return vipmetrics.BackendName(b) }

// statuses returns the observation of every running network.
func (d *Daemon) statuses() []vip.Status {
	var out []vip.Status
	for _, n := range d.nets {
		if eng := n.Engine(); eng != nil {
			out = append(out, eng.Status())
		}
	}
	return out
}

var (
	controlFrames = prometheus.NewDesc("tsng_control_frames_total",
		"Control channel frames, by direction (sent, received).", []string{"network", "direction"}, nil)
	controlDropped = prometheus.NewDesc("tsng_control_dropped_total",
		"Control frames dropped on send (full queue, no connection); the periodic rotation repairs them.", []string{"network"}, nil)
	controlConns = prometheus.NewDesc("tsng_control_connections_total",
		"Control connections, in and out, by authentication: key (the key handshake), legacy (without it), refused (for want of it; also in tsng_control_refused_total).", []string{"network", "auth"}, nil)
	controlRefused = prometheus.NewDesc("tsng_control_refused_total",
		"Control connections and frames refused: non-members, a member's connections over the limit, frames over the size limit or past the frame timeout.", []string{"network"}, nil)
)

// controlCollector exports each running network's ControlStats.
type controlCollector struct{ d *Daemon }

// Describe implements prometheus.Collector.
func (c controlCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- controlFrames
	ch <- controlDropped
	ch <- controlConns
	ch <- controlRefused
}

// Collect implements prometheus.Collector.
func (c controlCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.d.nets {
		n.mu.Lock()
		ctl := n.control
		n.mu.Unlock()
		if ctl == nil {
			continue
		}
		s := ctl.Stats()
		ch <- prometheus.MustNewConstMetric(controlFrames, prometheus.CounterValue, float64(s.Sent), n.cfg.Name, "sent")
		ch <- prometheus.MustNewConstMetric(controlFrames, prometheus.CounterValue, float64(s.Received), n.cfg.Name, "received")
		ch <- prometheus.MustNewConstMetric(controlDropped, prometheus.CounterValue, float64(s.Dropped), n.cfg.Name)
		ch <- prometheus.MustNewConstMetric(controlRefused, prometheus.CounterValue, float64(s.Refused), n.cfg.Name)
		ch <- prometheus.MustNewConstMetric(controlConns, prometheus.CounterValue, float64(s.Authenticated), n.cfg.Name, "key")
		ch <- prometheus.MustNewConstMetric(controlConns, prometheus.CounterValue, float64(s.Legacy), n.cfg.Name, "legacy")
		ch <- prometheus.MustNewConstMetric(controlConns, prometheus.CounterValue, float64(s.AuthRefused), n.cfg.Name, "refused")
	}
}
