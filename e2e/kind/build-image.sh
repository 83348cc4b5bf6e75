#!/usr/bin/env bash
# Builds the dlock image for the kind tier from host-built binaries (Dockerfile.prebuilt).
#
#   e2e/kind/build-image.sh IMAGE [PROFILE]     PROFILE: debug (default) or release
#
# The binaries are the workspace's (`cargo build --workspace --bins`, done by scripts/setup.sh);
# they are stripped of debug info on the way in, which keeps the image small enough to load fast.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
image="$1"
profile="${2:-debug}"
target="${CARGO_TARGET_DIR:-/var/tmp/dlock-cache/target}/$profile"
bins=(lock-server payment-resource rail-proxy rail-stub payout-executor dlock-migrate dlock-operator dlock-fastforward)

ctx="$(mktemp -d "${TMPDIR:-/tmp}/dlock-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin"
for b in "${bins[@]}"; do
    [[ -x "$target/$b" ]] || { echo "missing $target/$b (cargo build --workspace --bins)" >&2; exit 1; }
    objcopy --strip-debug "$target/$b" "$ctx/bin/$b"
done
cp -r "$root/migrations" "$ctx/migrations"
cp "$root/Dockerfile.prebuilt" "$ctx/Dockerfile"
DOCKER_BUILDKIT=0 nice -n 10 docker build -q --build-arg BASE=dlock-local/debian:bookworm -t "$image" "$ctx" >/dev/null
