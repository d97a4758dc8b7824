#!/usr/bin/env bash
# hosting-load.sh: the hosting service's throughput at 1, 2, 4 and 8
# concurrent API clients, on real PostgreSQL (hosting/pgstore/pgtest) and
# the model Ziti controller (hosting/zititest), from BenchmarkAPI in
# hosting/pgstore.
#
# Usage:
#   VIPKIT_ZITI_SPEC=/work/shared/ziti/management.yml \
#     scripts/hosting-load.sh [-r ROUNDS] [-n OPS] [-b BASE_REF] [-p] [-w]
#
#   -r ROUNDS   rounds of the whole benchmark (default 3); the table shows
#               the median of the rounds
#   -n OPS      operations per client count and op (default 400; the
#               same count at every client count, so that each leaves as
#               many objects in the controller)
#   -b BASE_REF also build BASE_REF's code (git archive) with this
#               checkout's benchmark files copied in, and run it in turn
#               with this checkout, round by round (base, head, base, head
#               ...), so that both see the same load on a shared machine
#   -p          after the rounds, profile one pass of each op at 1 and 8
#               clients (CPU) and print the model controller's share of
#               this process's CPU (samples under zititest.(*Fake).serve)
#   -w          sample pg_stat_activity during the runs
#               (VIPKIT_BENCH_PGWAITS=1): mean sessions waiting for a lock
#
# Columns: ops/s; the ratio to the same variant's 1-client rate; p50 and
# p99 latency of one request (ms); cpu% is this process and the
# PostgreSQL server together, as a share of every core of the machine;
# go and pg are CPU ms per operation in the Go process (API, service,
# client and model controller) and in PostgreSQL; locks is the mean number
# of sessions waiting for a lock (with -w), pool the acquires per
# operation that found the pgx pool (8 connections) empty.
#
# The raw benchmark output goes to $OUT (default /tmp/hosting-load), one
# file per variant and round.
set -euo pipefail

rounds=3 ops=400 base="" profile=0 waits=0
while getopts "r:n:b:pw" o; do
	case $o in
	r) rounds=$OPTARG ;;
	n) ops=$OPTARG ;;
	b) base=$OPTARG ;;
	p) profile=1 ;;
	w) waits=1 ;;
	*) sed -n '2,30p' "$0"; exit 2 ;;
	esac
done
: "${VIPKIT_ZITI_SPEC:?set VIPKIT_ZITI_SPEC to management.yml}"
export VIPKIT_ZITI_SPEC
[ "$waits" = 1 ] && export VIPKIT_BENCH_PGWAITS=1

root=$(git rev-parse --show-toplevel)
out=${OUT:-/tmp/hosting-load}
mkdir -p "$out"
rm -f "$out"/*.txt

variants=(head)
go test -c -o "$out/head.test" "$root/hosting/pgstore"
if [ -n "$base" ]; then
	src=$(mktemp -d)
	trap 'rm -rf "$src"' EXIT
	git -C "$root" archive "$base" | tar -x -C "$src"
	cp "$root/hosting/pgstore/service_bench_test.go" "$root"/hosting/pgstore/loadstat*_test.go "$src/hosting/pgstore/"
	(cd "$src" && go test -c -o "$out/base.test" ./hosting/pgstore)
	variants=(base head)
fi

# The test binary finds its testdata relative to the package directory.
cd "$root/hosting/pgstore"
for r in $(seq 1 "$rounds"); do
	for v in "${variants[@]}"; do
		echo "round $r: $v" >&2
		"$out/$v.test" -test.run '^$' -test.bench '^BenchmarkAPI$' -test.benchtime "${ops}x" \
			-test.timeout 900s >"$out/$v-$r.txt" 2>&1 || { cat "$out/$v-$r.txt" >&2; exit 1; }
	done
done

# One line per benchmark result: variant op clients metric=value...
for v in "${variants[@]}"; do
	cat "$out/$v"-*.txt | awk -v v="$v" '
	/^BenchmarkAPI\/op=/ {
		split($1, p, "/"); op = substr(p[2], 4); c = p[3]; sub(/^clients=/, "", c); sub(/-[0-9]+$/, "", c)
		line = v " " op " " c
		for (i = 3; i < NF; i += 2) line = line " " $(i+1) "=" $i
		print line
	}'
done >"$out/all.lines"

awk '
function median(key, m,   n, a, i, j, t) {
	n = cnt[key, m]
	for (i = 1; i <= n; i++) a[i] = val[key, m, i]
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	if (n == 0) return 0
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
	key = $1 SUBSEP $2 SUBSEP $3
	if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
	for (i = 4; i <= NF; i++) {
		split($i, kv, "="); m = kv[1]
		val[key, m, ++cnt[key, m]] = kv[2]
	}
}
END {
	printf "%-5s %-6s %7s %8s %6s %8s %8s %6s %6s %6s %6s %6s\n", "code", "op", "clients", "ops/s", "ratio", "p50-ms", "p99-ms", "cpu%", "go", "pg", "locks", "pool"
	for (k = 1; k <= nk; k++) {
		key = order[k]; split(key, f, SUBSEP)
		ops = median(key, "ops/s")
		one = median(f[1] SUBSEP f[2] SUBSEP "1", "ops/s")
		printf "%-5s %-6s %7s %8.1f %5.2fx %8.1f %8.1f %6.0f %6.2f %6.2f %6.2f %6.2f\n", f[1], f[2], f[3], ops, (one > 0 ? ops / one : 0),
			median(key, "p50-ms"), median(key, "p99-ms"), median(key, "cpu-%"), median(key, "go-cpu-ms/op"), median(key, "pg-cpu-ms/op"), median(key, "pg-lock-waits"), median(key, "pool-waits/op")
	}
	printf "(median of %d rounds per row)\n", cnt[order[1], "ops/s"]
}' "$out/all.lines"

if [ "$profile" = 1 ]; then
	echo
	echo "model controller's share of the Go process's CPU (head):"
	for op in create update; do
		for c in 1 8; do
			"$out/head.test" -test.run '^$' -test.bench "^BenchmarkAPI\$/^op=$op\$/^clients=$c\$" -test.benchtime "${ops}x" \
				-test.timeout 900s -test.cpuprofile "$out/$op-$c.prof" >/dev/null 2>&1
			# Of the samples outside the specification's loading (once,
			# at the model controller's start).
			share=$(go tool pprof -top -cum -nodecount=100000 "$out/head.test" "$out/$op-$c.prof" 2>/dev/null | awk '
				function sec(v) { if (v ~ /ms$/) return substr(v, 1, length(v) - 2) / 1000; if (v ~ /us$/) return 0; sub(/s$/, "", v); return v + 0 }
				/Total samples/ { for (i = 1; i <= NF; i++) if ($i == "=") total = sec($(i + 1)) }
				/zititest\.\(\*Fake\)\.serve$/ && !fake { fake = sec($4) }
				/zititest\.loadSpec$/ && !spec { spec = sec($4) }
				END { if (total - spec > 0) printf "%.0f%% of %.2fs", 100 * fake / (total - spec), total - spec }')
			echo "  $op clients=$c: ${share:-?}"
		done
	done
fi
