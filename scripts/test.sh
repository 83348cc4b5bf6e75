#!/usr/bin/env bash
# Runs every test: unit, integration (real PostgreSQL 16 servers started by the test kit), and the
# cluster tier on a real kube-apiserver when its tools are installed.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$DLOCK_ROOT/scripts/setup.sh"
cd "$DLOCK_ROOT"
say "cargo test --workspace"
cargo test --workspace --all-targets --no-fail-fast 2>&1
