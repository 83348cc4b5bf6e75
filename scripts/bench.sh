#!/usr/bin/env bash
# Benchmarks (release build). `scripts/bench.sh lock --clients 16 --seconds 10`; record results in
# docs/benchmarks.md together with the machine they ran on.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$DLOCK_ROOT/scripts/setup.sh"
cd "$DLOCK_ROOT"
say "building release binaries"
cargo build --release --workspace --bins --quiet
if [ "${1:-}" = lock ]; then
  # etcd's own lock recipe, the reference row: a small Go program built into the tools cache with Go
  # and modules from the Go module proxy (never committed as a binary).
  command -v go >/dev/null || die "go is required for the etcd Mutex row (install Go >= 1.23)"
  say "building bench/etcd-mutex into $DLOCK_TOOLS_DIR/bin"
  mkdir -p "$DLOCK_TOOLS_DIR/bin"
  (cd "$DLOCK_ROOT/bench/etcd-mutex" &&
    GOMODCACHE="$DLOCK_TOOLS_DIR/go/mod" GOCACHE="$DLOCK_TOOLS_DIR/go/cache" GOPATH="$DLOCK_TOOLS_DIR/go/path" \
      GOFLAGS=-mod=readonly go build -o "$DLOCK_TOOLS_DIR/bin/etcd-mutex-bench" .)
fi
exec "$CARGO_TARGET_DIR/release/dlock-dev" bench "$@"
