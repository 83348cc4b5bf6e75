#!/bin/bash
# Starts PostgreSQL 16 the way the official postgres image's entrypoint does, for what dlock's
# operator uses: on an empty $PGDATA, initdb with superuser $POSTGRES_USER / $POSTGRES_PASSWORD
# (scram-sha-256 over TCP, trust on the local socket only), create $POSTGRES_DB, then run the
# server listening on every address. Started as root, it fixes the data directory's owner and
# drops to the postgres user (uid 999) first; postgres refuses to run as root.
set -euo pipefail

if [[ "${1:-postgres}" != postgres ]]; then exec "$@"; fi
[[ $# -gt 0 ]] && shift

: "${PGDATA:=/var/lib/postgresql/data}"
user="${POSTGRES_USER:-postgres}"

if [[ "$(id -u)" == 0 ]]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown 999:999 "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=999 --regid=999 --init-groups "$0" postgres "$@"
fi

if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set for a new data directory}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    # Every client is a pod of the cluster: password authentication from any address.
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    if [[ -n "${POSTGRES_DB:-}" && "$POSTGRES_DB" != postgres ]]; then
        # Single-user mode needs no socket, port or client.
        db="${POSTGRES_DB//\"/\"\"}"
        printf 'CREATE DATABASE "%s";\n' "$db" | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "docker-entrypoint: initialised $PGDATA (database ${POSTGRES_DB:-postgres})"
fi

exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
