package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/pgstore"
)

// BenchmarkLockSave measures one transaction that locks a share with its
// hosts (SELECT … FOR UPDATE), flips a host's role and commits: the store
// side of every update and cascade. The memory store runs in the same
// binary for comparison.
func BenchmarkLockSave(b *testing.B) {
	if server == nil {
		b.Skipf("PostgreSQL: %v", startErr)
	}
	for _, hosts := range []int{1, 8} {
		for _, kind := range []string{"postgres", "memory"} {
			b.Run(fmt.Sprintf("%s/hosts=%d", kind, hosts), func(b *testing.B) {
				ctx := context.Background()
				var st hosting.Store = hosting.NewMemStore()
				if kind == "postgres" {
					st = pgstore.New(poolTB(b, ""), pgstore.Options{})
				}
				var act []string
				for i := 0; i < hosts; i++ {
					a := fmt.Sprintf("ag%d", i)
					if err := st.PutAgent(ctx, hosting.Agent{ID: a, AccountID: "acct"}); err != nil {
						b.Fatal(err)
					}
					act = append(act, a)
				}
				now := time.Now()
				s := hosting.Share{ID: hosting.NewID(), AccountID: "acct", Name: "b", Kind: hosting.KindTCP, TargetAddress: "h", TargetPort: 1, Hosts: hosting.NewHosts(act, nil), CreatedAt: now, UpdatedAt: now}
				if err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error { return tx.Create(ctx, s) }); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					err := st.InTx(ctx, func(ctx context.Context, tx hosting.Tx) error {
						ss, err := tx.Lock(ctx, s.ID)
						if err != nil {
							return err
						}
						cur := ss[0]
						if i%2 == 1 {
							cur.Hosts = hosting.NewHosts(act[:1], act[1:])
						} else {
							cur.Hosts = hosting.NewHosts(act, nil)
						}
						return tx.Save(ctx, cur, now)
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
