#!/bin/bash
# initdb on an empty PGDATA (superuser POSTGRES_USER, default postgres, with POSTGRES_PASSWORD; database
# POSTGRES_DB; then the *.sql, *.sql.gz and *.sh files of /docker-entrypoint-initdb.d in name order), then
# the server: `postgres [-c name=value ...]`, listening on every interface with password authentication
# for connections from other hosts. Runs as the postgres user (it switches when started as root).
set -euo pipefail
if [ "${1:-postgres}" != "postgres" ] && [ "${1:0:1}" != "-" ]; then exec "$@"; fi
[ "${1:-}" = "postgres" ] && shift
if [ "$(id -u)" = "0" ]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 0700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" postgres "$@"
fi

user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "error: the database is uninitialized and POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" ${POSTGRES_INITDB_ARGS:-}
  rm -f "$pwfile"
  printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  # initialisation on the Unix socket only, so nothing connects before it is done
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start
  if [ "$db" != "postgres" ]; then
    psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$user" -d postgres -c "CREATE DATABASE \"$db\""
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sql) echo "running $f"; psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$user" -d "$db" -f "$f" ;;
      *.sql.gz) echo "running $f"; gunzip -c "$f" | psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$user" -d "$db" ;;
      *.sh) echo "running $f"; . "$f" ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop
  echo "PostgreSQL init process complete; ready for start up."
fi
exec postgres -c listen_addresses='*' "$@"
