package sharehosts_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vipkit/vipkit/examples/sharehosts"
	"github.com/vipkit/vipkit/hosting"
)

// Each answer of the gates' services: what is up, what is gone, and an
// error for anything else (so that the cascade is retried, not run on a
// guess).
func TestGatesAnswers(t *testing.T) {
	status := 200
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
	defer srv.Close()
	s := hosting.Share{ID: "6f1c0f4e-9d3b-4c39-a8a0-4f9b8f0e7a11"}
	ing, net := sharehosts.HTTPIngress{Base: srv.URL}, sharehosts.HTTPNetwork{Base: srv.URL, FrontdoorID: "fd"}
	for _, tc := range []struct {
		status         int
		up, cleanup    bool
		upErr, tearErr bool
		cleanupErr     bool
	}{
		{status: 200, up: true, cleanup: true},
		{status: 204, upErr: true, cleanupErr: true},
		{status: 404, up: false, cleanup: false},
		{status: 410, upErr: true, tearErr: true, cleanup: false},
		{status: 500, upErr: true, tearErr: true, cleanupErr: true},
	} {
		status = tc.status
		up, err := ing.Up(t.Context(), s)
		if (err != nil) != tc.upErr || (err == nil && up != tc.up) {
			t.Errorf("%d: Up %v %v", tc.status, up, err)
		}
		if err := ing.TearDown(t.Context(), s); (err != nil) != tc.tearErr {
			t.Errorf("%d: TearDown %v", tc.status, err)
		}
		c, err := net.ShouldCleanupZiti(t.Context(), s)
		if (err != nil) != tc.cleanupErr || (err == nil && c != tc.cleanup) {
			t.Errorf("%d: ShouldCleanupZiti %v %v", tc.status, c, err)
		}
	}
}
