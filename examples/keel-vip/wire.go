package keelvip

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/internal/jsonx"
)

// The private sockets between the root helper, the controller and the
// members' listener carry HTTP/1.1 with JSON bodies. Paths:
//
//	helper.sock   (served by the helper, for the controller)
//	  POST /carrier          {"op":"carry"|"drop"|"route","vip","holder","claim","until_boot_ns"}
//	members.sock  (served by the helper, for the listener)
//	  POST /v1/vip           the members' channel request, X-Keel-From: sender
//	control.sock  (served by the controller, for the helper)
//	  POST /v1/vip           a request the helper verified, X-Keel-From: sender
//	  GET  /status           claim.Status as JSON
//	  POST /promote          {"old_primary_gone": bool}
//	admin.sock    (served by the helper, root only, for the CLI)
//	  GET  /status, POST /promote
const (
	fromHeader     = "X-Keel-From"
	carrierPath    = "/carrier"
	statusPath     = "/status"
	promotePath    = "/promote"
	reloadPath     = "/reload"
	maxPrivateBody = 64 << 10
)

type carrierRequest struct {
	Op     string `json:"op"`
	VIP    string `json:"vip"`
	Holder string `json:"holder,omitempty"`
	Claim  string `json:"claim,omitempty"`
	// UntilBootNs, on a carry: the CLOCK_BOOTTIME instant (ns) by which
	// the address must be gone (claim.LeasedCarrier); 0: forever.
	UntilBootNs int64 `json:"until_boot_ns,omitempty"`
}

type promoteRequest struct {
	OldPrimaryGone bool `json:"old_primary_gone"`
}

// PromoteReply is what promote answers.
type PromoteReply struct {
	Epoch        uint64 `json:"epoch"`
	Holder       string `json:"holder"`
	ByController bool   `json:"by_controller,omitempty"`
	AlreadyHeld  bool   `json:"already_held,omitempty"`
	Taken        int    `json:"taken"`
	Answered     int    `json:"answered"`
	Error        string `json:"error,omitempty"`
	Code         string `json:"code,omitempty"`
}

type errorReply struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}

// refusalSentinels lists every refusal the members' channel knows, so a
// code that crossed a private socket maps back to its sentinel.
var refusalSentinels = []error{
	claim.ErrMalformed, claim.ErrVersion, claim.ErrBadSignature, claim.ErrTooLarge,
	claim.ErrUnknownNode, claim.ErrUntrustedKey, claim.ErrWrongMesh, claim.ErrWrongSender,
	claim.ErrStale, claim.ErrEpochJump, claim.ErrPairMismatch, claim.ErrPairChanged,
	claim.ErrPairSignatures, claim.ErrNotPairMember, claim.ErrNotHolder, claim.ErrFenced,
	claim.ErrVIPIsMember, claim.ErrVIPOutsideRegion, claim.ErrVIPOutsidePrefix, claim.ErrUnknownVIP,
}

func sentinelOf(code string) error {
	for _, s := range refusalSentinels {
		if c, ok := claim.RefusalCode(s); ok && c == code {
			return s
		}
	}
	return nil
}

func writeErr(w http.ResponseWriter, err error) {
	code, ok := claim.RefusalCode(err)
	status := http.StatusServiceUnavailable
	if ok {
		status = http.StatusConflict
	}
	jsonx.Write(w, status, errorReply{Error: err.Error(), Code: code})
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, err := jsonx.ReadBody(w, r, limit)
	if err != nil {
		jsonx.Write(w, http.StatusRequestEntityTooLarge, errorReply{Error: fmt.Sprintf("%v: body over %d bytes", claim.ErrTooLarge, limit), Code: "too-large"})
		return nil, false
	}
	return b, true
}

func decodeStrict(b []byte, v any) error {
	if err := jsonx.Decode(b, v); err != nil {
		return fmt.Errorf("%w: %v", claim.ErrMalformed, err)
	}
	return nil
}

// unixHTTP returns an HTTP client whose every connection goes to the unix
// socket at path and is checked with check (SO_PEERCRED) before use.
func unixHTTP(path string, check func(net.Conn) error, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, err
			}
			if check != nil {
				if err := check(c); err != nil {
					c.Close()
					return nil, err
				}
			}
			return c, nil
		},
		MaxIdleConns: 4, IdleConnTimeout: 30 * time.Second, DisableCompression: true,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// callJSON posts (or gets, with a nil in) JSON to url over hc and decodes
// the answer into out. A 409 is returned as a *claim.RefusalError that
// matches its sentinel.
func callJSON(ctx context.Context, hc *http.Client, method, url string, in, out any, hdr map[string]string) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPrivateBody+1))
	if err != nil {
		return err
	}
	if len(data) > maxPrivateBody {
		return fmt.Errorf("%w: answer over %d bytes", claim.ErrTooLarge, maxPrivateBody)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorReply
		_ = json.Unmarshal(data, &e)
		if resp.StatusCode == http.StatusConflict {
			return &claim.RefusalError{Code: e.Code, Reason: e.Error, Err: sentinelOf(e.Code)}
		}
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return &callError{url: url, status: resp.StatusCode, msg: e.Error}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// callError is an answer of callJSON's other than 200 and 409.
type callError struct {
	url    string
	status int
	msg    string
}

func (e *callError) Error() string {
	return fmt.Sprintf("keelvip: %s: status %d: %s", e.url, e.status, e.msg)
}

func b64Claim(c *claim.Claim) string {
	if c == nil {
		return ""
	}
	return base64.StdEncoding.EncodeToString(c.Encode())
}

func parseB64Claim(s string) (*claim.Claim, error) {
	if s == "" {
		return nil, fmt.Errorf("%w: no claim", claim.ErrMalformed)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", claim.ErrMalformed, err)
	}
	return claim.ParseClaim(raw)
}

func parseOptAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: %v", claim.ErrMalformed, err)
	}
	return a, nil
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func decodeB64(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: base64: %v", claim.ErrMalformed, err)
	}
	return b, nil
}

// controlStatus is the controller's /status answer.
type controlStatus struct {
	Role         string `json:"role"`
	Epoch        uint64 `json:"epoch"`
	Holder       string `json:"holder"`
	Fenced       bool   `json:"fenced"`
	Released     bool   `json:"released"`
	Lease        string `json:"lease"`
	RenewalAgeMs int64  `json:"renewal_age_ms"`
	Carried      bool   `json:"carried"`
	RoutedTo     string `json:"routed_to"`
	// EtcdCert is the etcd client certificate in use; nil without one.
	EtcdCert *CertStatus `json:"etcd_cert,omitempty"`
	// Check is the service check's state; nil without one.
	Check *CheckReport `json:"check,omitempty"`
}

// CertStatus is the etcd client certificate in use, as status shows it.
type CertStatus struct {
	Subject  string `json:"subject"`
	NotAfter string `json:"not_after"` // RFC 3339, UTC
	// State is ok, expiring (within 14 days) or expired.
	State string `json:"state"`
}
