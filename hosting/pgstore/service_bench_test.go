package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/zititest"
	"github.com/vipkit/vipkit/internal/testenv"
	"github.com/vipkit/vipkit/internal/zitifake"
)

// stack is the service on PostgreSQL and the model controller.
type stack struct {
	pool *pgxpool.Pool
	fake *zititest.Fake
	st   *pgstore.Store
	svc  *hosting.Service
}

func newStack(b *testing.B) *stack {
	b.Helper()
	if server == nil {
		testenv.Skip(b, "PostgreSQL: %v", startErr)
	}
	f := zitifake.Start(b, zititest.Options{})
	pool := poolTB(b, "")
	st := pgstore.New(pool, pgstore.Options{})
	p, err := hosting.NewProjection(f.Client(), hosting.ProjectionOptions{FrontdoorID: "fd", HealthCheck: hosting.HealthCheck{Interval: 5 * time.Second, Timeout: 2 * time.Second, Failures: 3}})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := hosting.NewService(hosting.Options{Store: st, Projection: p, Outbox: true})
	if err != nil {
		b.Fatal(err)
	}
	return &stack{pool: pool, fake: f, st: st, svc: svc}
}

func (s *stack) agents(b *testing.B, ids ...string) {
	for _, id := range ids {
		if err := s.st.PutAgent(context.Background(), hosting.Agent{ID: id, AccountID: "acct"}); err != nil {
			b.Fatal(err)
		}
		s.fake.AddIdentity(id)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkAPI measures creates and updates through the HTTP API, on
// PostgreSQL with the model controller over loopback HTTP, at 1, 2, 4 and
// 8 concurrent clients: throughput (ops/s), the p50 and p99 latency of one
// request, the Ziti calls per operation, and the CPU time per operation of
// this process (API, service, client and model controller together) and of
// the PostgreSQL server, with the machine's CPU use (cpu-%, of every core).
// A create writes the host.v1, the service, the standby config, the
// passive's override and the bind policy; an update swaps the active and
// the passive (override moved, two rebinds).
//
// Run it with a fixed count (-benchtime=400x), so that every client count
// leaves the same number of objects in the controller; scripts/hosting-load.sh
// runs it in rounds and prints the table. With VIPKIT_BENCH_PGWAITS=1 it
// also samples pg_stat_activity every 5 ms and logs what the sessions were
// waiting for (pg-lock-waits is the mean number of sessions waiting for a
// lock). pool-waits/op counts the acquires that found the pgx pool empty.
func BenchmarkAPI(b *testing.B) {
	for _, op := range []string{"create", "update"} {
		for _, clients := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("op=%s/clients=%d", op, clients), func(b *testing.B) {
				s := newStack(b)
				s.agents(b, "a1", "p1")
				h, err := api.New(api.Options{Service: s.svc})
				if err != nil {
					b.Fatal(err)
				}
				srv := httptest.NewServer(h)
				defer srv.Close()
				hc := srv.Client()
				hc.Transport.(*http.Transport).MaxIdleConnsPerHost = clients
				col := srv.URL + "/accounts/acct/tcp-shares"
				send := func(method, url, body string, want int) error {
					req, _ := http.NewRequest(method, url, bytes.NewReader([]byte(body)))
					req.Header.Set("Content-Type", "application/json")
					resp, err := hc.Do(req)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					if resp.StatusCode != want {
						return fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, b)
					}
					return nil
				}
				create := `{"name":"db","targetAddress":"10.0.0.5","targetPort":5432,"activeAgentIds":["a1"],"passiveAgentIds":["p1"]}`
				// One share per client for updates, so that clients do not
				// queue on one share's lock.
				var ids []string
				if op == "update" {
					for c := 0; c < clients; c++ {
						sh, err := s.svc.Create(context.Background(), hosting.Share{AccountID: "acct", Name: "db", Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
							hosting.Update{Active: hosting.Of("a1"), Passive: hosting.Of("p1")})
						if err != nil {
							b.Fatal(err)
						}
						ids = append(ids, sh.ID)
					}
				}
				lat := make([][]time.Duration, clients)
				errs := make([]error, clients)
				per := (b.N + clients - 1) / clients
				s.fake.ResetCalls()
				var ws *waitSampler
				if os.Getenv("VIPKIT_BENCH_PGWAITS") == "1" {
					ws = startWaitSampler(s.pool, 5*time.Millisecond)
				}
				b.ResetTimer()
				cpu0, pg0 := selfCPU(), pgCPU(filepath.Join(server.Dir, "data"))
				ps0 := s.pool.Stat()
				start := time.Now()
				var wg sync.WaitGroup
				for c := 0; c < clients; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < per && errs[c] == nil; i++ {
							t0 := time.Now()
							if op == "create" {
								errs[c] = send("POST", col, create, 201)
							} else {
								body := `{"activeAgentIds":["p1"],"passiveAgentIds":["a1"]}`
								if i%2 == 1 {
									body = `{"activeAgentIds":["a1"],"passiveAgentIds":["p1"]}`
								}
								errs[c] = send("PATCH", col+"/"+ids[c], body, 200)
							}
							lat[c] = append(lat[c], time.Since(t0))
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				cpu, pg := selfCPU()-cpu0, pgCPU(filepath.Join(server.Dir, "data"))-pg0
				ps := s.pool.Stat()
				// Acquires that found no idle connection and waited for one
				// (or dialled): a pool too small for the clients.
				poolWaits := ps.EmptyAcquireCount() - ps0.EmptyAcquireCount()
				b.StopTimer()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
				all := slices.Concat(lat...)
				n := float64(len(all))
				b.ReportMetric(n/elapsed.Seconds(), "ops/s")
				b.ReportMetric(float64(percentile(all, 0.50).Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(percentile(all, 0.99).Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(len(s.fake.Calls()))/n, "ziti-calls/op")
				b.ReportMetric(float64(cpu.Microseconds())/1000/n, "go-cpu-ms/op")
				b.ReportMetric(float64(pg.Microseconds())/1000/n, "pg-cpu-ms/op")
				b.ReportMetric(float64(poolWaits)/n, "pool-waits/op")
				b.ReportMetric(100*(cpu+pg).Seconds()/elapsed.Seconds()/float64(runtime.NumCPU()), "cpu-%")
				if ws != nil {
					states, samples := ws.Stop()
					b.ReportMetric(lockWaits(states), "pg-lock-waits")
					b.Logf("pg_stat_activity, %d samples, sessions per sample: %s", samples, strings.Join(states, "; "))
				}
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkCascade1000 measures the cascade of one agent that hosts 1,000
// shares, in one transaction on PostgreSQL with the model controller: as
// their only host (every share deleted) and beside another active (every
// share updated). It reports the cascade's time and its Ziti calls.
func BenchmarkCascade1000(b *testing.B) {
	const n = 1000
	for _, shape := range []string{"sole-host", "with-another-active"} {
		b.Run(shape, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s := newStack(b)
				s.agents(b, "gone", "stays")
				act := []string{"gone"}
				if shape == "with-another-active" {
					act = append(act, "stays")
				}
				for k := 0; k < n; k++ {
					if _, err := s.svc.Create(context.Background(), hosting.Share{AccountID: "acct", Name: fmt.Sprint("s", k), Kind: hosting.KindTCP, TargetAddress: "10.0.0.5", TargetPort: 5432},
						hosting.Update{Active: hosting.Of(act...)}); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.st.PutAgent(context.Background(), hosting.Agent{ID: "gone", AccountID: "acct", Deleted: true}); err != nil {
					b.Fatal(err)
				}
				s.fake.ResetCalls()
				b.StartTimer()
				t0 := time.Now()
				evs, err := s.svc.RemoveDeletedAgent(context.Background(), "gone")
				d := time.Since(t0)
				b.StopTimer()
				if err != nil || len(evs) != n {
					b.Fatalf("%d events, %v", len(evs), err)
				}
				calls := s.fake.Calls()
				writes := 0
				for _, c := range calls {
					if c.Method != http.MethodGet {
						writes++
					}
				}
				b.ReportMetric(d.Seconds(), "s/cascade")
				b.ReportMetric(float64(len(calls)), "ziti-calls")
				b.ReportMetric(float64(writes), "ziti-writes")
				b.ReportMetric(float64(len(calls))/n, "ziti-calls/share")
				b.StartTimer()
			}
		})
	}
}
