#!/usr/bin/env bash
# Runs every test: unit and integration tests against real PostgreSQL 16 servers started by the test
# kit, the cross-process proof, then the cluster tier on a real kube-apiserver + etcd (tools are
# built once and cached in $DLOCK_TOOLS_DIR; the first build of kube-apiserver takes about 3 minutes
# on a quiet 2-core machine).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Everything this command does not install itself, checked first: a missing piece fails here, in
# seconds, naming what to install, not half an hour in.
"$DLOCK_ROOT/scripts/prereqs.sh" test
"$DLOCK_ROOT/scripts/setup.sh"
cd "$DLOCK_ROOT"
# The chart's alerts and dashboard are rendered with helm and checked with promtool
# (e2e/tests/monitoring.rs): both built with Go once into $DLOCK_TOOLS_DIR, and required here.
"$DLOCK_ROOT/scripts/cluster-tools.sh" helm promtool
export DLOCK_REQUIRE_PROMTOOL=1
say "cargo test --workspace"
# setup.sh built etcdutl: the etcd snapshot-restore test must run here, not skip.
export DLOCK_REQUIRE_ETCDUTL=1
# setup.sh installed schemathesis: the API fuzz run (services/testkit/tests/api_fuzz.rs) must run too.
export DLOCK_REQUIRE_SCHEMATHESIS=1
"$DLOCK_ROOT/scripts/flyway-tools.sh"
export DLOCK_REQUIRE_FLYWAY=1
cargo test --workspace --all-targets --no-fail-fast 2>&1
# The crates a client depends on are published: each must package (cargo package builds it from
# its .crate alone, so a missing file or an unpublished dependency fails here), and their documented
# examples compile (--all-targets above leaves doctests out).
say "cargo package dlock-wire dlock-client, and their doctests"
cargo package -p dlock-wire -p dlock-client --allow-dirty --quiet
cargo test --doc -p dlock-wire -p dlock-client
if [ "${DLOCK_SKIP_CLUSTER:-0}" = 1 ]; then
  say "DLOCK_SKIP_CLUSTER=1: cluster tier not run"
else
  say "cluster tier (kube-apiserver + etcd on loopback)"
  "$DLOCK_ROOT/scripts/test-cluster.sh"
fi
say "kind tier (the stack in pods: e2e/kind/run.sh; its tools are built once per machine; skipped where Docker cannot run, unless CI is set: then that fails the run)" && "$DLOCK_ROOT/e2e/kind/run.sh"
