#!/usr/bin/env bash
# Benchmarks (release build). `scripts/bench.sh lock --clients 16 --seconds 10`; record results in
# docs/benchmarks.md together with the machine they ran on.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$DLOCK_ROOT/scripts/setup.sh"
cd "$DLOCK_ROOT"
say "building release binaries"
cargo build --release --workspace --bins --quiet
exec "$CARGO_TARGET_DIR/release/dlock" bench "$@"
