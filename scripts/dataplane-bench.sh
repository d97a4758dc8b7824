#!/usr/bin/env bash
# dataplane-bench: the whole data plane measured as a user would, against
# wireguard-go alone. Two network namespaces on one veth pair; iperf3 over TCP
# for 10 s with 1 and 4 streams, 3 runs of each (ROUNDS), interleaved, the
# order of wireguard-go and tsng alternating from round to round:
#
#   wg-go   wireguard-go (built from the module version vipkit requires) on a
#           kernel TUN in each namespace, iperf3 to the peer's overlay address
#   tsng    the reference agent in tun mode, iperf3 to the peer's overlay
#           address (the engine's pass-through path)
#   tsng-vip the same agents, iperf3 to a VIP whose backend is the peer
#           (the NAT path)
#
# For each run it prints the receiver's throughput and the CPU time of both
# daemons (from /proc, user+system) per GB received, then a Markdown table of
# medians and the ratios to wg-go. With PROFILE=1 (needs perf) it then
# samples both daemons with perf during one more 4-stream run of wg-go and
# of tsng-vip and writes the top symbols of each to
# $OUT/dataplane-profile.txt (OUT defaults to the current directory).
#
# With AA=1 each round also runs wireguard-go a second time (mode wg-go-2,
# fresh daemons): an A/A comparison that shows how far two sets of runs of
# the same program differ on this machine.
#
# Not a CI gate: it needs root, iproute2, iperf3 and python3 with the
# cryptography package, and it runs only with VIPKIT_LONG=1.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${VIPKIT_LONG:-}" != 1 ]; then
  echo "dataplane-bench: set VIPKIT_LONG=1 to run (about 5 minutes, root)" >&2
  exit 0
fi
for b in ip iperf3 python3; do
  command -v "$b" >/dev/null || { echo "dataplane-bench: needs $b" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "dataplane-bench: needs root" >&2; exit 1; }

work=$(mktemp -d /tmp/vipkit-dataplane.XXXXXX)
nsA=vkdpA$$ nsB=vkdpB$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # A process in a namespace outlives `ip netns del`: end the iperf3 server.
  [ -f "$work/iperf3.pid" ] && kill "$(cat "$work/iperf3.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  ip netns del "$nsA" 2>/dev/null || true
  ip netns del "$nsB" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== building tsng and wireguard-go (same module graph)" >&2
go build -o "$work/tsng" ./cmd/tsng
go build -o "$work/wireguard-go" golang.zx2c4.com/wireguard

ip netns add "$nsA"
ip netns add "$nsB"
ip link add "v$nsA" type veth peer name "v$nsB"
ip link set "v$nsA" netns "$nsA"
ip link set "v$nsB" netns "$nsB"
ip -n "$nsA" addr add 192.168.77.1/24 dev "v$nsA"
ip -n "$nsB" addr add 192.168.77.2/24 dev "v$nsB"
for ns in "$nsA" "$nsB"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "v$ns" up
  # Each run starts from the kernel's defaults, not from the TCP metrics
  # (ssthresh, RTT) that the previous mode's run left for the same peer.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_no_metrics_save=1
done
ip netns exec "$nsB" iperf3 -s -D -p 5201 --logfile "$work/iperf3-server.log" --pidfile "$work/iperf3.pid"

# Keys for both tools: Curve25519 (base64 and hex) and Ed25519 identities.
python3 - "$work" <<'EOF'
import base64, json, sys
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from cryptography.hazmat.primitives import serialization as s
raw = dict(encoding=s.Encoding.Raw, format=s.PrivateFormat.Raw, encryption_algorithm=s.NoEncryption())
pub = dict(encoding=s.Encoding.Raw, format=s.PublicFormat.Raw)
work = sys.argv[1]
keys = {}
for n in "ab":
    w, i = x25519.X25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    keys[n] = dict(wg=w.private_bytes(**raw), wgpub=w.public_key().public_bytes(**pub),
                   seed=i.private_bytes(**raw), id=i.public_key().public_bytes(**pub))
addr = {"a": "100.80.0.1", "b": "100.80.0.2"}
under = {"a": "192.168.77.1", "b": "192.168.77.2"}
for n, o in (("a", "b"), ("b", "a")):
    k, p = keys[n], keys[o]
    with open(f"{work}/wg-{n}.uapi", "w") as f:
        f.write(f"set=1\nprivate_key={k['wg'].hex()}\nlisten_port=51820\n"
                f"public_key={p['wgpub'].hex()}\nendpoint={under[o]}:51820\nallowed_ip={addr[o]}/32\n\n")
    cfg = {"data_dir": f"{work}/tsng-{n}", "socket": f"{work}/tsng-{n}.sock", "ui": "off", "log_level": "error",
           "networks": [{"name": "bench", "overlay": "100.80.0.0/24", "mode": "tun", "tun": f"tsng{n}",
                         "node": {"name": n, "address": addr[n], "identity_key": base64.b64encode(k["seed"]).decode(),
                                  "wireguard_key": base64.b64encode(k["wg"]).decode(), "listen_port": 51820},
                         "peers": [{"name": o, "address": addr[o], "identity": p["id"].hex(),
                                    "wireguard_key": base64.b64encode(p["wgpub"]).decode(),
                                    "endpoint": f"{under[o]}:51820"}]}]}
    with open(f"{work}/tsng-{n}.json", "w") as f:
        json.dump(cfg, f)
EOF

# warm DST: a 1 s run, retried until the handshake is up (at most 20 s).
warm() {
  for _ in $(seq 20); do
    ip netns exec "$nsA" iperf3 -c "$1" -p 5201 -t 1 >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "dataplane-bench: no iperf3 path to $1" >&2
  return 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# run NAME DST STREAMS PIDA PIDB: one 10 s iperf3 run; prints "NAME streams Gbit/s cpu-s/GB".
run() {
  local name=$1 dst=$2 streams=$3 pa=$4 pb=$5
  local c0 c1 out bytes secs
  local try
  for try in 1 2 3; do # the one-client server may still be busy with the last run
    c0=$(( $(cpu_ticks "$pa") + $(cpu_ticks "$pb") ))
    out=$(ip netns exec "$nsA" iperf3 -c "$dst" -p 5201 -t 10 -P "$streams" -J || true)
    c1=$(( $(cpu_ticks "$pa") + $(cpu_ticks "$pb") ))
    printf '%s' "$out" | grep -q '"sum_received"' && break
    echo "dataplane-bench: $name to $dst: $(printf '%s' "$out" | grep '"error"' || echo no output), retrying" >&2
    [ "$try" = 3 ] && return 1
    sleep 2
  done
  bytes=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bytes"])')
  secs=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["seconds"])')
  python3 -c "print('$name', $streams, round($bytes*8/$secs/1e9, 3), round(($c1-$c0)/$hz/($bytes/1e9), 3))"
}

start_wg() {
  for n in a b; do
    local ns=$nsA; [ $n = b ] && ns=$nsB
    ip netns exec "$ns" "$work/wireguard-go" -f "wg$n$$" >"$work/wg-$n.log" 2>&1 &
    pids+=($!)
    eval "wgpid_$n=$!"
    for _ in $(seq 100); do [ -S "/var/run/wireguard/wg$n$$.sock" ] && break; sleep 0.1; done
    python3 - "/var/run/wireguard/wg$n$$.sock" "$work/wg-$n.uapi" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(open(sys.argv[2], "rb").read())
r = s.recv(4096).decode()
assert "errno=0" in r, r
EOF
    local a=100.80.0.1; [ $n = b ] && a=100.80.0.2
    ip -n "$ns" addr add "$a/24" dev "wg$n$$"
    ip -n "$ns" link set "wg$n$$" mtu 1420 up
  done
}
stop_wg() {
  kill "$wgpid_a" "$wgpid_b"; wait "$wgpid_a" "$wgpid_b" 2>/dev/null || true
}
start_tsng() {
  for n in a b; do
    local ns=$nsA; [ $n = b ] && ns=$nsB
    ip netns exec "$ns" "$work/tsng" daemon --config "$work/tsng-$n.json" >"$work/tsng-$n.log" 2>&1 &
    pids+=($!)
    eval "tspid_$n=$!"
  done
  for n in a b; do
    for _ in $(seq 200); do "$work/tsng" --socket "$work/tsng-$n.sock" network list >/dev/null 2>&1 && break; sleep 0.1; done
  done
}
stop_tsng() {
  kill "$tspid_a" "$tspid_b"; wait "$tspid_a" "$tspid_b" 2>/dev/null || true
}

results=$work/results.txt
: >"$results"
vip=
wg_runs() { # STREAMS [NAME]
  start_wg
  warm 100.80.0.2
  run "${2:-wg-go}" 100.80.0.2 "$1" "$wgpid_a" "$wgpid_b" | tee -a "$results"
  stop_wg
}
tsng_runs() { # STREAMS
  start_tsng
  if [ -z "$vip" ]; then
    "$work/tsng" --socket "$work/tsng-a.sock" vip create bench iperf >/dev/null
    "$work/tsng" --socket "$work/tsng-a.sock" vip port add bench iperf tcp/5201 --backend b:5201 >/dev/null
  fi
  vip=$("$work/tsng" --socket "$work/tsng-a.sock" vip show bench iperf --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["addr"])')
  warm 100.80.0.2
  warm "$vip"
  run tsng 100.80.0.2 "$1" "$tspid_a" "$tspid_b" | tee -a "$results"
  run tsng-vip "$vip" "$1" "$tspid_a" "$tspid_b" | tee -a "$results"
  stop_tsng
}
# Odd rounds run wireguard-go first, even rounds tsng first, so that a
# drift within a round (the machine's load, its clock) does not always
# favour the same side.
for round in $(seq "${ROUNDS:-3}"); do
  for streams in 1 4; do
    if [ $((round % 2)) = 1 ]; then
      wg_runs "$streams"
      tsng_runs "$streams"
    else
      tsng_runs "$streams"
      wg_runs "$streams"
    fi
    # AA=1: wireguard-go once more, fresh daemons, as a mode of its own:
    # its ratio to wg-go is the measurement's own noise.
    if [ "${AA:-}" = 1 ]; then wg_runs "$streams" wg-go-2; fi
  done
done

# profile NAME DST PIDA PIDB: perf samples of both daemons during one
# 4-stream run, top symbols appended to the profile file.
prof=${OUT:-.}/dataplane-profile.txt
profile() {
  local name=$1 dst=$2 pa=$3 pb=$4
  perf record -q -F 999 -g -p "$pa,$pb" -o "$work/perf-$name.data" -- sleep 9 >/dev/null 2>&1 &
  local pp=$!
  run "$name" "$dst" 4 "$pa" "$pb" >/dev/null
  wait "$pp" || true
  {
    echo "== $name (4 streams): self time by symbol, both daemons"
    perf report -q -i "$work/perf-$name.data" --stdio --no-children --sort symbol -g none 2>/dev/null | awk 'NF && n++ < 40'
    echo
  } >>"$prof"
}
if [ "${PROFILE:-}" = 1 ] && command -v perf >/dev/null; then
  : >"$prof"
  start_wg
  warm 100.80.0.2
  profile wg-go 100.80.0.2 "$wgpid_a" "$wgpid_b"
  stop_wg
  start_tsng
  warm "$vip"
  profile tsng-vip "$vip" "$tspid_a" "$tspid_b"
  stop_tsng
  echo "profile: $prof" >&2
fi

echo
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, streams, gbps, cpu = line.split()
    rows.setdefault((name, int(streams)), []).append((float(gbps), float(cpu)))
print("| mode | streams | Gbit/s (median) | × wg-go | CPU s per GB received | × wg-go |")
print("| --- | --- | --- | --- | --- | --- |")
for streams in (1, 4):
    base = rows.get(("wg-go", streams))
    bt = statistics.median(r[0] for r in base); bc = statistics.median(r[1] for r in base)
    for name in ("wg-go", "wg-go-2", "tsng", "tsng-vip"):
        rs = rows.get((name, streams), [])
        if not rs:
            continue
        t = statistics.median(r[0] for r in rs); c = statistics.median(r[1] for r in rs)
        print(f"| {name} | {streams} | {t:.2f} | {t/bt:.2f} | {c:.2f} | {c/bc:.2f} |")
EOF
