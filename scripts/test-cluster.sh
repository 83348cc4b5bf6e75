#!/usr/bin/env bash
# The cluster tier in one command: install the tools (cached), build the binaries the tests run,
# start etcd + kube-apiserver on loopback, run the dlock-e2e tests against it, tear everything down.
#
#   scripts/test-cluster.sh                 all cluster-tier tests
#   scripts/test-cluster.sh operator        only tests whose name contains "operator" (cargo test filter)
#
# Env: DLOCK_TOOLS_DIR (tool cache), CARGO_TARGET_DIR (see scripts/lib.sh),
#      DLOCK_E2E_KEEP=1 (keep the cluster dir and the tests' scratch dirs for debugging),
#      RUST_TEST_THREADS (default 2: each operator test runs an operator and PostgreSQL databases).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$DLOCK_ROOT"

"$DLOCK_ROOT/scripts/cluster-tools.sh"
if [ -z "${DLOCK_PG_BIN:-}" ] && ! pg16_current "$DLOCK_TOOLS_DIR/pg16"; then
  say "PostgreSQL $PG_VERSION is missing: running scripts/setup.sh"
  "$DLOCK_ROOT/scripts/setup.sh"
fi

# Every binary, as the workspace builds them (the same features as `cargo test --workspace`, so
# after scripts/test.sh's run this builds nothing): the operator, its Jobs' binaries and
# kubectl-dlock for the cluster tier, and the services tests/monitoring.rs starts.
say "building the workspace's binaries and the e2e tests"
cargo build --workspace --bins
cargo test -p dlock-e2e --no-run
export DLOCK_E2E_BIN_DIR="$CARGO_TARGET_DIR/debug"
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}"

say "starting kube-apiserver + etcd and running the cluster tier"
DLOCK_E2E=1 "$DLOCK_ROOT/scripts/cluster-up.sh" -- cargo test -p dlock-e2e --no-fail-fast -- "$@"
