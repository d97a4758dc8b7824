#!/usr/bin/env bash
# cross-check: the library packages (everything but internal/, examples/ and
# cmd/) build for every operating system and architecture an importer may
# target, and vet, tests included, as said below. 386 catches 64-bit atomics that are
# not 8-byte aligned on 32-bit platforms only through vet's type checks, so
# the code uses atomic.Int64/Uint64 (always aligned) instead of raw fields.
# darwin/386 does not exist in Go. Linux-only code (network namespaces, the
# kernel port reserver, CLOCK_BOOTTIME) sits behind build tags with a
# portable fallback.
#
# By default five targets build: one per operating system family besides
# linux/amd64 (darwin/arm64, windows/amd64, freebsd/amd64), linux/arm64
# (the other server architecture, with gVisor's arm64 code) and linux/386
# (the 32-bit check), and `go vet` (which also type-checks the tests) runs
# on linux/386 and the three other families. Each target is a whole compile
# of the dependency graph (gVisor, etcd, pebble, pgx) for its GOOS/GOARCH:
# 145-190 s on a cold 2-core machine, so the other combinations of an
# operating system and an architecture already covered (darwin/amd64,
# windows/arm64, windows/386, freebsd/arm64, freebsd/386) build only with
# VIPKIT_LONG=1, which also vets every target, linux/amd64 included.
# linux/amd64 is otherwise compiled by make test and vetted by make lint.
#
# Usage: scripts/cross-check.sh [GOOS/GOARCH...]   (given targets: build and vet)
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
vet=(linux/386 darwin/arm64 windows/amd64 freebsd/amd64)
if [ ${#targets[@]} -eq 0 ]; then
  # linux/amd64 is left out: make test compiles and make lint vets it.
  targets=(linux/arm64 linux/386 darwin/arm64 windows/amd64 freebsd/amd64)
  if [ "${VIPKIT_LONG:-}" = 1 ]; then
    targets=(linux/amd64 "${targets[@]}" darwin/amd64 windows/arm64 windows/386 freebsd/arm64 freebsd/386)
    vet=("${targets[@]}")
  fi
else
  vet=("${targets[@]}")
fi
mapfile -t pkgs < <(go list ./... | grep -v -e '/internal/' -e '/internal$' -e '/examples/' -e '/cmd/')

fails=0
all=$(date +%s)
for t in "${targets[@]}"; do
  start=$(date +%s)
  what=build
  export GOOS=${t%/*} GOARCH=${t#*/} CGO_ENABLED=0
  if out=$(go build "${pkgs[@]}" 2>&1) && {
    ! printf '%s\n' "${vet[@]}" | grep -qx "$t" || { what="build+vet" && out=$(go vet "${pkgs[@]}" 2>&1); }
  }; then
    echo "ok   $t $what ($(( $(date +%s) - start ))s)"
  else
    fails=$((fails + 1))
    echo "FAIL $t $what"
    printf '%s\n' "$out" | head -n 30 | sed 's/^/    /'
  fi
  unset GOOS GOARCH CGO_ENABLED
done
echo "cross-check: ${#targets[@]} targets built, ${#vet[@]} vetted, $fails failure(s), $(( $(date +%s) - all ))s"
[ "$fails" -eq 0 ]
