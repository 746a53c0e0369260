#!/usr/bin/env bash
# The CDC rig's PostgreSQL server (embedstream dev postgres): Debian's package, installed when missing.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ -n "${EMBEDSTREAM_PG_BIN:-}" ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "embedstream: installing PostgreSQL (apt-get install postgresql) for the CDC rig" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
else
  echo "embedstream: PostgreSQL server binaries not found; install them (apt-get install postgresql) or set" \
       "EMBEDSTREAM_PG_BIN, or deselect the CDC tests with -m 'not cdc'" >&2
fi
