package claim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/vipkit/vipkit/internal/jsonx"
)

// The members' channel: HTTP POST /v1/vip on each node's overlay address.
// A request is a JSON object:
//
//	{"op": "claim",   "claim":   "<base64 canonical claim>"}
//	{"op": "release", "release": "<base64 canonical release>"}
//	{"op": "epoch",   "vip":     "fd7a::1:2"}
//	{"op": "handover", "vip":    "fd7a::1:2"}
//
// A 200 answer is {"claim": "<base64>"} (the claim held, empty when none).
// A refusal is 409 {"code": "stale", "reason": "claim: stale epoch: …"};
// a malformed request is 400, an oversized one 413, a node that could not
// act 503. The sender is the peer's address as the server sees it (the
// overlay address, since the channel runs over WireGuard).
const (
	// MembersPath is the channel's path.
	MembersPath = "/v1/vip"
	// MaxRequestBody bounds a request body, in bytes.
	MaxRequestBody = 16 << 10
	// MaxResponseBody bounds a response body the client reads, in bytes.
	MaxResponseBody = 16 << 10
	// DefaultMembersPort is the channel's TCP port.
	DefaultMembersPort = 9444
)

// ErrUnknownVIP is returned (409) for a request about a VIP the node does
// not tend.
var ErrUnknownVIP = errors.New("claim: unknown vip")

// refusalCodes maps the wire code of each refusal to its sentinel.
var refusalCodes = map[string]error{
	"malformed":          ErrMalformed,
	"version":            ErrVersion,
	"bad-signature":      ErrBadSignature,
	"too-large":          ErrTooLarge,
	"unknown-node":       ErrUnknownNode,
	"untrusted-key":      ErrUntrustedKey,
	"wrong-mesh":         ErrWrongMesh,
	"wrong-sender":       ErrWrongSender,
	"stale":              ErrStale,
	"epoch-jump":         ErrEpochJump,
	"pair-mismatch":      ErrPairMismatch,
	"pair-changed":       ErrPairChanged,
	"pair-signatures":    ErrPairSignatures,
	"not-pair-member":    ErrNotPairMember,
	"not-holder":         ErrNotHolder,
	"fenced":             ErrFenced,
	"vip-is-member":      ErrVIPIsMember,
	"vip-outside-region": ErrVIPOutsideRegion,
	"vip-outside-prefix": ErrVIPOutsidePrefix,
	"unknown-vip":        ErrUnknownVIP,
	"check-failing":      ErrCheckFailing,
}

// RefusalCode returns the wire code of a refusal error, and false when err
// is not a refusal.
func RefusalCode(err error) (string, bool) {
	for code, s := range refusalCodes {
		if errors.Is(err, s) {
			return code, true
		}
	}
	return "", false
}

// RefusalError is a peer's 409: it refused a claim or release, with a
// reason. It matches its sentinel (ErrStale, …) with errors.Is.
type RefusalError struct {
	Code   string
	Reason string
	Err    error // the sentinel of Code (nil for a code this version does not know)
}

func (e *RefusalError) Error() string { return "claim: refused: " + e.Reason }

// Unwrap returns the refusal's sentinel.
func (e *RefusalError) Unwrap() error { return e.Err }

type wireRequest struct {
	Op      string `json:"op"`
	Claim   string `json:"claim,omitempty"`
	Release string `json:"release,omitempty"`
	VIP     string `json:"vip,omitempty"`
}

type wireAnswer struct {
	Claim  string `json:"claim,omitempty"`
	Code   string `json:"code,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Server serves the members' channel for the VIPs of its handlers. It is
// an http.Handler; HTTPServer wraps it with timeouts. Safe for concurrent
// use.
type Server struct {
	handlers map[netip.Addr]Handler
	// PeerAddr returns the sender's overlay address; nil means the IP of
	// the request's RemoteAddr.
	PeerAddr func(*http.Request) (netip.Addr, error)
	// Timeout bounds the handling of one request; 0 means 10 s.
	Timeout time.Duration
}

// NewServer returns a server for the given handlers (one per VIP).
func NewServer(hs ...Handler) *Server {
	s := &Server{handlers: map[netip.Addr]Handler{}}
	for _, h := range hs {
		s.handlers[h.VIP()] = h
	}
	return s
}

// HTTPServer returns an http.Server for s at addr with the channel's
// timeouts and header limit set.
func (s *Server) HTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr: addr, Handler: s,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 15 * time.Second, IdleTimeout: 60 * time.Second,
		MaxHeaderBytes: 16 << 10,
	}
}

func remoteAddr(r *http.Request) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr().Unmap(), nil
}

func writeJSON(w http.ResponseWriter, status int, a wireAnswer) { jsonx.Write(w, status, a) }

func refuse(w http.ResponseWriter, err error) {
	if code, ok := RefusalCode(err); ok {
		writeJSON(w, http.StatusConflict, wireAnswer{Code: code, Reason: err.Error()})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, wireAnswer{Reason: err.Error()})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != MembersPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, wireAnswer{Reason: "POST only"})
		return
	}
	peer := s.PeerAddr
	if peer == nil {
		peer = remoteAddr
	}
	from, err := peer(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, wireAnswer{Reason: "sender: " + err.Error()})
		return
	}
	body, err := jsonx.ReadBody(w, r, MaxRequestBody)
	if errors.Is(err, jsonx.ErrTooLarge) {
		writeJSON(w, http.StatusRequestEntityTooLarge, wireAnswer{Code: "too-large", Reason: fmt.Sprintf("%v: body over %d bytes", ErrTooLarge, MaxRequestBody)})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, wireAnswer{Reason: err.Error()})
		return
	}
	var req wireRequest
	if err := jsonx.Decode(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, wireAnswer{Code: "malformed", Reason: "request: " + err.Error()})
		return
	}
	timeout := s.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	answer := func(c *Claim) {
		a := wireAnswer{}
		if c != nil {
			a.Claim = base64.StdEncoding.EncodeToString(c.Encode())
		}
		writeJSON(w, http.StatusOK, a)
	}
	decode := func(s string) ([]byte, bool) {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, wireAnswer{Code: "malformed", Reason: "base64: " + err.Error()})
			return nil, false
		}
		return b, true
	}
	switch req.Op {
	case "claim":
		raw, ok := decode(req.Claim)
		if !ok {
			return
		}
		c, err := ParseClaim(raw)
		if err != nil {
			refuse(w, err)
			return
		}
		h := s.handlers[c.VIP]
		if h == nil {
			refuse(w, fmt.Errorf("%w: %v", ErrUnknownVIP, c.VIP))
			return
		}
		if err := h.HandleClaim(ctx, from, c); err != nil {
			refuse(w, err)
			return
		}
		answer(c)
	case "release":
		raw, ok := decode(req.Release)
		if !ok {
			return
		}
		rel, err := ParseRelease(raw)
		if err != nil {
			refuse(w, err)
			return
		}
		h := s.handlers[rel.VIP]
		if h == nil {
			refuse(w, fmt.Errorf("%w: %v", ErrUnknownVIP, rel.VIP))
			return
		}
		held, err := h.HandleRelease(ctx, from, rel)
		if err != nil {
			refuse(w, err)
			return
		}
		answer(held)
	case "epoch":
		vip, err := netip.ParseAddr(req.VIP)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, wireAnswer{Code: "malformed", Reason: "vip: " + err.Error()})
			return
		}
		h := s.handlers[vip]
		if h == nil {
			refuse(w, fmt.Errorf("%w: %v", ErrUnknownVIP, vip))
			return
		}
		held, err := h.HandleEpoch(ctx)
		if err != nil {
			refuse(w, err)
			return
		}
		answer(held)
	case "handover":
		vip, err := netip.ParseAddr(req.VIP)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, wireAnswer{Code: "malformed", Reason: "vip: " + err.Error()})
			return
		}
		h, _ := s.handlers[vip].(HandOverHandler)
		if h == nil {
			refuse(w, fmt.Errorf("%w: %v", ErrUnknownVIP, vip))
			return
		}
		if err := h.HandleHandOver(ctx, from); err != nil {
			refuse(w, err)
			return
		}
		answer(nil)
	default:
		writeJSON(w, http.StatusBadRequest, wireAnswer{Code: "malformed", Reason: fmt.Sprintf("unknown op %q", req.Op)})
	}
}

// Client is the members' channel's client: a Channel over HTTP. The zero
// value is not usable; set HTTP or leave it nil for a client with the
// channel's timeouts. Safe for concurrent use.
type Client struct {
	// HTTP is the client used; nil means one with a 10 s timeout. Its
	// CheckRedirect is ignored: the client follows no redirect
	// (ErrRedirect).
	HTTP *http.Client
	// URL returns the channel's URL at peer; nil means
	// http://[peer]:DefaultMembersPort/v1/vip.
	URL func(peer netip.Addr) string
}

var _ HandOverChannel = (*Client)(nil)

var defaultHTTP = &http.Client{Timeout: 10 * time.Second}

func (c *Client) url(peer netip.Addr) string {
	if c.URL != nil {
		return c.URL(peer)
	}
	return "http://" + net.JoinHostPort(peer.String(), strconv.Itoa(DefaultMembersPort)) + MembersPath
}

func (c *Client) do(ctx context.Context, peer netip.Addr, req wireRequest) (*Claim, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(peer), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("claim: members' channel: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	// A copy that follows no redirect: a peer answers itself or not at
	// all, and never sends the request on to another address.
	noRedirect := *hc
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("claim: members' channel %v: %w", peer, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return nil, fmt.Errorf("%w: %v answered %d (to %q)", ErrRedirect, peer, resp.StatusCode, resp.Header.Get("Location"))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBody+1))
	if err != nil {
		return nil, fmt.Errorf("claim: members' channel %v: %w", peer, err)
	}
	if len(data) > MaxResponseBody {
		return nil, fmt.Errorf("%w: answer from %v over %d bytes", ErrTooLarge, peer, MaxResponseBody)
	}
	var a wireAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("claim: members' channel %v: status %d: bad answer: %w", peer, resp.StatusCode, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusConflict:
		return nil, &RefusalError{Code: a.Code, Reason: a.Reason, Err: refusalCodes[a.Code]}
	default:
		return nil, fmt.Errorf("claim: members' channel %v: status %d: %s", peer, resp.StatusCode, a.Reason)
	}
	if a.Claim == "" {
		return nil, nil
	}
	raw, err := base64.StdEncoding.DecodeString(a.Claim)
	if err != nil {
		return nil, fmt.Errorf("%w: answer from %v: %v", ErrMalformed, peer, err)
	}
	return ParseClaim(raw)
}

// Announce implements Channel.
func (c *Client) Announce(ctx context.Context, peer netip.Addr, cl *Claim) error {
	_, err := c.do(ctx, peer, wireRequest{Op: "claim", Claim: base64.StdEncoding.EncodeToString(cl.Encode())})
	return err
}

// Release implements Channel.
func (c *Client) Release(ctx context.Context, peer netip.Addr, r *Release) (*Claim, error) {
	return c.do(ctx, peer, wireRequest{Op: "release", Release: base64.StdEncoding.EncodeToString(r.Encode())})
}

// Epoch implements Channel.
func (c *Client) Epoch(ctx context.Context, peer netip.Addr, vip netip.Addr) (*Claim, error) {
	return c.do(ctx, peer, wireRequest{Op: "epoch", VIP: vip.String()})
}

// HandOver implements HandOverChannel.
func (c *Client) HandOver(ctx context.Context, peer netip.Addr, vip netip.Addr) error {
	_, err := c.do(ctx, peer, wireRequest{Op: "handover", VIP: vip.String()})
	return err
}

// Refusal returns err as a *RefusalError when it is a refusal (one of the
// sentinels with a wire code), and err unchanged otherwise. In-process
// Channels use it to answer as the HTTP client does.
func Refusal(err error) error {
	var ref *RefusalError
	if err == nil || errors.As(err, &ref) {
		return err
	}
	if code, ok := RefusalCode(err); ok {
		return &RefusalError{Code: code, Reason: err.Error(), Err: refusalCodes[code]}
	}
	return err
}
