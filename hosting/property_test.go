package hosting_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/internal/testenv"
)

// TestPropertyZitiMatchesModel: for random sequences of updates (PUT and
// PATCH, role changes, target changes, invalid updates, agent deletions
// with their cascade), the fake controller's objects always match the
// model: actives at required, passives at default through their override,
// a standby config iff a passive exists, the bind policy equal to the
// hosts, and no controller 500.
func TestPropertyZitiMatchesModel(t *testing.T) {
	seed := testenv.Seed(t, 7)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	runs, steps := 6, 25
	if testenv.Long() {
		runs, steps = 60, 100
	}
	pool := []string{"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8", "g9"}
	for run := 0; run < runs; run++ {
		e := newEnv(t, nil)
		e.agents(account, pool...)
		live := map[string]bool{}
		for _, a := range pool {
			live[a] = true
		}
		pick := func(n int) []string {
			var out []string
			for _, i := range rng.Perm(len(pool))[:n] {
				out = append(out, pool[i])
			}
			return out
		}
		s := e.create("prop", pick(1), nil)
		model := s.Hosts
		for step := 0; step < steps; step++ {
			perm := pick(1 + rng.IntN(6))
			na := 1 + rng.IntN(len(perm))
			if rng.IntN(8) == 0 {
				na = 0 // invalid: no active
			}
			u := hosting.Update{Method: hosting.Patch}
			switch rng.IntN(4) {
			case 0:
				u.Method, u.Active, u.Passive = hosting.Put, hosting.Of(perm[:na]...), hosting.Of(perm[na:]...)
			case 1:
				u.Active = hosting.Of(perm[:na]...)
			case 2:
				u.Passive = hosting.Of(perm[na:]...)
				if rng.IntN(3) == 0 {
					u.Passive = hosting.Null
				}
			case 3:
				port := uint16(1 + rng.IntN(65535))
				u.TargetPort = &port
				u.Active, u.Passive = hosting.Of(perm[:na]...), hosting.Of(perm[na:]...)
			}
			want, _ := model.Apply(u)
			valid := len(want.Active) > 0
			for _, a := range want.All() {
				valid = valid && live[a]
			}
			valid = valid && len(want.All()) == want.Len() && want.Len() <= hosting.DefaultMaxHosts // no overlap, under the cap
			got, err := e.svc.Update(e.ctx, s.ID, u)
			switch {
			case valid && err != nil:
				t.Fatalf("run %d step %d: valid update %+v failed: %v", run, step, want, err)
			case !valid && !errors.Is(err, hosting.ErrInvalid):
				t.Fatalf("run %d step %d: invalid update %+v: err %v", run, step, want, err)
			case valid:
				model = want
				if !got.Hosts.Equal(model) {
					t.Fatalf("service returned %+v, model %+v", got.Hosts, model)
				}
			}
			// Now and then an agent is deleted, with its cascade.
			if rng.IntN(6) == 0 {
				victim := pool[rng.IntN(len(pool))]
				if live[victim] {
					live[victim] = false
					e.deleteAgent(victim)
					if _, err := e.svc.RemoveDeletedAgent(e.ctx, victim); err != nil {
						t.Fatalf("cascade: %v", err)
					}
					rest, _ := model.Without(victim)
					if _, hosts := model.RoleOf(victim); hosts {
						model = rest
					}
					if model.Empty() {
						if cur, _ := e.store.Get(e.ctx, s.ID); cur.Live() {
							t.Fatal("share without hosts is live")
						}
						break
					}
				}
			}
			cur, err := e.store.Get(e.ctx, s.ID)
			if err != nil || !cur.Hosts.Equal(model) {
				t.Fatalf("store %+v, model %+v (%v)", cur.Hosts, model, err)
			}
			e.checkModel(cur)
		}
		e.no500()
	}
}
