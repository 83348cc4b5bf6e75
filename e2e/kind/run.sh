#!/usr/bin/env bash
# The kind tier: the whole system in a real (kind) Kubernetes cluster, built and run on this machine
# with nothing pulled from an image registry.
#
#   1. docker      a Docker daemon (scripts/docker-up.sh starts one if none answers, stops it after)
#   2. tools       kind, the kind base and node images (Kubernetes $DLOCK_K8S_VERSION), the
#                  PostgreSQL 16 image, kube-router's image, CloudNativePG's operator image and
#                  manifest: built once into $DLOCK_TOOLS_DIR (scripts/kind-tools.sh); helm
#                  (scripts/cluster-tools.sh)
#   3. image       the dlock image from the workspace's binaries (Dockerfile.prebuilt), and the
#                  upgrade image of step 13: the next patch version, with one more paydb migration
#                  (e2e/kind/upgrade/)
#   4. cluster     kind create cluster, kind load the dlock, PostgreSQL, kube-router and CloudNativePG
#                  images; kube-router's policy controller (e2e/kind/kube-router.yaml) enforces
#                  NetworkPolicies
#      cnpg        CloudNativePG, the PostgreSQL operator under the highly available lockdb/paydb
#                  (postgresql.cnpg.io/v1 Clusters): its release manifest rewritten for the local
#                  image (scripts/kind-tools.sh) applied server-side into cnpg-system; its Deployment
#                  Available and its admission webhook answering (a server-side dry run of a Cluster)
#   5. operator    helm install charts/dlock-operator (2 replicas, leader-elected, its NetworkPolicy on)
#   6. stack       apply a LockService and a PaymentStack (e2e/kind/samples: the managed samples with
#                  the local PostgreSQL image); wait for Ready: real migration Jobs, Deployments,
#                  probes, Service DNS; every pod Running
#   7. batch       payouts through payment-resource's API; the in-cluster executors post them; every
#                  payout POSTED once, legs balanced, the rail-stub's ground truth without a duplicate;
#                  paydb's connections all TLS, a plain one refused
#  7c. renewal     every certificate renewed on request while a batch is paid: each server pod (the
#                  databases' too) presents its new one without restarting, every payout posted once
#   8. chaos       a second batch while a lock-server pod and an executor pod are killed
#   9. failover    delete the operator leader's pod: another replica takes the Lease and reconciles
#  10. actions     `kubectl annotate` revoke of a held lock (REVOKED, pinned to its token) and a
#                  restore fast-forward (gate, read and advance Jobs, resume); a third batch is paid
#  11. etcd        a LockService with backend etcd (applied in step 6, so it comes up alongside the
#                  stack): three etcd members (StatefulSet, PVCs), lock-server on them; two grants
#                  through lock-server's API whose tokens are the etcd revisions of their keys, read
#                  back from etcd itself, strictly increasing
#  12. netpol      the NetworkPolicies as packet filters: TCP connections from inside pods let through
#                  or refused as the policies say; the probes pass; negative control: the policies
#                  deleted, the same check fails
#  13. upgrade     helm upgrade to the upgrade image while payouts are made: the new migration by its
#                  Job before the new pods, the old pods serving on the new schema without a failure,
#                  every payout posted once
#  14. negative    a payout paid twice straight at the rail makes the checks of step 7 fail
#
# Steps 1-6 are this script; steps 7-14 are `cargo test -p dlock-e2e --test kind` (e2e/tests/kind.rs),
# handed the cluster by DLOCK_KIND_KUBECONFIG, DLOCK_KIND_NAMESPACE, DLOCK_KIND_OPERATOR_NAMESPACE,
# DLOCK_KIND_LOCKSERVICE, DLOCK_KIND_PAYMENTSTACK, DLOCK_KIND_ETCD_LOCKSERVICE, DLOCK_KIND_RELEASE,
# DLOCK_KIND_CHART, DLOCK_KIND_IMAGE, DLOCK_KIND_UPGRADE_IMAGE, DLOCK_KIND_PAYOUTS,
# DLOCK_KIND_TIMEOUT, DLOCK_KIND_CNPG_NAMESPACE, DLOCK_KIND_CNPG_IMAGE (CloudNativePG's operator
# image) and DLOCK_KIND_CNPG_PG_IMAGE (a Cluster's imageName: the PostgreSQL image under its
# full-version tag, e.g. dlock-local/postgres:16.15, which CNPG reads the major version from)
# (without DLOCK_KIND_KUBECONFIG that test says it is not in a kind run).
#
# Where no Docker daemon can run it prints why and the word "skipped", and exits 0 — unless CI is set
# (to anything but "" / "false" / "0"): then it fails, so that CI never passes a tier it did not run.
# On failure it prints the state (objects, events, pod logs). The cluster is deleted at the end.
#
# --if-built: run only when every tool and image of step 2 is already built (scripts/kind-tools.sh
# --check), else print why and "skipped" (for a quick local run of the test command; with CI set it
# fails instead, as above). The test command itself builds them when missing: once per machine,
# about 10 minutes cold on a quiet 2-core machine (e2e/README.md).
#
# Env: DLOCK_KIND_CLUSTER (default dlock-e2e), DLOCK_KIND_KEEP=1 (leave the cluster running),
#      DLOCK_KIND_PAYOUTS (per batch, default 20), DLOCK_KIND_TIMEOUT (seconds per wait, default 600),
#      DLOCK_KIND_STEPS (e.g. netpol,upgrade: only these of steps 7-14; all by default),
#      DLOCK_KIND_UPGRADE_MIGRATION (the upgrade image's extra paydb migration, default
#      e2e/kind/upgrade/kind_upgrade_payout_note.sql; the upgrade's negative control builds
#      e2e/kind/upgrade/breaking/'s instead, and step 13 must then fail).
set -euo pipefail
if_built=0
if [[ "${1:-}" == "--if-built" ]]; then if_built=1; shift; fi

root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../../scripts/lib.sh
source "$root/scripts/lib.sh"
cluster="${DLOCK_KIND_CLUSTER:-dlock-e2e}"
payouts="${DLOCK_KIND_PAYOUTS:-20}"
timeout="${DLOCK_KIND_TIMEOUT:-600}"
k8s_version="${DLOCK_K8S_VERSION:-v1.34.4}"
node_image="${DLOCK_KIND_NODE_IMAGE:-dlock-local/kind-node:$k8s_version}"
pg_image="${DLOCK_KIND_PG_IMAGE:-dlock-local/postgres:16}"
image=dlock-local/dlock:kind-e2e
upgrade_image=dlock-local/dlock:kind-e2e-next
# The upgrade image's one more paydb migration; e2e/kind/upgrade/breaking/ holds the negative control's.
upgrade_migration="${DLOCK_KIND_UPGRADE_MIGRATION:-$root/e2e/kind/upgrade/kind_upgrade_payout_note.sql}"
kube_router_image=dlock-local/kube-router:v2.1.0
cnpg_version="${DLOCK_CNPG_VERSION:-1.27.1}"
cnpg_image="dlock-local/cloudnative-pg:$cnpg_version"
cnpg_ns=cnpg-system
release=dlock-operator
ns=dlock-e2e
op_ns=dlock-system
tools="$DLOCK_TOOLS_DIR"
export PATH="$tools/bin:$PATH"

t_start=$SECONDS
t_step=$SECONDS
step_name=""
log() { printf '[kind] %s\n' "$*" >&2; }
step() { # step NAME: closes the previous step (with its duration) and opens the next
    if [[ -n "$step_name" ]]; then log "step $step_name: done in $((SECONDS - t_step))s"; fi
    step_name="$1"
    t_step=$SECONDS
    log "---- $1"
}
# The failure, kept to be said again last: the state dump that follows it is long, and a reader of
# the run's tail (a CI log cut to its end) should find what failed without scrolling back.
failure=""
die() {
    failure="ERROR (step $step_name): $*"
    log "$failure"
    exit 1
}
ci() { [[ -n "${CI:-}" && "${CI}" != false && "${CI}" != 0 ]]; }
# skip WHY...: the tier cannot run here. Says why and "skipped" (exit 0), or under CI fails the run.
skip() {
    log "$*"
    if ci; then die "CI is set (CI=$CI): a tier that cannot run fails the run instead of being skipped"; fi
    echo "skipped"
    exit 0
}

# A condition with a deadline: wait_for SECONDS DESCRIPTION CMD... runs CMD until it succeeds.
wait_for() {
    local limit="$1" what="$2" deadline=$((SECONDS + $1))
    shift 2
    until "$@"; do
        ((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what"
        sleep 2
    done
}

# ---------------------------------------------------------------- 1. docker
step docker
# One run at a time per machine: runs share the cluster name, the images and the daemon this script
# may start and stop.
mkdir -p "$tools"
exec 9>"$tools/kind-tier.lock"
if ! flock -n 9; then
    log "another kind tier run holds $tools/kind-tier.lock; waiting for it (up to 40 min)"
    flock -w 2400 9 || die "the other kind tier run did not finish within 40 min"
fi
docker_state=""
if ! docker_state="$("$root/scripts/docker-up.sh" start)"; then
    skip "the kind tier needs a Docker daemon and none can run here (reason above)"
fi
workdir="$(mktemp -d "${TMPDIR:-/tmp}/dlock-kind.XXXXXX")"
kubeconfig="$workdir/kubeconfig"
export KUBECONFIG="$kubeconfig"
created=0
# Logs of every pod of the stack and the operator, and of any kube-system pod not Running.
dump_state_logs() {
    local n p
    for n in "$ns" "$op_ns" "$cnpg_ns" kube-system local-path-storage; do
        for p in $(kubectl get pods -n "$n" -o name 2>/dev/null); do
            if [[ "$(kubectl get -n "$n" "$p" -o jsonpath='{.status.phase}')" != Running ]] || [[ "$n" != kube-system ]]; then
                echo "--- logs $n/$p"
                kubectl logs -n "$n" "$p" --all-containers --tail 40 2>&1 || true
            fi
        done
    done
}
dump_state() {
    log "state for debugging:"
    {
        kubectl get nodes -o wide
        kubectl get lsvc,pstack -A -o yaml | grep -A60 '^  status:' | head -n 160
        kubectl get clusters.postgresql.cnpg.io -A -o wide 2>/dev/null
        kubectl get deploy,sts,jobs,pods,pvc,svc -A -o wide
        kubectl get events -A --sort-by=.lastTimestamp | tail -n 60
        dump_state_logs
    } 2>&1 | sed 's/^/  /' >&2 || true
}
cleanup() {
    local rc=$?
    trap - EXIT
    if ((rc != 0)) && [[ -s "$kubeconfig" ]]; then dump_state; fi
    if ((rc != 0)) && [[ -s "$workdir/checks.log" ]]; then
        log "what the checks said when they failed (the whole output is above the state):"
        grep -E -A12 'panicked at|^---- |thread .* panicked' "$workdir/checks.log" | tail -n 40 >&2 || true
    fi
    [[ -z "$failure" ]] || log "$failure"
    if ((created)) && [[ "${DLOCK_KIND_KEEP:-0}" != 1 ]]; then
        log "deleting kind cluster $cluster"
        kind delete cluster --name "$cluster" >&2 || true
    fi
    rm -rf "$workdir"
    if [[ "$docker_state" == started && "${DLOCK_KIND_KEEP:-0}" != 1 ]]; then
        "$root/scripts/docker-up.sh" stop || true
    fi
    if ((rc == 0)); then log "OK: kind tier passed in $((SECONDS - t_start))s"; else log "FAILED in $((SECONDS - t_start))s"; fi
    exit "$rc"
}
trap cleanup EXIT
# A signal ends the run as a failure: without these the EXIT trap sees the status of whatever
# command the signal interrupted (which can be 0) and could say OK of a run that was stopped.
trap 'exit 143' TERM
trap 'exit 130' INT

# ---------------------------------------------------------------- 2. tools
step tools
if ((if_built)); then
    if ! "$root/scripts/kind-tools.sh" --check 2>"$workdir/check.log" ||
        ! "$root/scripts/cluster-tools.sh" --check helm 2>>"$workdir/check.log"; then
        grep -E 'not built yet|MISSING' "$workdir/check.log" >&2 || true
        msg="the kind tier's tools are not built on this machine; build them once with scripts/kind-tools.sh (see e2e/README.md)"
        ci && die "$msg"
        docker_state_stop() { [[ "$docker_state" == started ]] && "$root/scripts/docker-up.sh" stop; }
        docker_state_stop || true
        trap - EXIT
        rm -rf "$workdir"
        skip "$msg"
    fi
fi
"$root/scripts/kind-tools.sh"
"$root/scripts/cluster-tools.sh" helm
command -v kubectl >/dev/null || die "kubectl is required"
# CloudNativePG's name for the PostgreSQL image: the same image under its full-version tag
# (scripts/kind-tools.sh tags it).
cnpg_pg_image="${DLOCK_KIND_CNPG_PG_IMAGE:-${pg_image%:*}:$("$tools/pg16/bin/postgres" --version | awk '{print $3}')}"
cnpg_manifest="$tools/cnpg/cnpg-$cnpg_version.yaml"
[[ -s "$cnpg_manifest" ]] || die "$cnpg_manifest is missing (scripts/kind-tools.sh cnpg writes it)"

# ---------------------------------------------------------------- 3. image
step image
"$root/scripts/setup.sh" >&2
"$root/e2e/kind/build-image.sh" "$image" debug
# The upgrade image: the next patch version, with one more (additive) paydb migration.
version="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")"
"$root/e2e/kind/build-image.sh" "$upgrade_image" debug --version "${version%.*}.$((${version##*.} + 1))" \
    --paydb-migration "$upgrade_migration"
# Each run rebuilds the two images under the same tags: the previous ones, now untagged, would fill
# the disk run after run.
docker image prune -f >/dev/null
# The checks of steps 7-14 (e2e/tests/kind.rs), compiled now rather than once the cluster runs.
cargo test -q --manifest-path "$root/Cargo.toml" -p dlock-e2e --test kind --no-run >&2

# ---------------------------------------------------------------- 4. cluster
step cluster
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    log "deleting a leftover kind cluster $cluster"
    kind delete cluster --name "$cluster" >&2
fi
created=1
kind create cluster --name "$cluster" --image "$node_image" --config "$root/e2e/kind/cluster.yaml" \
    --kubeconfig "$kubeconfig" --wait "${timeout}s" >&2
# The PostgreSQL image under both its names in one archive: kind would skip the second name of an
# image whose ID is already on the node.
kind load docker-image "$image" "$upgrade_image" "$pg_image" "$cnpg_pg_image" "$kube_router_image" "$cnpg_image" \
    --name "$cluster" >&2
kubectl apply -f "$root/e2e/kind/kube-router.yaml" >&2
kubectl -n kube-system rollout status ds/kube-router --timeout="${timeout}s" >&2
kubectl -n kube-system rollout status deploy/coredns --timeout="${timeout}s" >&2
kubectl -n local-path-storage rollout status deploy/local-path-provisioner --timeout="${timeout}s" >&2

# ---------------------------------------------------------------- 4. cluster: CloudNativePG
step cnpg
log "installing CloudNativePG $cnpg_version ($cnpg_image) into $cnpg_ns"
# Server-side: the CRDs are too large for client-side apply's last-applied annotation.
kubectl apply --server-side -f "$cnpg_manifest" >/dev/null
kubectl wait --for=condition=Established --timeout=60s \
    crd/clusters.postgresql.cnpg.io crd/poolers.postgresql.cnpg.io crd/imagecatalogs.postgresql.cnpg.io >&2
kubectl -n "$cnpg_ns" wait --for=condition=Available deploy/cnpg-controller-manager --timeout="${timeout}s" >&2
# Available is the manager's readiness; a Cluster is admitted only once the API server reaches its
# webhooks (the manager writes their certificate and CA bundle after it starts): a server-side dry
# run of a minimal Cluster goes through both.
cnpg_webhook_answers() {
    kubectl apply --dry-run=server -f - >/dev/null 2>"$workdir/cnpg-webhook.err" <<YAML
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  name: webhook-probe
  namespace: default
spec:
  instances: 1
  imageName: $cnpg_pg_image
  storage:
    size: 1Gi
YAML
}
cnpg_deadline=$((SECONDS + 300))
until cnpg_webhook_answers; do
    ((SECONDS < cnpg_deadline)) ||
        die "CloudNativePG's webhook did not admit a Cluster within 300s: $(cat "$workdir/cnpg-webhook.err")"
    sleep 2
done
log "CloudNativePG $cnpg_version: Available, webhook answering"

# ---------------------------------------------------------------- 5. operator
step operator
helm upgrade --install "$release" "$root/charts/dlock-operator" \
    --namespace "$op_ns" --create-namespace \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
    --set networkPolicy.enabled=true \
    --wait --timeout "${timeout}s" >&2
kubectl wait --for=condition=Established crd/lockservices.dlock.dev crd/paymentstacks.dlock.dev --timeout=60s >&2

# ---------------------------------------------------------------- 6. the stack
step stack
kubectl create namespace "$ns" >&2
# The Pod Security Standard "restricted", enforced by the API server's own admission: every pod of
# the stack (the operator's, CloudNativePG's, the checks' own) must meet it, or is refused.
kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest >&2
# The checks' own lock client first: every LockService of the tier names it.
kubectl -n "$ns" apply -f "$root/e2e/kind/samples/lock-clients.yaml" >&2
kubectl -n "$ns" apply -f "$root/e2e/kind/samples/lockservice.yaml" -f "$root/e2e/kind/samples/paymentstack.yaml" >&2
# The etcd LockService of step 11 starts now, in parallel with the stack.
kubectl -n "$ns" apply -f "$root/e2e/kind/samples/lockservice-etcd.yaml" >&2
elsvc=etcd-locks
lsvc=payments-locks
pstack=payments
kubectl -n "$ns" wait --for=condition=Ready "lsvc/$lsvc" --timeout="${timeout}s" >&2
kubectl -n "$ns" wait --for=condition=Ready "pstack/$pstack" --timeout="${timeout}s" >&2
for d in "$lsvc-lock-server" "$pstack-payment-resource" "$pstack-rail-proxy" "$pstack-payout-executor" "$pstack-rail-stub"; do
    kubectl -n "$ns" rollout status "deploy/$d" --timeout="${timeout}s" >&2
done
kubectl -n "$ns" get jobs,sts,deploy,pods -o wide >&2
not_running() { # the pods of the stack and the operator not Running and ready (finished Jobs' aside),
    # and those still going away (a rolled Deployment's old pod in its grace period), one line each
    { kubectl get pods -n "$ns" -o json; kubectl get pods -n "$op_ns" -o json; } | jq -r '.items[]
        | select(.status.phase != "Succeeded")
        | select(.metadata.deletionTimestamp != null or .status.phase != "Running"
            or ([.status.containerStatuses[]?.ready] | all | not))
        | "\(.metadata.namespace)/\(.metadata.name) phase=\(.status.phase) ready=\([.status.containerStatuses[]?.ready])"
            + (if .metadata.deletionTimestamp then " terminating" else "" end)'
}
last_not_running=""
all_running() { # logs who is not, when that changes
    local left
    left="$(not_running)" || return 1
    [[ -z "$left" ]] && return 0
    if [[ "$left" != "$last_not_running" ]]; then log "not yet Running and ready: $(tr '\n' ';' <<<"$left")"; fi
    last_not_running="$left"
    return 1
}
wait_for 120 "every pod Running" all_running
jobs_ok="$(kubectl -n "$ns" get jobs -o jsonpath='{range .items[*]}{.metadata.name}={.status.succeeded}{"\n"}{end}')"
log "migration Jobs: $(tr '\n' ' ' <<<"$jobs_ok")"
grep -q '=1' <<<"$jobs_ok" || die "no migration Job succeeded"

# ---------------------------------------------------------------- 7.-14. the checks
# The steps after the setup are Rust (e2e/tests/kind.rs, built in step 3): typed objects through
# kube's client, waits on watches, the ledger over sqlx, the services over reqwest. They print their
# own step lines; a failure fails this script, whose cleanup then prints the state.
step checks
DLOCK_KIND_KUBECONFIG="$kubeconfig" DLOCK_KIND_NAMESPACE="$ns" DLOCK_KIND_OPERATOR_NAMESPACE="$op_ns" \
    DLOCK_KIND_LOCKSERVICE="$lsvc" DLOCK_KIND_PAYMENTSTACK="$pstack" DLOCK_KIND_ETCD_LOCKSERVICE="$elsvc" \
    DLOCK_KIND_RELEASE="$release" DLOCK_KIND_CHART="$root/charts/dlock-operator" \
    DLOCK_KIND_IMAGE="$image" DLOCK_KIND_UPGRADE_IMAGE="$upgrade_image" \
    DLOCK_KIND_PAYOUTS="$payouts" DLOCK_KIND_TIMEOUT="$timeout" DLOCK_KIND_STEPS="${DLOCK_KIND_STEPS:-}" \
    DLOCK_KIND_CNPG_NAMESPACE="$cnpg_ns" DLOCK_KIND_CNPG_IMAGE="$cnpg_image" DLOCK_KIND_CNPG_PG_IMAGE="$cnpg_pg_image" \
    cargo test -q --manifest-path "$root/Cargo.toml" -p dlock-e2e --test kind -- --nocapture --test-threads=1 2>&1 |
    tee "$workdir/checks.log" >&2 ||
    die "the kind tier's checks failed (output above)"

step done
# The last step rolled Deployments: their old pods may still be in their grace period. Every pod
# must be Running and ready, and the old ones gone, within two minutes; a crash-looping pod never is.
wait_for 120 "every pod Running and ready at the end (the lines above name those that were not)" all_running
kubectl -n "$ns" get pods -o wide >&2
