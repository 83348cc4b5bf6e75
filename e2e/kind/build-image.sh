#!/usr/bin/env bash
# Builds the dlock image for the kind tier from host-built binaries (Dockerfile.prebuilt).
#
#   e2e/kind/build-image.sh IMAGE [PROFILE] [--version V] [--paydb-migration FILE]
#
#   PROFILE            debug (default) or release
#   --version V        the image's org.opencontainers.image.version label (default: the workspace's)
#   --paydb-migration  one more paydb migration, in this image only: FILE (plain SQL) becomes the next
#                      versioned migration after the highest in migrations/paydb, named
#                      V<n>__<FILE's name>. The kind tier's upgrade image (step upgrade) is built so.
#
# The binaries are the workspace's (`cargo build --workspace --bins`, done by scripts/setup.sh);
# they are stripped of debug info on the way in, which keeps the image small enough to load fast.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
image="$1"
profile="${2:-debug}"
shift $(($# < 2 ? $# : 2))
version="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")"
extra=""
while (($#)); do
    case "$1" in
    --version) version="$2"; shift 2 ;;
    --paydb-migration) extra="$2"; shift 2 ;;
    *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
target="${CARGO_TARGET_DIR:-/var/tmp/dlock-cache/target}/$profile"
bins=(lock-server payment-resource rail-proxy rail-stub payout-executor dlock-migrate dlock-operator dlock-fastforward kubectl-dlock dlock)

ctx="$(mktemp -d "${TMPDIR:-/tmp}/dlock-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin"
for b in "${bins[@]}"; do
    [[ -x "$target/$b" ]] || { echo "missing $target/$b (cargo build --workspace --bins)" >&2; exit 1; }
    objcopy --strip-debug "$target/$b" "$ctx/bin/$b"
done
cp -r "$root/migrations" "$ctx/migrations"
if [[ -n "$extra" ]]; then
    [[ -f "$extra" ]] || { echo "build-image.sh: no migration file $extra" >&2; exit 1; }
    last="$(find "$ctx/migrations/paydb" -name 'V*__*.sql' -printf '%f\n' | sed 's/^V\([0-9]*\)__.*/\1/' | sort -n | tail -n1)"
    cp "$extra" "$ctx/migrations/paydb/V$((last + 1))__$(basename "$extra")"
fi
cp "$root/Dockerfile.prebuilt" "$ctx/Dockerfile"
DOCKER_BUILDKIT=0 nice -n 10 docker build -q --build-arg BASE=dlock-local/debian:bookworm \
    --build-arg VERSION="$version" -t "$image" "$ctx" >/dev/null
