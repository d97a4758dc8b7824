#!/usr/bin/env bash
# importer-check: vipkit as a developer of another tunneler sees it. For each
# case it creates a fresh module outside the repository that imports vipkit
# through a replace directive, then runs `go mod tidy`, `go build` and
# `go vet` there. Cases: every public package alone, all of them together,
# and every pair among the packages with heavy dependency graphs (pebble,
# etcd, gVisor, wireguard-go, pgx), added one after the other in both orders
# with a tidy after each, as a developer adds imports.
#
# It also checks that go.mod's go directive is the lowest one the selected
# dependencies allow, and reports which of the examples' dependencies end up
# in a library-only importer's go.sum.
#
# Usage: scripts/importer-check.sh [repo-dir]   (default: this repository)
# The module cache and build cache are shared with the caller's, so a warm
# run takes a minute or two; a cold one downloads what tidy needs.
set -euo pipefail

repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/vipkit-importer.XXXXXX")
trap 'rm -rf "$work"' EXIT

export GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
gover=$(cd "$repo" && go mod edit -json | sed -n 's/^\t"Go": "\(.*\)",*$/\1/p')
mod=github.com/vipkit/vipkit

# The public packages: everything but internal/, examples/ and cmd/.
mapfile -t pkgs < <(cd "$repo" && go list ./... | grep -v -e '/internal/' -e '/examples/' -e '/cmd/' -e '/internal$')
heavy=(crdt/pebblestore claim/etcdkv transport/netstack transport/wg hosting/pgstore hosting)

fails=0
n=0
# check NAME STEP...: one fresh importer module that adds the packages of each
# STEP (a space-separated list) in order, running `go mod tidy` after each
# step as a developer does, then builds and vets the result.
check() {
  local name=$1; shift
  local dir=$work/$name
  mkdir -p "$dir"
  {
    echo "module example.com/importer"
    echo
    echo "go $gover"
    echo
    echo "require $mod v0.0.0"
    echo
    echo "replace $mod => $repo"
  } >"$dir/go.mod"
  n=$((n + 1))
  local out="" step p i=0
  for step in "$@"; do
    i=$((i + 1))
    {
      echo "package main"
      echo
      echo "import ("
      for p in $step; do echo "	_ \"$p\""; done
      echo ")"
    } >"$dir/import$i.go"
    if ! out=$(cd "$dir" && go mod tidy 2>&1); then
      fails=$((fails + 1))
      echo "FAIL $name: go mod tidy after adding $step"
      printf '%s\n' "$out" | tail -n 12 | sed 's/^/    /'
      return 0
    fi
  done
  echo "func main() {}" >>"$dir/import1.go"
  if ! out=$(cd "$dir" && go build ./... 2>&1 && go vet ./... 2>&1); then
    fails=$((fails + 1))
    echo "FAIL $name: build or vet"
    printf '%s\n' "$out" | tail -n 12 | sed 's/^/    /'
    return 0
  fi
  echo "ok   $name"
}

start=$(date +%s)
for p in "${pkgs[@]}"; do
  check "alone-$(echo "${p#$mod/}" | tr / _)" "$p"
done
check all "${pkgs[*]}"
for ((i = 0; i < ${#heavy[@]}; i++)); do
  for ((j = i + 1; j < ${#heavy[@]}; j++)); do
    a=${heavy[i]} b=${heavy[j]}
    check "pair-${a//\//_}+${b//\//_}" "$mod/$a" "$mod/$b"
    check "pair-${b//\//_}+${a//\//_}" "$mod/$b" "$mod/$a"
  done
done

# The go directive: the lowest version every selected module allows.
# (On a copy of go.mod and go.sum: listing the whole graph records go.mod
# hashes that a tidy go.sum does not hold, and the repository stays as is.)
cp "$repo/go.mod" "$work/repo.mod"
cp "$repo/go.sum" "$work/repo.sum"
need=$(cd "$repo" && go list -modfile="$work/repo.mod" -m -f '{{.GoVersion}}' all | grep . | sort -V | tail -n 1)
if [ "$need" != "$gover" ]; then
  fails=$((fails + 1))
  echo "FAIL go directive: go.mod says go $gover, the dependencies need only go $need"
else
  echo "ok   go directive $gover (the highest go line among the selected modules)"
fi

# What the examples' dependencies leave in a library-only importer's go.sum:
# a "/go.mod" line is a hash of a go.mod that the module graph reads; an "h1:"
# line on the module itself means its source is part of the importer's build
# or of a dependency's test.
for m in github.com/chromedp/chromedp github.com/jackc/pgx/v5 go.etcd.io/etcd/server/v3 github.com/getkin/kin-openapi; do
  full=$(grep -c "^$m v[^ /]* h1:" "$work/all/go.sum" || true)
  gomod=$(grep -c "^$m v[^ ]*/go.mod h1:" "$work/all/go.sum" || true)
  echo "info go.sum of the all-packages importer: $m: $full source hash(es), $gomod go.mod hash(es)"
done

echo "importer-check: $n modules, $fails failure(s), $(( $(date +%s) - start ))s"
[ "$fails" -eq 0 ]
