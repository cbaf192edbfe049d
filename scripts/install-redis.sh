#!/usr/bin/env bash
# Installs redis-server (Debian's package) for the bench/ module's Redis
# comparison. Idempotent: does nothing when redis-server is already on PATH;
# installs with apt-get only when running as root, and otherwise says how.
#
#   scripts/install-redis.sh
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "redis-server is missing; install Debian's package as root: apt-get install -y redis-server" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# The package may start a system service on the default port; the benchmark
# starts its own server on a free loopback port and needs none.
command -v redis-server >/dev/null
