package ziti

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
	"github.com/vipkit/vipkit/transport"
)

// BasePath is the Edge Management API's basePath.
const BasePath = "/edge/management/v1"

// DefaultMaxResponseBytes bounds the size of one answer the client reads.
const DefaultMaxResponseBytes = 16 << 20

// MaxIdleConnsPerHost is the number of idle connections to the
// controller that a client's transport should keep (http.Transport's
// MaxIdleConnsPerHost, whose default is 2). A hosting service has a
// request in flight for each concurrent operation, and several for one
// operation (its lookups go at once): with only 2 kept, every other
// request opens a connection, and a TLS handshake, of its own.
const MaxIdleConnsPerHost = 64

// maxListItems bounds what one list call collects.
const maxListItems = 100_000

// pageLimit is the page size of list calls; the controller caps it at 500.
const pageLimit = 500

// Options configure a Client.
type Options struct {
	// HTTPClient sends the requests; nil means http.DefaultClient. Its
	// transport carries the controller's TLS trust. The client calls it
	// with none of its locks held, logins included. Its CheckRedirect is
	// ignored: the client follows no redirect (see Client).
	HTTPClient *http.Client
	// Session is sent as the zt-session header (the ztSession API key of
	// the specification), obtained from the controller's authentication.
	Session string
	// MaxResponseBytes bounds one answer; 0 means DefaultMaxResponseBytes.
	// A longer answer fails with ErrProtocol.
	MaxResponseBytes int64
	// Login, when set, makes the client log in itself (Session is then
	// ignored): before its first call, again RefreshBefore ahead of the
	// session's expiry, and once after a 401, retrying that call once.
	Login *Login
	// RefreshBefore is how long before expiry a session is renewed; 0
	// means DefaultRefreshBefore.
	RefreshBefore time.Duration
	// Clock tells the session's age; nil means the real clock.
	Clock transport.Clock
	// OnError, when set, is told of every call that failed, with its
	// operationId (for metrics). It must not block.
	OnError func(op string, err error)
}

// Client calls a controller's Edge Management API. It is safe for
// concurrent use.
//
// It follows no redirect: every request carries the session (zt-session)
// or, to authenticate, the password, and a redirect would send them on to
// whatever address the answer names. A redirect (any 3xx answer) fails
// with ErrProtocol naming its Location; point the client at the
// controller's own address instead.
type Client struct {
	base    *url.URL
	hc      *http.Client
	max     int64
	login   *Login
	refresh time.Duration // +checklocksignore: set by New, read-only after
	clk     transport.Clock
	onErr   func(op string, err error)

	// mu guards the session, its expiry and the login in flight. It is
	// never held across a request (the HTTPClient's transport is the
	// caller's): one login runs at a time because the others wait for
	// inflight, each within its own context.
	mu syncx.Mutex
	// +checklocks:mu
	session string
	// expires is when the session ends; zero for a static session.
	// +checklocks:mu
	expires time.Time
	// inflight is the login running, nil when none.
	// +checklocks:mu
	inflight *loginCall
}

// loginCall is one login in flight; done is closed when it ends.
type loginCall struct {
	done chan struct{}
}

// New returns a client for the controller at baseURL (scheme, host and
// optional port; BasePath is appended unless baseURL already ends with it).
func New(baseURL string, o Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("ziti: bad controller URL %q: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("ziti: bad controller URL %q: want http(s)://host[:port]", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(u.Path, BasePath) {
		u.Path += BasePath
	}
	c := &Client{base: u, hc: o.HTTPClient, session: o.Session, max: o.MaxResponseBytes, login: o.Login, refresh: o.RefreshBefore, clk: transport.Or(o.Clock), onErr: o.OnError}
	if c.login != nil {
		c.session = ""
		if err := c.login.check(); err != nil {
			return nil, err
		}
	}
	if c.refresh <= 0 {
		c.refresh = DefaultRefreshBefore
	}
	if c.hc == nil {
		c.hc = http.DefaultClient
	}
	if c.max <= 0 {
		c.max = DefaultMaxResponseBytes
	}
	return c, nil
}

type envelope struct {
	Data  json.RawMessage `json:"data"`
	Meta  *meta           `json:"meta"`
	Error *APIError       `json:"error"`
}

type meta struct {
	Pagination *struct {
		Limit      int64 `json:"limit"`
		Offset     int64 `json:"offset"`
		TotalCount int64 `json:"totalCount"`
	} `json:"pagination"`
}

// do sends one request and decodes the data of a success envelope into out
// (when non-nil). want is the success status. With a Login, it makes sure
// of a fresh session first, and after a 401 logs in again and sends the
// request once more: the controller refused it unread, so resending is
// safe.
func (c *Client) do(ctx context.Context, op, method, path string, q url.Values, body any, want int, out any) (*meta, error) {
	m, err := c.doOnce(ctx, op, method, path, q, body, want, out)
	if err != nil && c.onErr != nil {
		c.onErr(op, err)
	}
	return m, err
}

func (c *Client) doOnce(ctx context.Context, op, method, path string, q url.Values, body any, want int, out any) (*meta, error) {
	if c.login == nil {
		c.mu.Lock()
		tok := c.session
		c.mu.Unlock()
		return c.send(ctx, op, method, path, q, body, want, out, tok)
	}
	tok, err := c.token(ctx, "")
	if err != nil {
		return nil, err
	}
	m, err := c.send(ctx, op, method, path, q, body, want, out, tok)
	if !errors.Is(err, ErrUnauthorized) {
		return m, err
	}
	if tok, err = c.token(ctx, tok); err != nil {
		return nil, err
	}
	return c.send(ctx, op, method, path, q, body, want, out, tok)
}

func (c *Client) send(ctx context.Context, op, method, path string, q url.Values, body any, want int, out any, session string) (*meta, error) {
	u := *c.base
	u.Path += path
	u.RawPath = ""
	if q != nil {
		u.RawQuery = q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("ziti: %s: encode body: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("ziti: %s: %w", op, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if session != "" {
		req.Header.Set("zt-session", session)
	}
	// A copy that follows no redirect (see Client), with the caller's
	// transport, jar and timeout.
	noRedirect := *c.hc
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ziti: %s: %w", op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return nil, fmt.Errorf("%w: %s: the controller answered %d, a redirect to %q, which the client does not follow",
			ErrProtocol, op, resp.StatusCode, resp.Header.Get("Location"))
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.max+1))
	if err != nil {
		return nil, fmt.Errorf("ziti: %s: read answer: %w", op, err)
	}
	if int64(len(raw)) > c.max {
		return nil, fmt.Errorf("%w: %s: answer longer than %d bytes", ErrProtocol, op, c.max)
	}
	var env envelope
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &env); err != nil {
			if resp.StatusCode != want {
				return nil, &APIError{Op: op, Status: resp.StatusCode, Code: "UNKNOWN", Message: http.StatusText(resp.StatusCode)}
			}
			return nil, fmt.Errorf("%w: %s: bad JSON answer: %v", ErrProtocol, op, err)
		}
	}
	if resp.StatusCode != want {
		if env.Error == nil {
			return nil, &APIError{Op: op, Status: resp.StatusCode, Code: "UNKNOWN", Message: http.StatusText(resp.StatusCode)}
		}
		e := *env.Error
		e.Op, e.Status = op, resp.StatusCode
		return nil, &e
	}
	if out != nil {
		if len(env.Data) == 0 || string(env.Data) == "null" {
			return nil, fmt.Errorf("%w: %s: answer has no data", ErrProtocol, op)
		}
		if err := json.Unmarshal(env.Data, out); err != nil {
			return nil, fmt.Errorf("%w: %s: bad data: %v", ErrProtocol, op, err)
		}
	}
	return env.Meta, nil
}

func (c *Client) create(ctx context.Context, op, path string, body any) (string, error) {
	var loc struct {
		ID string `json:"id"`
	}
	if _, err := c.do(ctx, op, http.MethodPost, path, nil, body, http.StatusCreated, &loc); err != nil {
		return "", err
	}
	if loc.ID == "" {
		return "", fmt.Errorf("%w: %s: created object has no id", ErrProtocol, op)
	}
	return loc.ID, nil
}

// list pages through a list operation with filter.
func list[T any](ctx context.Context, c *Client, op, path, filter string) ([]T, error) {
	var all []T
	for offset := 0; ; {
		q := url.Values{"limit": {strconv.Itoa(pageLimit)}, "offset": {strconv.Itoa(offset)}}
		if filter != "" {
			q.Set("filter", filter)
		}
		var page []T
		m, err := c.do(ctx, op, http.MethodGet, path, q, nil, http.StatusOK, &page)
		if err != nil {
			return nil, err
		}
		if m != nil && m.Pagination != nil && m.Pagination.Offset != int64(offset) {
			return nil, fmt.Errorf("%w: %s: asked for offset %d, got page at %d", ErrProtocol, op, offset, m.Pagination.Offset)
		}
		all = append(all, page...)
		if len(all) > maxListItems {
			return nil, fmt.Errorf("%w: %s: more than %d objects", ErrProtocol, op, maxListItems)
		}
		offset += len(page)
		if m == nil || m.Pagination == nil || len(page) == 0 || int64(offset) >= m.Pagination.TotalCount {
			return all, nil
		}
	}
}

func idPath(prefix, id string) string { return prefix + "/" + url.PathEscape(id) }

// ListConfigTypes calls listConfigTypes with a filter ("" for all).
func (c *Client) ListConfigTypes(ctx context.Context, filter string) ([]ConfigType, error) {
	return list[ConfigType](ctx, c, "listConfigTypes", "/config-types", filter)
}

// CreateConfig calls createConfig and returns the new config's id.
func (c *Client) CreateConfig(ctx context.Context, cfg ConfigCreate) (string, error) {
	return c.create(ctx, "createConfig", "/configs", cfg)
}

// PatchConfig calls patchConfig.
func (c *Client) PatchConfig(ctx context.Context, id string, p ConfigPatch) error {
	_, err := c.do(ctx, "patchConfig", http.MethodPatch, idPath("/configs", id), nil, p, http.StatusOK, nil)
	return err
}

// DeleteConfig calls deleteConfig. It fails with ErrConfigInUse while an
// identity's override names the config.
func (c *Client) DeleteConfig(ctx context.Context, id string) error {
	_, err := c.do(ctx, "deleteConfig", http.MethodDelete, idPath("/configs", id), nil, nil, http.StatusOK, nil)
	return err
}

// ListConfigs calls listConfigs with a filter.
func (c *Client) ListConfigs(ctx context.Context, filter string) ([]Config, error) {
	return list[Config](ctx, c, "listConfigs", "/configs", filter)
}

// CreateService calls createService and returns the new service's id.
func (c *Client) CreateService(ctx context.Context, s ServiceCreate) (string, error) {
	return c.create(ctx, "createService", "/services", s)
}

// DeleteService calls deleteService; the controller removes every override
// for the service with it.
func (c *Client) DeleteService(ctx context.Context, id string) error {
	_, err := c.do(ctx, "deleteService", http.MethodDelete, idPath("/services", id), nil, nil, http.StatusOK, nil)
	return err
}

// PatchService calls patchService.
func (c *Client) PatchService(ctx context.Context, id string, p ServicePatch) error {
	_, err := c.do(ctx, "patchService", http.MethodPatch, idPath("/services", id), nil, p, http.StatusOK, nil)
	return err
}

// ListServices calls listServices with a filter.
func (c *Client) ListServices(ctx context.Context, filter string) ([]Service, error) {
	return list[Service](ctx, c, "listServices", "/services", filter)
}

// CreateServicePolicy calls createServicePolicy and returns the id.
func (c *Client) CreateServicePolicy(ctx context.Context, p ServicePolicyCreate) (string, error) {
	return c.create(ctx, "createServicePolicy", "/service-policies", p)
}

// PatchServicePolicy calls patchServicePolicy.
func (c *Client) PatchServicePolicy(ctx context.Context, id string, p ServicePolicyPatch) error {
	_, err := c.do(ctx, "patchServicePolicy", http.MethodPatch, idPath("/service-policies", id), nil, p, http.StatusOK, nil)
	return err
}

// DeleteServicePolicy calls deleteServicePolicy.
func (c *Client) DeleteServicePolicy(ctx context.Context, id string) error {
	_, err := c.do(ctx, "deleteServicePolicy", http.MethodDelete, idPath("/service-policies", id), nil, nil, http.StatusOK, nil)
	return err
}

// ListServicePolicies calls listServicePolicies with a filter.
func (c *Client) ListServicePolicies(ctx context.Context, filter string) ([]ServicePolicy, error) {
	return list[ServicePolicy](ctx, c, "listServicePolicies", "/service-policies", filter)
}

// ListIdentities calls listIdentities with a filter.
func (c *Client) ListIdentities(ctx context.Context, filter string) ([]Identity, error) {
	return list[Identity](ctx, c, "listIdentities", "/identities", filter)
}

// ListServiceConfigs calls listIdentitysServiceConfigs: the overrides of an
// identity. The list has no paging; entries whose service or config is gone
// are left out by the controller.
func (c *Client) ListServiceConfigs(ctx context.Context, identityID string) ([]ServiceConfig, error) {
	var out []ServiceConfig
	_, err := c.do(ctx, "listIdentitysServiceConfigs", http.MethodGet, idPath("/identities", identityID)+"/service-configs", nil, nil, http.StatusOK, &out)
	return out, err
}

// errEmptyList is returned before any request for an empty override list,
// which the controller refuses.
var errEmptyList = fmt.Errorf("%w: empty service-config list", ErrInvalid)

// AssignServiceConfigs calls associateIdentitysServiceConfigs. An override
// replaces the identity's override of the same (service, config type). The
// call is idempotent. An empty list fails with ErrInvalid.
func (c *Client) AssignServiceConfigs(ctx context.Context, identityID string, scs []ServiceConfig) error {
	if len(scs) == 0 {
		return errEmptyList
	}
	_, err := c.do(ctx, "associateIdentitysServiceConfigs", http.MethodPost, idPath("/identities", identityID)+"/service-configs", nil, scs, http.StatusOK, nil)
	return err
}

// RemoveServiceConfigs calls disassociateIdentitysServiceConfigs. The
// controller removes by (service, config type), but the config named must
// exist. The call is idempotent. An empty list fails with ErrInvalid.
func (c *Client) RemoveServiceConfigs(ctx context.Context, identityID string, scs []ServiceConfig) error {
	if len(scs) == 0 {
		return errEmptyList
	}
	_, err := c.do(ctx, "disassociateIdentitysServiceConfigs", http.MethodDelete, idPath("/identities", identityID)+"/service-configs", nil, scs, http.StatusOK, nil)
	return err
}

// ListTerminators calls listTerminators with a filter, for instance
// Eq("service", serviceID).
func (c *Client) ListTerminators(ctx context.Context, filter string) ([]Terminator, error) {
	return list[Terminator](ctx, c, "listTerminators", "/terminators", filter)
}

// PolicyAdvice calls getIdentityPolicyAdvice for an identity and a service.
func (c *Client) PolicyAdvice(ctx context.Context, identityID, serviceID string) (PolicyAdvice, error) {
	var out PolicyAdvice
	_, err := c.do(ctx, "getIdentityPolicyAdvice", http.MethodGet, idPath("/identities", identityID)+"/policy-advice/"+url.PathEscape(serviceID), nil, nil, http.StatusOK, &out)
	return out, err
}

// IsNotFound reports whether err is a 404 of the controller.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
