package claim_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/vipkit/vipkit/claim"
)

func TestCheckTimings(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name                       string
		renew, ttl, drop, election time.Duration
		want                       error
	}{
		{"defaults", 0, 0, 0, 0, nil},
		{"spec figures", 2 * s, 20 * s, 10 * s, 5 * s, nil},
		{"exactly k renewals", 2 * s, 20 * s, 6 * s, 5 * s, nil},
		{"k-1 renewals", 2 * s, 20 * s, 6*s - 1, 5 * s, claim.ErrTimingMargin},
		{"issue's 10 s / 10.5 s", 10 * s, 20 * s, 10500 * time.Millisecond, 5 * s, claim.ErrTimingMargin},
		{"exactly the margin", 2 * s, 16 * s, 10 * s, 5 * s, nil},
		{"margin minus 1 ns", 2 * s, 16*s - 1, 10 * s, 5 * s, claim.ErrTimingMargin},
		{"election longer than ttl-drop", 2 * s, 20 * s, 10 * s, 11 * s, claim.ErrTimingMargin},
		{"huge, no overflow", math.MaxInt64 / 8, math.MaxInt64, math.MaxInt64 / 2, 5 * s, nil},
		{"order broken", 10 * s, 20 * s, 5 * s, 0, claim.ErrInvalidOptions},
		{"negative election", 2 * s, 20 * s, 10 * s, -s, claim.ErrInvalidOptions},
	} {
		err := claim.CheckTimings(tc.renew, tc.ttl, tc.drop, tc.election)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Both rules broken: both named.
	err := claim.CheckTimings(10*s, 11*s, 10500*time.Millisecond, 5*s)
	if err == nil || !errors.Is(err, claim.ErrTimingMargin) || len(err.Error()) < 100 {
		t.Fatalf("both rules broken: %v", err)
	}
}
