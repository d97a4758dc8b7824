package keelvip

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Status is what `keel-vip status` shows for one VIP: the controller's view
// (role, epoch, holder, fenced or released, the lease and its last renewal)
// and the interface's, read back live from the kernel and the device
// (whether it carries the VIP, and which peer it is routed to), with any
// drift of the device from the mesh file (a VIP move is never drift).
type Status struct {
	Mesh     string `json:"mesh"`
	Node     string `json:"node"`
	VIP      string `json:"vip"`
	Role     string `json:"role"` // primary or replica
	Epoch    uint64 `json:"epoch"`
	Holder   string `json:"holder"` // of the newest claim taken; "" when none
	Fenced   bool   `json:"fenced"`
	Released bool   `json:"released"`
	Lease    string `json:"lease"` // etcd lease id in hex; "" when none or no etcd
	// RenewalAgeMs is the age of the last renewal etcd answered, in ms; -1
	// when there was none since the controller started.
	RenewalAgeMs int64    `json:"renewal_age_ms"`
	Etcd         bool     `json:"etcd"`
	Carried      bool     `json:"carried"`   // the interface carries the VIP (live)
	RoutedTo     string   `json:"routed_to"` // peer id the VIP /128 is routed to (live); "" when none
	Drift        []string `json:"drift"`
	// EtcdCert is the etcd client certificate the controller uses; absent
	// without one.
	EtcdCert *CertStatus `json:"etcd_cert,omitempty"`
	// Check is the service check's state; absent without one.
	Check *CheckReport `json:"check,omitempty"`
}

// CheckReport is the service check as status shows it.
type CheckReport struct {
	Kind   string `json:"kind"`   // exec, tcp or http
	Status string `json:"status"` // passing, failing or unknown
	// Fresh is set when the last result is at most MaxResultAge old;
	// AgeMs is its age (-1: none yet).
	Fresh   bool   `json:"fresh"`
	AgeMs   int64  `json:"age_ms"`
	LastErr string `json:"last_error,omitempty"`
	Runs    uint64 `json:"runs"`
	Failed  uint64 `json:"failed"`
	// The holder's hand-over decisions (CheckStats).
	HandOvers CheckStats `json:"handovers"`
}

// WriteText writes s as `keel-vip status` prints it.
func (s Status) WriteText(w io.Writer) error {
	holder, routed, lease := or(s.Holder, "none"), or(s.RoutedTo, "none"), or(s.Lease, "none")
	renew := "none since start"
	if s.RenewalAgeMs >= 0 {
		renew = fmt.Sprintf("%.1f s ago", float64(s.RenewalAgeMs)/1000)
	}
	fence := "no"
	switch {
	case s.Fenced:
		fence = "fenced"
	case s.Released:
		fence = "released"
	}
	drift := "none"
	if len(s.Drift) > 0 {
		drift = strings.Join(s.Drift, "; ")
	}
	_, err := fmt.Fprintf(w, "vip %s (mesh %s, node %s)\n  role:      %s\n  epoch:     %d\n  holder:    %s\n  fenced:    %s\n  lease:     %s (renewed %s)\n  carried:   %v\n  routed to: %s\n  drift:     %s\n",
		s.VIP, s.Mesh, s.Node, s.Role, s.Epoch, holder, fence, lease, renew, yesNo(s.Carried), routed, drift)
	if err == nil && s.EtcdCert != nil {
		_, err = fmt.Fprintf(w, "  etcd cert: %s, valid until %s (%s)\n", s.EtcdCert.Subject, s.EtcdCert.NotAfter, s.EtcdCert.State)
	}
	if c := s.Check; err == nil && c != nil {
		age := "no result yet"
		if c.AgeMs >= 0 {
			age = fmt.Sprintf("%.1f s ago", float64(c.AgeMs)/1000)
			if !c.Fresh {
				age += ", stale"
			}
		}
		_, err = fmt.Fprintf(w, "  check:     %s %s (%s)", c.Kind, c.Status, age)
		if err == nil && c.LastErr != "" {
			_, err = fmt.Fprintf(w, ": %s", c.LastErr)
		}
		h := c.HandOvers
		if err == nil {
			_, err = fmt.Fprintf(w, "\n  handovers: %d accepted, %d refused, %d unanswered, %d deferred\n", h.Accepted, h.Refused, h.Unanswered, h.Deferred)
		}
	}
	return err
}

// WriteJSON writes s as `keel-vip status --json` prints it.
func (s Status) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// InspectLine is s as one line of `keel-vip inspect`: the VIP, role,
// epoch, holder, fenced, carried and routed-to, space separated.
func (s Status) InspectLine() string {
	return fmt.Sprintf("%s role=%s epoch=%d holder=%s fenced=%s carried=%s routed-to=%s",
		s.VIP, s.Role, s.Epoch, or(s.Holder, "-"), yesNo(s.Fenced), yesNo(s.Carried), or(s.RoutedTo, "-"))
}

func or(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
