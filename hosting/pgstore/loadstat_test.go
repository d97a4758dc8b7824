package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The load benchmark's measurements of CPU and of PostgreSQL's waits. They
// read /proc and getrusage, so they report zero where those are missing.

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times; Linux fixes
// it at 100 for user space.
const clockTicks = 100

// procStat returns the ppid and the utime, stime, cutime and cstime (in
// clock ticks) of pid.
func procStat(pid int) (ppid int, t [4]int64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, t, false
	}
	// The command sits in parentheses and may hold spaces: split after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, t, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); ppid is field 4, utime..cstime fields 14-17.
	if len(f) < 15 {
		return 0, t, false
	}
	ppid, _ = strconv.Atoi(f[1])
	for k := 0; k < 4; k++ {
		t[k], _ = strconv.ParseInt(f[11+k], 10, 64)
	}
	return ppid, t, true
}

// pgCPU is the CPU time of the PostgreSQL server whose data directory is
// dataDir: the postmaster, its reaped children and its live children.
func pgCPU(dataDir string) time.Duration {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	master, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0
	}
	_, mt, ok := procStat(master)
	if !ok {
		return 0
	}
	ticks := mt[0] + mt[1] + mt[2] + mt[3]
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == master {
			continue
		}
		if pp, t, ok := procStat(pid); ok && pp == master {
			ticks += t[0] + t[1]
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// waitSampler samples pg_stat_activity of one database every period, on a
// connection of its own, and counts what the other sessions were doing:
// "active/CPU" (running), "active/Lock:transactionid" (a row lock wait),
// "idle in transaction/Client:ClientRead" (a transaction waiting for its
// client, here for the Ziti calls made inside it), and so on.
type waitSampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	// +checklocks:mu
	counts map[string]int
	// +checklocks:mu
	samples int
}

// The sampler's connection is its own, not one of pool's, so that it
// takes no connection from the clients; its queries count in the
// server's CPU, so a run that samples reports a little more pg time.
func startWaitSampler(pool *pgxpool.Pool, period time.Duration) *waitSampler {
	w := &waitSampler{stop: make(chan struct{}), done: make(chan struct{}), counts: map[string]int{}}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			rows, err := conn.Query(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '')
				FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
			if err != nil {
				return
			}
			var got []string
			for rows.Next() {
				var st, typ, ev string
				if rows.Scan(&st, &typ, &ev) == nil {
					if st == "idle" {
						continue // a pooled connection not in use
					}
					got = append(got, st+"/"+typ+":"+ev)
				}
			}
			rows.Close()
			w.mu.Lock()
			w.samples++
			for _, g := range got {
				w.counts[g]++
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// Stop ends the sampling and returns the mean number of sessions in each
// state (sessions per sample), largest first, and the number of samples.
func (w *waitSampler) Stop() ([]string, int) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k, n := range w.counts {
		out = append(out, fmt.Sprintf("%.2f %s", float64(n)/float64(max(1, w.samples)), k))
	}
	slices.SortFunc(out, func(a, b string) int {
		fa, _ := strconv.ParseFloat(strings.Fields(a)[0], 64)
		fb, _ := strconv.ParseFloat(strings.Fields(b)[0], 64)
		switch {
		case fa > fb:
			return -1
		case fa < fb:
			return 1
		}
		return strings.Compare(a, b)
	})
	return out, w.samples
}

// lockWaits is the mean number of sessions waiting for a heavyweight lock
// (a row, a transaction id, an advisory lock) per sample.
func lockWaits(states []string) float64 {
	var n float64
	for _, s := range states {
		f := strings.Fields(s)
		if len(f) == 2 && strings.Contains(f[1], "/Lock:") {
			v, _ := strconv.ParseFloat(f[0], 64)
			n += v
		}
	}
	return n
}
