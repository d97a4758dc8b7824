package keelvip_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	keelvip "github.com/vipkit/vipkit/examples/keel-vip"
	"github.com/vipkit/vipkit/internal/testenv"
)

// checkTimeline is the independent checker of the merged add/remove logs:
// it fails on any instant at which two nodes carry one VIP. Events at the
// same instant count as overlapping unless the remove is logged first.
func checkTimeline(es []keelvip.Event) error {
	es = slices.Clone(es)
	keelvip.SortEvents(es)
	holders := map[netip.Addr]map[string]bool{}
	for _, e := range es {
		hs := holders[e.VIP]
		if hs == nil {
			hs = map[string]bool{}
			holders[e.VIP] = hs
		}
		if e.Add {
			for n := range hs {
				if n != e.Node {
					return fmt.Errorf("two holders of %v at %v: %s and %s", e.VIP, e.At, n, e.Node)
				}
			}
			hs[e.Node] = true
		} else {
			delete(hs, e.Node)
		}
	}
	return nil
}

// naiveTwoHolders is the model: at every instant (event time), count the
// nodes whose last event at or before it is an add.
func naiveTwoHolders(es []keelvip.Event) bool {
	for _, at := range es {
		count := map[netip.Addr]map[string]bool{}
		last := map[string]keelvip.Event{}
		for _, e := range es {
			if e.At <= at.At {
				k := e.Node + "|" + e.VIP.String()
				if p, ok := last[k]; !ok || p.At <= e.At {
					last[k] = e
				}
			}
		}
		for _, e := range last {
			if e.Add {
				if count[e.VIP] == nil {
					count[e.VIP] = map[string]bool{}
				}
				count[e.VIP][e.Node] = true
				if len(count[e.VIP]) > 1 {
					return true
				}
			}
		}
	}
	return false
}

func TestTimelineChecker(t *testing.T) {
	vip := netip.MustParseAddr("fd00::1:100")
	ev := func(at int, node string, add bool) keelvip.Event {
		return keelvip.Event{At: time.Duration(at) * time.Millisecond, Node: node, Add: add, VIP: vip}
	}
	ok := []keelvip.Event{ev(0, "a", true), ev(10, "a", false), ev(11, "b", true), ev(20, "b", false), ev(30, "a", true)}
	if err := checkTimeline(ok); err != nil {
		t.Fatal(err)
	}
	overlap := []keelvip.Event{ev(0, "a", true), ev(11, "b", true), ev(12, "a", false)}
	if err := checkTimeline(overlap); err == nil || !strings.Contains(err.Error(), "two holders") {
		t.Fatalf("overlap not found: %v", err)
	}
	// A re-add by the same node is not two holders.
	if err := checkTimeline([]keelvip.Event{ev(0, "a", true), ev(1, "a", true)}); err != nil {
		t.Fatal(err)
	}
}

// TestTimelineCheckerModel compares the checker with the naive model on
// random timelines of two nodes (events at distinct instants).
func TestTimelineCheckerModel(t *testing.T) {
	seed := testenv.Seed(t, 10)
	r := rand.New(rand.NewPCG(seed, 1))
	vip := netip.MustParseAddr("fd00::1:100")
	for i := 0; i < 2000; i++ {
		n := 1 + r.IntN(8)
		var es []keelvip.Event
		for j := 0; j < n; j++ {
			es = append(es, keelvip.Event{At: time.Duration(j*10 + r.IntN(5)), Node: []string{"a", "b"}[r.IntN(2)], Add: r.IntN(2) == 0, VIP: vip})
		}
		got := checkTimeline(es) != nil
		if want := naiveTwoHolders(es); got != want {
			t.Fatalf("seed %d case %d: checker %v, model %v: %+v", seed, i, got, want, es)
		}
	}
}

func TestParseEvent(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{"123 a add fd00::1:100", true},
		{"123 b remove fd00::1:100", true},
		{"-1 a add fd00::1:100", false},
		{"123 a move fd00::1:100", false},
		{"123 a add nope", false},
		{"123 a add", false},
		{"", false},
	} {
		_, err := keelvip.ParseEvent(tc.line)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v", tc.line, err)
		}
	}
	es, err := keelvip.ReadEvents(strings.NewReader("1 a add fd00::1:100\n2 a remove fd00::1:100\n"))
	if err != nil || len(es) != 2 || !es[0].Add || es[1].Add {
		t.Fatalf("%v %+v", err, es)
	}
	if _, err := keelvip.ReadEvents(strings.NewReader("1 a add fd00::1:100\nbad\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("want line 2 error, got %v", err)
	}
}

func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{"123 a add fd00::1:100", "123 b remove fd00::1:100", "-1 a add x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, err := keelvip.ParseEvent(line)
		if err != nil {
			return
		}
		op := "remove"
		if e.Add {
			op = "add"
		}
		back := fmt.Sprintf("%d %s %s %v", int64(e.At), e.Node, op, e.VIP)
		e2, err := keelvip.ParseEvent(back)
		if err != nil || e2 != e {
			t.Fatalf("round trip %q -> %q: %v", line, back, err)
		}
	})
}
