package zititest_test

import (
	"errors"
	"testing"

	"github.com/vipkit/vipkit/hosting/zititest"
)

// A new circuit goes to the highest band that holds a terminator, and
// round-robins inside it.
func TestRouteByBand(t *testing.T) {
	f, _ := start(t)
	h1, h2, h3 := f.AddIdentity("h1"), f.AddIdentity("h2"), f.AddIdentity("h3")
	cases := []struct {
		name  string
		terms map[string]string // host → precedence
		want  []string          // hosts a run of circuits may reach
	}{
		{"required over default and failed", map[string]string{h1: "required", h2: "default", h3: "failed"}, []string{h1}},
		{"default over failed", map[string]string{h2: "default", h3: "failed"}, []string{h2}},
		{"failed when nothing better", map[string]string{h3: "failed"}, []string{h3}},
		{"two actives share", map[string]string{h1: "required", h2: "required", h3: "default"}, []string{h1, h2}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := "svc-" + string(rune('a'+i))
			for h, p := range tc.terms {
				f.AddTerminator(svc, h, p)
			}
			seen := map[string]int{}
			for n := 0; n < 10; n++ {
				tm, err := f.Route(svc)
				if err != nil {
					t.Fatal(err)
				}
				seen[tm.HostID]++
			}
			if len(seen) != len(tc.want) {
				t.Fatalf("circuits reached %v, want each of %v", seen, tc.want)
			}
			for _, h := range tc.want {
				if seen[h] == 0 {
					t.Fatalf("circuits reached %v, want each of %v", seen, tc.want)
				}
			}
		})
	}
	if _, err := f.Route("nothing"); !errors.Is(err, zititest.ErrNoTerminator) {
		t.Fatalf("no terminator: %v", err)
	}
}
