#!/usr/bin/env bash
# Installs the system packages vipkit's tests need when they are missing:
# PostgreSQL (hosting's store tests start their own server), RabbitMQ
# (hosting's event tests start their own broker), Chromium (the web editor's
# tests), iproute2 (network namespaces), systemd (systemd-analyze verifies
# keel-vip's and tsng's units), wireguard-tools (`wg show` reads tsng's UAPI
# socket), dnsutils (`dig +tcp` queries tsng's DNS), curl
# (`curl --socks5-hostname` through tsng's proxy) and python3 (the web
# server of the README's quick start). Needs root and apt;
# elsewhere it only says what
# is missing, and the tests that need it skip (or fail under
# VIPKIT_REQUIRE_ALL=1).
set -euo pipefail

missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing+=(rabbitmq-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v wg >/dev/null 2>&1 || missing+=(wireguard-tools)
command -v dig >/dev/null 2>&1 || missing+=(dnsutils)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v python3 >/dev/null 2>&1 || missing+=(python3)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "deps: missing ${missing[*]}; install them (as root, with apt-get) or the tests that need them skip" >&2
  exit 0
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No system service starts during the install (the tests start their own
# PostgreSQL and RabbitMQ): a policy-rc.d that denies every start, unless
# one is already in place.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Under systemd, keep the broker and its epmd socket from starting later.
if [ -d /run/systemd/system ]; then
  systemctl disable --now rabbitmq-server.service epmd.socket epmd.service >/dev/null 2>&1 || true
fi
