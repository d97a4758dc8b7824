package hosting_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/ziti"
)

func hostsOf(n int) (hosting.Hosts, map[string]string, []ziti.Terminator) {
	var act, pas []string
	ids := map[string]string{}
	var terms []ziti.Terminator
	for i := 0; i < n; i++ {
		a := fmt.Sprintf("agent-%d", i)
		ids[a] = "ident-" + a
		prec := ziti.PrecedenceRequired
		if i%2 == 1 {
			pas = append(pas, a)
			prec = ziti.PrecedenceDefault
		} else {
			act = append(act, a)
		}
		terms = append(terms, ziti.Terminator{HostID: ids[a], Precedence: prec}, ziti.Terminator{HostID: ids[a], Precedence: prec})
	}
	return hosting.NewHosts(act, pas), ids, terms
}

func BenchmarkDeriveStatus(b *testing.B) {
	for _, n := range []int{1, 2, 8} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			h, ids, terms := hostsOf(n)
			b.ReportAllocs()
			for b.Loop() {
				if st := hosting.DeriveStatus(h, ids, terms); st.State != hosting.Healthy {
					b.Fatal(st.State)
				}
			}
		})
	}
}

func BenchmarkValidate(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			ctx := context.Background()
			st := hosting.NewMemStore()
			h, _, _ := hostsOf(n)
			for _, a := range h.All() {
				_ = st.PutAgent(ctx, hosting.Agent{ID: a, AccountID: account})
			}
			s := hosting.Share{AccountID: account, Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432, Hosts: h}
			b.ReportAllocs()
			for b.Loop() {
				if err := (hosting.Validator{}).Validate(ctx, s, st); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRoleSwap measures one update that swaps an active and a
// passive, end to end over HTTP against the fake controller, with the Ziti
// calls it makes per update.
func BenchmarkRoleSwap(b *testing.B) {
	for _, passives := range []int{1, 4} {
		b.Run(fmt.Sprintf("passives=%d", passives), func(b *testing.B) {
			e := newEnvB(b)
			var pas []string
			for i := 0; i < passives; i++ {
				pas = append(pas, fmt.Sprintf("p%d", i))
			}
			e.agents(account, append([]string{"a1"}, pas...)...)
			s := e.create("db", []string{"a1"}, pas)
			e.fake.ResetCalls()
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				// one update: the first active and the first passive swap roles
				cur := s.Hosts
				next := hosting.NewHosts(cur.Passive[:1], append([]string{cur.Active[0]}, cur.Passive[1:]...))
				s2, err := e.svc.Update(e.ctx, s.ID, hosting.Update{Method: hosting.Put, Active: hosting.Of(next.Active...), Passive: hosting.Of(next.Passive...)})
				if err != nil {
					b.Fatal(err)
				}
				s = s2
				n++
			}
			b.ReportMetric(float64(len(e.fake.Calls()))/float64(n), "ziti-calls/op")
		})
	}
}
