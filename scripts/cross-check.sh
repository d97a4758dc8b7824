#!/usr/bin/env bash
# cross-check: the library packages (everything but internal/, examples/ and
# cmd/) build and vet, tests included, for every operating system and
# architecture an importer may target. 386 catches 64-bit atomics that are
# not 8-byte aligned on 32-bit platforms only through vet's type checks, so
# the code uses atomic.Int64/Uint64 (always aligned) instead of raw fields.
# darwin/386 does not exist in Go. Linux-only code (network namespaces, the
# kernel port reserver, CLOCK_BOOTTIME) sits behind build tags with a
# portable fallback.
#
# Usage: scripts/cross-check.sh [GOOS/GOARCH...]
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(linux/amd64 linux/arm64 linux/386
    darwin/amd64 darwin/arm64
    windows/amd64 windows/arm64 windows/386
    freebsd/amd64 freebsd/arm64 freebsd/386)
fi
mapfile -t pkgs < <(go list ./... | grep -v -e '/internal/' -e '/internal$' -e '/examples/' -e '/cmd/')

fails=0
for t in "${targets[@]}"; do
  start=$(date +%s)
  if out=$(GOOS=${t%/*} GOARCH=${t#*/} CGO_ENABLED=0 go build "${pkgs[@]}" 2>&1 &&
    GOOS=${t%/*} GOARCH=${t#*/} CGO_ENABLED=0 go vet "${pkgs[@]}" 2>&1); then
    echo "ok   $t ($(( $(date +%s) - start ))s)"
  else
    fails=$((fails + 1))
    echo "FAIL $t"
    printf '%s\n' "$out" | head -n 30 | sed 's/^/    /'
  fi
done
[ "$fails" -eq 0 ]
