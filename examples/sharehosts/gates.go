package sharehosts

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/vipkit/vipkit/hosting"
)

// GateTimeout bounds one call of the ingress or the network gate.
const GateTimeout = 10 * time.Second

// gateClient is the HTTP client of both gates.
var gateClient = &http.Client{Timeout: GateTimeout}

// call does one request of a gate and returns its status.
func call(ctx context.Context, method, u string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := gateClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

// HTTPIngress is hosting.Ingress over the ingress service's HTTP API
// (ingress.url): GET <url>/shares/<id> answers 200 while the share's
// ingress is up and 404 once it is gone; DELETE <url>/shares/<id> tears
// it down (2xx, or 404 when it is gone already). Any other answer is an
// error, so the cascade is retried.
type HTTPIngress struct{ Base string }

// Up implements hosting.Ingress.
func (g HTTPIngress) Up(ctx context.Context, s hosting.Share) (bool, error) {
	st, err := call(ctx, http.MethodGet, g.Base+"/shares/"+url.PathEscape(s.ID))
	switch {
	case err != nil:
		return false, fmt.Errorf("sharehosts: ingress of share %s: %w", s.ID, err)
	case st == http.StatusOK:
		return true, nil
	case st == http.StatusNotFound:
		return false, nil
	}
	return false, fmt.Errorf("sharehosts: ingress of share %s: GET answered %d", s.ID, st)
}

// TearDown implements hosting.Ingress.
func (g HTTPIngress) TearDown(ctx context.Context, s hosting.Share) error {
	st, err := call(ctx, http.MethodDelete, g.Base+"/shares/"+url.PathEscape(s.ID))
	switch {
	case err != nil:
		return fmt.Errorf("sharehosts: tear down the ingress of share %s: %w", s.ID, err)
	case st/100 == 2 || st == http.StatusNotFound:
		return nil
	}
	return fmt.Errorf("sharehosts: tear down the ingress of share %s: DELETE answered %d", s.ID, st)
}

// HTTPNetwork is hosting.NetworkAvailability over the network service's
// HTTP API (network.url): GET <url>/frontdoors/<frontdoor-id>/network
// answers 200 while the frontdoor's network (its Ziti controller) exists,
// so a share delete cleans its Ziti objects up, and 404 or 410 once it is
// decommissioned, so the delete leaves them. Any other answer is an
// error: the delete fails and is retried.
type HTTPNetwork struct{ Base, FrontdoorID string }

// ShouldCleanupZiti implements hosting.NetworkAvailability.
func (g HTTPNetwork) ShouldCleanupZiti(ctx context.Context, s hosting.Share) (bool, error) {
	st, err := call(ctx, http.MethodGet, g.Base+"/frontdoors/"+url.PathEscape(g.FrontdoorID)+"/network")
	switch {
	case err != nil:
		return false, fmt.Errorf("sharehosts: network of frontdoor %s: %w", g.FrontdoorID, err)
	case st == http.StatusOK:
		return true, nil
	case st == http.StatusNotFound || st == http.StatusGone:
		return false, nil
	}
	return false, fmt.Errorf("sharehosts: network of frontdoor %s: GET answered %d", g.FrontdoorID, st)
}
