package hosting_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
)

func TestHostsApply(t *testing.T) {
	base := hosting.NewHosts([]string{"a1", "a2"}, []string{"p1"})
	cases := []struct {
		name string
		body string
		m    hosting.Method
		want hosting.Hosts
		err  error
	}{
		{"put both", `{"activeAgentIds":["b"],"passiveAgentIds":["c"]}`, hosting.Put, hosting.NewHosts([]string{"b"}, []string{"c"}), nil},
		{"put absent passive is empty", `{"activeAgentIds":["b"]}`, hosting.Put, hosting.NewHosts([]string{"b"}, nil), nil},
		{"put null passive is empty", `{"activeAgentIds":["b"],"passiveAgentIds":null}`, hosting.Put, hosting.NewHosts([]string{"b"}, nil), nil},
		{"put without actives has none", `{"passiveAgentIds":["c"]}`, hosting.Put, hosting.NewHosts(nil, []string{"c"}), nil},
		{"put null actives has none", `{"activeAgentIds":null}`, hosting.Put, hosting.NewHosts(nil, nil), nil},
		{"patch replaces one list, leaves the other", `{"activeAgentIds":["b","a"]}`, hosting.Patch, hosting.NewHosts([]string{"a", "b"}, []string{"p1"}), nil},
		{"patch passive only", `{"passiveAgentIds":["x","y"]}`, hosting.Patch, hosting.NewHosts([]string{"a1", "a2"}, []string{"x", "y"}), nil},
		{"patch null passive clears it", `{"passiveAgentIds":null}`, hosting.Patch, hosting.NewHosts([]string{"a1", "a2"}, nil), nil},
		{"patch empty passive clears it", `{"passiveAgentIds":[]}`, hosting.Patch, hosting.NewHosts([]string{"a1", "a2"}, nil), nil},
		{"patch nothing", `{}`, hosting.Patch, base, nil},
		{"duplicates collapse", `{"activeAgentIds":["b","b"]}`, hosting.Patch, hosting.NewHosts([]string{"b"}, []string{"p1"}), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := hosting.DecodeUpdate([]byte(tc.body), tc.m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := base.Apply(u)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err == nil && !got.Equal(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeUpdateRefuses(t *testing.T) {
	for _, body := range []string{`{"agentId":"a"}`, `{"activeAgentIds":"a"}`, `{"activeAgentIds":[1]}`, `{"activeAgentIds":[""]}`, `[]`, `{} {}`, `{"activeAgentIds":["a"]`} {
		if _, err := hosting.DecodeUpdate([]byte(body), hosting.Patch); !errors.Is(err, hosting.ErrBadUpdate) {
			t.Errorf("%s: err = %v, want ErrBadUpdate", body, err)
		}
	}
}

func FuzzDecodeUpdate(f *testing.F) {
	for _, s := range []string{`{"activeAgentIds":["b"],"passiveAgentIds":["c"]}`, `{"passiveAgentIds":null}`, `{}`, `{"name":"x","targetPort":80}`, `{"activeAgentIds":[""]}`, `null`} {
		f.Add([]byte(s))
	}
	base := hosting.NewHosts([]string{"a"}, []string{"p"})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []hosting.Method{hosting.Put, hosting.Patch} {
			u, err := hosting.DecodeUpdate(b, m)
			if err != nil {
				if !errors.Is(err, hosting.ErrBadUpdate) {
					t.Fatalf("error %v does not match ErrBadUpdate", err)
				}
				continue
			}
			h, err := base.Apply(u)
			if err != nil {
				continue
			}
			// Sorted, unique lists.
			again := hosting.NewHosts(h.Active, h.Passive)
			if fmt.Sprint(again) != fmt.Sprint(h) {
				t.Fatalf("not normalized: %+v", h)
			}
		}
	})
}

func TestHostsWithout(t *testing.T) {
	cases := []struct {
		name           string
		h              hosting.Hosts
		agent          string
		want           hosting.Hosts
		promoted, none bool
	}{
		{"a passive leaves", hosting.NewHosts([]string{"a"}, []string{"p", "q"}), "p", hosting.NewHosts([]string{"a"}, []string{"q"}), false, false},
		{"an active leaves, actives remain", hosting.NewHosts([]string{"a", "b"}, []string{"p"}), "a", hosting.NewHosts([]string{"b"}, []string{"p"}), false, false},
		{"the last active leaves: every passive promoted", hosting.NewHosts([]string{"a"}, []string{"p", "q"}), "a", hosting.NewHosts([]string{"p", "q"}, nil), true, false},
		{"the last host leaves", hosting.NewHosts([]string{"a"}, nil), "a", hosting.NewHosts(nil, nil), false, true},
		{"not a host", hosting.NewHosts([]string{"a"}, nil), "z", hosting.NewHosts([]string{"a"}, nil), false, false},
	}
	for _, tc := range cases {
		got, promoted := tc.h.Without(tc.agent)
		if !got.Equal(tc.want) || promoted != tc.promoted || got.Empty() != tc.none {
			t.Errorf("%s: got %+v promoted=%v", tc.name, got, promoted)
		}
	}
}

func FuzzDecodeAgentDeleted(f *testing.F) {
	m, _ := hosting.AgentDeletedMessage("id-1", hosting.AgentDeleted{AgentID: "a1", AccountID: "acct"}, time.Unix(0, 0))
	for _, s := range []string{string(m.Body), `{}`, `null`, `{"entity":"agent","type":"DELETED","data":{"agentId":""}}`, `{"entity":"share","type":"DELETED","data":{}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, d, err := hosting.DecodeAgentDeleted(b)
		if err != nil {
			if !errors.Is(err, hosting.ErrEvent) {
				t.Fatalf("error %v is not ErrEvent", err)
			}
			return
		}
		// What decodes encodes back to the same event.
		m, err := hosting.AgentDeletedMessage(id, d, time.Unix(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		id2, d2, err := hosting.DecodeAgentDeleted(m.Body)
		if err != nil || id2 != id || d2 != d || m.RoutingKey != hosting.RouteAgentDeleted {
			t.Fatalf("%s: round trip %q %+v %v", b, id2, d2, err)
		}
	})
}
