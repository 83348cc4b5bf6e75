#!/usr/bin/env bash
# Runs every test: unit and integration tests against real PostgreSQL 16 servers started by the test
# kit, the cross-process proof, then the cluster tier on a real kube-apiserver + etcd (tools are
# built once and cached in $DLOCK_TOOLS_DIR; the first build of kube-apiserver takes ~15 minutes).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$DLOCK_ROOT/scripts/setup.sh"
cd "$DLOCK_ROOT"
say "cargo test --workspace"
# setup.sh built etcdutl: the etcd snapshot-restore test must run here, not skip.
export DLOCK_REQUIRE_ETCDUTL=1
# setup.sh installed schemathesis: the API fuzz run (services/testkit/tests/api_fuzz.rs) must run too.
export DLOCK_REQUIRE_SCHEMATHESIS=1
cargo test --workspace --all-targets --no-fail-fast 2>&1
if [ "${DLOCK_SKIP_CLUSTER:-0}" = 1 ]; then
  say "DLOCK_SKIP_CLUSTER=1: cluster tier not run"
else
  say "cluster tier (kube-apiserver + etcd on loopback)"
  "$DLOCK_ROOT/scripts/test-cluster.sh"
fi
say "kind tier (the stack in pods: e2e/kind/run.sh; its tools are built once per machine; skipped where Docker cannot run, unless CI is set: then that fails the run)" && "$DLOCK_ROOT/e2e/kind/run.sh"
