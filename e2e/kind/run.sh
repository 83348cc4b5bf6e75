#!/usr/bin/env bash
# The kind tier: the whole system in a real (kind) Kubernetes cluster, built and run on this machine
# with nothing pulled from an image registry.
#
#   1. docker      a Docker daemon (scripts/docker-up.sh starts one if none answers, stops it after)
#   2. tools       kind, the kind base and node images (Kubernetes $DLOCK_K8S_VERSION), the
#                  PostgreSQL 16 image: built once into $DLOCK_TOOLS_DIR (scripts/kind-tools.sh);
#                  helm (scripts/cluster-tools.sh)
#   3. image       the dlock image from the workspace's binaries (Dockerfile.prebuilt)
#   4. cluster     kind create cluster, kind load the dlock and PostgreSQL images
#   5. operator    helm install charts/dlock-operator (2 replicas, leader-elected)
#   6. stack       apply a LockService and a PaymentStack (e2e/kind/samples: the managed samples with
#                  the local PostgreSQL image); wait for Ready: real migration Jobs, Deployments,
#                  probes, Service DNS; every pod Running
#   7. batch       payouts through payment-resource's API; the in-cluster executors post them; every
#                  payout POSTED once, legs balanced, the rail-stub's ground truth without a duplicate
#   8. chaos       a second batch while a lock-server pod and an executor pod are killed
#   9. failover    delete the operator leader's pod: another replica takes the Lease and reconciles
#  10. actions     `kubectl annotate` revoke of a held lock (REVOKED, pinned to its token) and a
#                  restore fast-forward (gate, read and advance Jobs, resume); a third batch is paid
#  11. etcd        a LockService with backend etcd (applied in step 6, so it comes up alongside the
#                  stack): three etcd members (StatefulSet, PVCs), lock-server on them; two grants
#                  through lock-server's API whose tokens are the etcd revisions of their keys, read
#                  back from etcd itself, strictly increasing
#  12. negative    a payout paid twice straight at the rail makes the checks of step 7 fail
#
# Where no Docker daemon can run it prints why and the word "skipped", and exits 0.
# On failure it prints the state (objects, events, pod logs). The cluster is deleted at the end.
#
# --if-built: run only when every tool and image of step 2 is already built (scripts/kind-tools.sh
# --check), else print why and "skipped" (for a quick local run of the test command). The test
# command itself builds them when missing: once per machine, about 15 minutes cold (e2e/README.md).
#
# Env: DLOCK_KIND_CLUSTER (default dlock-e2e), DLOCK_KIND_KEEP=1 (leave the cluster running),
#      DLOCK_KIND_PAYOUTS (per batch, default 20), DLOCK_KIND_TIMEOUT (seconds per wait, default 600).
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
die() { log "ERROR (step $step_name): $*"; exit 1; }

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
    log "the kind tier needs a Docker daemon and none can run here (reason above)"
    echo "skipped"
    exit 0
fi
workdir="$(mktemp -d "${TMPDIR:-/tmp}/dlock-kind.XXXXXX")"
kubeconfig="$workdir/kubeconfig"
export KUBECONFIG="$kubeconfig"
created=0
pf_pids=()
# Logs of every pod of the stack and the operator, and of any kube-system pod not Running.
dump_state_logs() {
    local n p
    for n in "$ns" "$op_ns" kube-system local-path-storage; do
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
        kubectl get deploy,sts,jobs,pods,pvc,svc -A -o wide
        kubectl get events -A --sort-by=.lastTimestamp | tail -n 60
        dump_state_logs
    } 2>&1 | sed 's/^/  /' >&2 || true
}
cleanup() {
    local rc=$?
    trap - EXIT
    if ((rc != 0)) && [[ -s "$kubeconfig" ]]; then dump_state; fi
    local pid
    for pid in "${pf_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
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

# ---------------------------------------------------------------- 2. tools
step tools
if ((if_built)); then
    if ! "$root/scripts/kind-tools.sh" --check 2>"$workdir/check.log" ||
        ! "$root/scripts/cluster-tools.sh" --check helm 2>>"$workdir/check.log"; then
        grep -E 'not built yet|MISSING' "$workdir/check.log" >&2 || true
        log "the kind tier's tools are not built on this machine; build them once with scripts/kind-tools.sh (see e2e/README.md)"
        docker_state_stop() { [[ "$docker_state" == started ]] && "$root/scripts/docker-up.sh" stop; }
        docker_state_stop || true
        trap - EXIT
        rm -rf "$workdir"
        echo "skipped"
        exit 0
    fi
fi
"$root/scripts/kind-tools.sh"
"$root/scripts/cluster-tools.sh" helm
command -v kubectl >/dev/null || die "kubectl is required"

# ---------------------------------------------------------------- 3. image
step image
"$root/scripts/setup.sh" >&2
"$root/e2e/kind/build-image.sh" "$image" debug

# ---------------------------------------------------------------- 4. cluster
step cluster
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    log "deleting a leftover kind cluster $cluster"
    kind delete cluster --name "$cluster" >&2
fi
created=1
kind create cluster --name "$cluster" --image "$node_image" --config "$root/e2e/kind/cluster.yaml" \
    --kubeconfig "$kubeconfig" --wait "${timeout}s" >&2
kind load docker-image "$image" "$pg_image" --name "$cluster" >&2
kubectl -n kube-system rollout status deploy/coredns --timeout="${timeout}s" >&2
kubectl -n local-path-storage rollout status deploy/local-path-provisioner --timeout="${timeout}s" >&2

# ---------------------------------------------------------------- 5. operator
step operator
helm upgrade --install dlock-operator "$root/charts/dlock-operator" \
    --namespace "$op_ns" --create-namespace \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
    --wait --timeout "${timeout}s" >&2
kubectl wait --for=condition=Established crd/lockservices.dlock.dev crd/paymentstacks.dlock.dev --timeout=60s >&2

# ---------------------------------------------------------------- 6. the stack
step stack
kubectl create namespace "$ns" >&2
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
all_running() { # every pod of the stack and the operator Running and ready, except finished Jobs'
    kubectl get pods -n "$ns" -o json | jq -e '[.items[] | select(.status.phase != "Succeeded")
        | select(.status.phase != "Running" or ([.status.containerStatuses[]?.ready] | all | not))] | length == 0' >/dev/null &&
        kubectl get pods -n "$op_ns" -o json | jq -e '[.items[] | select(.status.phase != "Running")] | length == 0' >/dev/null
}
wait_for 120 "every pod Running" all_running
jobs_ok="$(kubectl -n "$ns" get jobs -o jsonpath='{range .items[*]}{.metadata.name}={.status.succeeded}{"\n"}{end}')"
log "migration Jobs: $(tr '\n' ' ' <<<"$jobs_ok")"
grep -q '=1' <<<"$jobs_ok" || die "no migration Job succeeded"

# ---------------------------------------------------------------- helpers for the checks
# A psql client in the cluster, connected as paydb's owner (URL from the stack's connection Secret,
# never printed): reads the ledger independently of the services.
kubectl -n "$ns" apply -f - >&2 <<POD
apiVersion: v1
kind: Pod
metadata:
  name: dlock-kind-psql
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: psql
      image: $pg_image
      imagePullPolicy: Never
      command: ["sleep", "infinity"]
      env:
        - name: PGURL
          valueFrom:
            secretKeyRef: {name: $pstack-paydb-conn, key: admin-url}
POD
kubectl -n "$ns" wait --for=condition=Ready pod/dlock-kind-psql --timeout="${timeout}s" >&2
sql() { kubectl -n "$ns" exec dlock-kind-psql -- sh -c 'exec psql "$PGURL" -v ON_ERROR_STOP=1 -At -c "$1"' psql "$1"; }

# HTTP to a Service of the stack: `kubectl port-forward` to a loopback port (the API server's
# service proxy rewrites content types, which the services rightly refuse).
declare -A pf_port=()
forward() { # forward SERVICE [PORT]: starts a port-forward to SERVICE:PORT (8080), records its local port
    local out="$workdir/pf-$1.log"
    kubectl -n "$ns" port-forward "svc/$1" ":${2:-8080}" --address 127.0.0.1 >"$out" 2>&1 &
    pf_pids+=($!)
    forwarding() { grep -qs '^Forwarding from 127.0.0.1:' "$out"; }
    wait_for 60 "a port-forward to $1" forwarding
    pf_port[$1]="$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$out" | head -n1)"
}
svc_get() { curl -sS --fail-with-body --max-time 30 "http://127.0.0.1:${pf_port[$1]}$2"; }
svc_post() { # svc_post SERVICE PATH [CURL ARGS…]; body on stdin
    local svc="$1" path="$2"
    shift 2
    curl -sS --fail-with-body --max-time 30 -H 'content-type: application/json' "$@" --data-binary @- "http://127.0.0.1:${pf_port[$svc]}$path"
}
forward "$pstack-payment-resource"
forward "$pstack-rail-stub"

# Payouts are created with the stack's `client` credential, from the Secret the operator generated.
# It goes to curl as a header file (mode 600), never on a command line.
client_header="$workdir/client-auth-header"
(umask 077 && printf 'Authorization: Bearer %s\n' \
    "$(kubectl -n "$ns" get secret "$pstack-payment-credentials" -o jsonpath='{.data.client}' | base64 -d)" \
    >"$client_header")
grep -q 'Bearer .\{16,\}' "$client_header" || die "Secret $pstack-payment-credentials has no client credential"

# Creates one payout through payment-resource's API. The only place payouts are made.
create_payout() { # create_payout IDEMPOTENCY_KEY ACCOUNT_NN AMOUNT_MINOR
    printf '{"accountId":"00000000-0000-4000-8000-0000000000%02d","amountMinor":%d,"currency":"EUR","idempotencyKey":"%s"}' \
        "$2" "$3" "$1" | svc_post "$pstack-payment-resource" /v1/payouts -H "@$client_header" >/dev/null
}
create_batch() { # create_batch RUN FROM TO
    local i
    for ((i = $2; i <= $3; i++)); do create_payout "$1-$i" $((1 + i % 10)) $((100 + i)); done
}

batch_counts() { # prints "posted failed total" for the payouts of run $1
    sql "SELECT count(*) FILTER (WHERE state = 'POSTED') || ' ' ||
                count(*) FILTER (WHERE state IN ('FAILED','ABANDONED')) || ' ' || count(*)
           FROM payout WHERE idempotency_key LIKE '$1-%';"
}
batch_done() { # batch_done RUN N: all N payouts POSTED (fails the tier at once if one failed)
    local c posted bad total
    c="$(batch_counts "$1")" || return 1
    read -r posted bad total <<<"$c"
    ((bad == 0)) || die "$bad payouts of $1 ended FAILED/ABANDONED"
    log "$1: $posted/$2 posted"
    ((total == $2 && posted == $2))
}

check_batch() { # check_batch RUN: the ledger and the rail's ground truth for the payouts of RUN
    local verdict unbalanced drifted duplicates
    verdict="$(sql "
WITH batch AS (SELECT payout_id, amount_minor FROM payout WHERE idempotency_key LIKE '$1-%'),
legs AS (
  SELECT b.payout_id,
         count(l.*) FILTER (WHERE l.direction = 'DEBIT')  AS debits,
         count(l.*) FILTER (WHERE l.direction = 'CREDIT') AS credits,
         coalesce(sum(l.amount_minor) FILTER (WHERE l.direction = 'DEBIT'), 0)  AS debit_sum,
         coalesce(sum(l.amount_minor) FILTER (WHERE l.direction = 'CREDIT'), 0) AS credit_sum,
         b.amount_minor
    FROM batch b LEFT JOIN ledger_entry l ON l.payout_id = b.payout_id
   GROUP BY b.payout_id, b.amount_minor)
SELECT
  (SELECT count(*) FROM legs WHERE debits <> 1 OR credits <> 1
                                OR debit_sum <> amount_minor OR credit_sum <> amount_minor) || ' ' ||
  (SELECT count(*) FROM account a WHERE a.kind = 'CUSTOMER' AND a.balance_minor <>
       a.opening_balance_minor
       - coalesce((SELECT sum(amount_minor) FROM ledger_entry l WHERE l.account_id = a.account_id AND l.direction = 'DEBIT'), 0)
       + coalesce((SELECT sum(amount_minor) FROM ledger_entry l WHERE l.account_id = a.account_id AND l.direction = 'CREDIT'), 0)) || ' ' ||
  (SELECT count(*) FROM (SELECT s.payout_id FROM rail_submission s JOIN batch b USING (payout_id)
                          WHERE s.outcome = 'ACKED' GROUP BY s.payout_id HAVING count(*) > 1) d);")"
    read -r unbalanced drifted duplicates <<<"$verdict"
    log "$1: payouts with unbalanced legs: $unbalanced; customer accounts off their ledger: $drifted; payouts acked twice in rail_submission: $duplicates"
    ((unbalanced == 0 && drifted == 0 && duplicates == 0)) || die "the ledger of $1 is wrong"
    # The rail's own record of what it paid: every payout of the batch paid exactly once.
    local report ids paid_twice paid_once
    report="$(svc_get "$pstack-rail-stub" /v1/received)"
    ids="$(sql "SELECT payout_id FROM payout WHERE idempotency_key LIKE '$1-%';" | jq -R . | jq -s .)"
    paid_twice="$(jq '.paidTwice | length' <<<"$report")"
    paid_once="$(jq --argjson ids "$ids" '[$ids[] as $id | .perPayout[$id].paid // 0 | select(. == 1)] | length' <<<"$report")"
    log "$1: rail-stub paid $paid_once/$(jq length <<<"$ids") of them exactly once; paid twice (any run): $paid_twice"
    ((paid_twice == 0)) || die "the rail paid $paid_twice payouts twice: $(jq -c .paidTwice <<<"$report")"
    ((paid_once == $(jq length <<<"$ids"))) || die "the rail did not pay every payout of $1 exactly once"
}

# ---------------------------------------------------------------- 7. a payout batch
step batch
run1="kind-$(date +%s)-a"
log "creating $payouts payouts through payment-resource ($run1)"
create_batch "$run1" 1 "$payouts"
wait_for "$timeout" "the executors to post $run1" batch_done "$run1" "$payouts"
check_batch "$run1"

# ---------------------------------------------------------------- 8. pods deleted mid-batch
step chaos
run2="kind-$(date +%s)-b"
n2=$((payouts * 2))
ls_pod="$(kubectl -n "$ns" get pods -l "app.kubernetes.io/instance=$lsvc,app.kubernetes.io/component=lock-server" -o jsonpath='{.items[0].metadata.name}')"
ex_pod="$(kubectl -n "$ns" get pods -l "app.kubernetes.io/instance=$pstack,app.kubernetes.io/component=payout-executor" -o jsonpath='{.items[0].metadata.name}')"
# A few payouts are created, and while the executors work on them both pods are killed (no grace:
# the processes die as in a crash, and the API forgets the pods at once, so their replacements may
# start before they are gone); the rest of the batch is created while the replacements start.
first=5
create_batch "$run2" 1 "$first"
log "mid-batch: killing lock-server pod $ls_pod and executor pod $ex_pod"
kubectl -n "$ns" delete pod "$ls_pod" "$ex_pod" --grace-period=0 --force >&2 2>/dev/null
log "at the kill: $(batch_counts "$run2" | awk '{print $1 " posted, " $2 " failed, of " $3 " created"}')"
create_batch "$run2" $((first + 1)) "$n2"
wait_for "$timeout" "the executors to post $run2" batch_done "$run2" "$n2"
check_batch "$run2"
kubectl -n "$ns" rollout status "deploy/$lsvc-lock-server" --timeout="${timeout}s" >&2
kubectl -n "$ns" rollout status "deploy/$pstack-payout-executor" --timeout="${timeout}s" >&2

# ---------------------------------------------------------------- 9. operator failover
step failover
lease="$(kubectl -n "$op_ns" get lease -o name | grep -m1 dlock-operator || true)"
[[ -n "$lease" ]] || die "no operator Lease in $op_ns"
holder() { kubectl -n "$op_ns" get "$lease" -o jsonpath='{.spec.holderIdentity}'; }
leader="$(holder)"
leader_pod=""
for p in $(kubectl -n "$op_ns" get pods -o jsonpath='{.items[*].metadata.name}'); do
    if [[ "$leader" == *"$p"* ]]; then leader_pod="$p"; fi
done
[[ -n "$leader_pod" ]] || die "Lease holder \"$leader\" is none of the operator pods"
log "leader $leader (pod $leader_pod): deleting it"
kubectl -n "$op_ns" delete pod "$leader_pod" --wait=false >&2
new_leader() { local h; h="$(holder)"; [[ -n "$h" && "$h" != *"$leader_pod"* ]]; }
wait_for "$timeout" "another operator replica to take the Lease" new_leader
log "new leader: $(holder)"
# The new leader carries on: a spec change is reconciled into the Deployment and rolled out.
kubectl -n "$ns" patch "lsvc/$lsvc" --type merge -p '{"spec":{"lockServer":{"replicas":3}}}' >&2
scaled() { [[ "$(kubectl -n "$ns" get "deploy/$lsvc-lock-server" -o jsonpath='{.status.readyReplicas}')" == 3 ]]; }
wait_for "$timeout" "the new leader to scale lock-server to 3 ready replicas" scaled
kubectl -n "$ns" wait --for=condition=Ready "lsvc/$lsvc" --timeout="${timeout}s" >&2

# ---------------------------------------------------------------- 10. operator actions
# Both actions from one `kubectl annotate` line each, executed by the operator in the cluster:
# a pinned force-revoke of a lock held through lock-server's API, then a restore fast-forward
# (gate -> read Job over the paydb -> advance Job -> resume), after which payouts flow again.
step actions
forward "$lsvc-lock-server"
action() { # action ID: the status.actions entry of ID (or empty)
    kubectl -n "$ns" get "lsvc/$lsvc" -o json | jq -c --arg id "$1" '.status.actions // [] | map(select(.id == $id)) | .[0] // empty'
}
finished() { local a; a="$(action "$1")"; [[ -n "$a" ]] && jq -e '.phase == "Succeeded" or .phase == "Failed"' <<<"$a" >/dev/null; }
session="$(printf '{"ownerId":"kind-stuck-worker","ttlMs":600000}' | svc_post "$lsvc-lock-server" /v1/sessions | jq -r .sessionId)"
grant="$(printf '{"sessionId":"%s","ownerId":"kind-stuck-worker","ttlMs":600000}' "$session" |
    svc_post "$lsvc-lock-server" /v1/locks/kind:stuck/acquire)"
held_token="$(jq -r .fencingToken <<<"$grant")"
[[ "$held_token" =~ ^[0-9]+$ ]] || die "no grant to revoke: $grant"
log "revoke: kind:stuck is held with token $held_token; requesting its revoke"
kubectl -n "$ns" annotate "lsvc/$lsvc" --overwrite \
    'dlock.dev/revoke={"id":"kind-r-1","key":"kind:stuck","reason":"kind tier","requestedBy":"e2e"}' >&2
wait_for "$timeout" "revoke kind-r-1 to finish" finished kind-r-1
revoked="$(action kind-r-1)"
log "revoke: $revoked"
jq -e --argjson t "$held_token" '.phase == "Succeeded" and .outcome == "REVOKED" and .previousToken == $t and .targetToken == $t' \
    <<<"$revoked" >/dev/null || die "revoke kind-r-1 did not revoke token $held_token"
state="$(svc_get "$lsvc-lock-server" /v1/locks/kind:stuck | jq -r .state)"
[[ "$state" == FREE ]] || die "kind:stuck is $state after the revoke"

log "restore: requesting a fast-forward"
kubectl -n "$ns" annotate "lsvc/$lsvc" --overwrite 'dlock.dev/restore={"id":"kind-ff-1","margin":100}' >&2
wait_for "$timeout" "restore kind-ff-1 to finish" finished kind-ff-1
restored="$(action kind-ff-1)"
log "restore: $(jq -c '{phase, sequenceBefore, targetSequence, sequenceAfter, stacks: [.stacks[]? | {name, highest}]}' <<<"$restored")"
jq -e '.phase == "Succeeded" and .sequenceAfter >= .targetSequence and .targetSequence > (.stacks | map(.highest) | max)' \
    <<<"$restored" >/dev/null || die "restore kind-ff-1 did not move the sequence past the high-water"
kubectl -n "$ns" rollout status "deploy/$lsvc-lock-server" --timeout="${timeout}s" >&2
kubectl -n "$ns" wait --for=condition=Ready "lsvc/$lsvc" --timeout="${timeout}s" >&2
gate="$(kubectl -n "$ns" get "lsvc/$lsvc" -o json | jq -c '.status.gate // empty')"
[[ -z "$gate" ]] || die "the gate is still closed: $gate"
# Lock traffic resumed: a third batch is paid in full, with the same checks.
run3="kind-$(date +%s)-c"
create_batch "$run3" 1 "$payouts"
wait_for "$timeout" "the executors to post $run3 after the fast-forward" batch_done "$run3" "$payouts"
check_batch "$run3"
pactions="$(kubectl -n "$ns" get "pstack/$pstack" -o json | jq -c '.status.actions // []')"
[[ "$pactions" == "[]" ]] || die "pstack/$pstack reports actions nobody requested: $pactions"

# ---------------------------------------------------------------- 11. backend etcd
# From CR to grant on etcd: the operator ran three members and lock-server on them; a grant's token
# is the etcd revision of its key (read back from etcd's own API through the client Service), and a
# second grant's is strictly greater.
step etcd
kubectl -n "$ns" wait --for=condition=Ready "lsvc/$elsvc" --timeout="${timeout}s" >&2
kubectl -n "$ns" rollout status "sts/$elsvc-etcd" --timeout="${timeout}s" >&2
kubectl -n "$ns" rollout status "deploy/$elsvc-lock-server" --timeout="${timeout}s" >&2
# How long the etcd LockService took from creation to Ready: it comes up alongside the stack, so
# most of it is hidden behind the stack step.
ready_after() { kubectl -n "$ns" get "lsvc/$1" -o json |
    jq -r '((.status.conditions[] | select(.type == "Ready") | .lastTransitionTime | fromdate) - (.metadata.creationTimestamp | fromdate))'; }
log "lsvc/$elsvc was Ready $(ready_after "$elsvc")s after its creation"
estatus="$(kubectl -n "$ns" get "lsvc/$elsvc" -o json | jq -c '.status | {phase, etcd, migration}')"
log "etcd LockService: $estatus"
jq -e '.phase == "Ready" and .etcd.ready == "3/3" and .migration == null' <<<"$estatus" >/dev/null ||
    die "lsvc/$elsvc is not Ready on 3/3 etcd members without a migration: $estatus"
[[ -z "$(kubectl -n "$ns" get jobs -l "app.kubernetes.io/instance=$elsvc" -o name)" ]] || die "an etcd LockService ran a Job"
forward "$elsvc-lock-server"
forward "$elsvc-etcd-client" 2379
etcd_key() { # etcd_key LOCK_KEY: mod_revision of lock-server's grant key and the cluster's revision
    printf '{"key":"%s"}' "$(printf '/dlock/l/%s' "$1" | base64 -w0)" |
        curl -sS --fail-with-body --max-time 30 --data-binary @- "http://127.0.0.1:${pf_port[$elsvc-etcd-client]}/v3/kv/range" |
        jq -c '{mod: (.kvs[0].mod_revision // "0" | tonumber), rev: (.header.revision | tonumber)}'
}
esession="$(printf '{"ownerId":"kind-etcd-worker","ttlMs":60000}' | svc_post "$elsvc-lock-server" /v1/sessions | jq -r .sessionId)"
[[ "$esession" =~ ^[0-9a-f-]{36}$ ]] || die "no session from lock-server on etcd: $esession"
etokens=()
for k in kind:etcd:a kind:etcd:b; do
    g="$(printf '{"sessionId":"%s","ownerId":"kind-etcd-worker","ttlMs":60000}' "$esession" |
        svc_post "$elsvc-lock-server" "/v1/locks/$k/acquire")"
    t="$(jq -r .fencingToken <<<"$g")"
    [[ "$t" =~ ^[0-9]+$ ]] || die "no grant of $k on etcd: $g"
    e="$(etcd_key "$k")"
    log "etcd: $k granted with token $t; etcd has the key at mod_revision $(jq .mod <<<"$e") (cluster revision $(jq .rev <<<"$e"))"
    jq -e --argjson t "$t" '.mod == $t and .rev >= $t' <<<"$e" >/dev/null ||
        die "the token of $k ($t) is not the etcd revision of its key: $e"
    etokens+=("$t")
done
((etokens[1] > etokens[0])) || die "etcd tokens not strictly increasing: ${etokens[*]}"
# Released by its token, the key is gone from etcd (the grant was really there, nowhere else).
curl -sS --fail-with-body --max-time 30 -X POST -H "X-Fencing-Token: ${etokens[1]}" \
    "http://127.0.0.1:${pf_port[$elsvc-lock-server]}/v1/locks/kind:etcd:b/release" >/dev/null
jq -e '.mod == 0' <<<"$(etcd_key kind:etcd:b)" >/dev/null || die "kind:etcd:b is still in etcd after its release"
log "etcd: tokens ${etokens[*]} are etcd revisions, strictly increasing; the release removed the key"

# ---------------------------------------------------------------- 12. negative control
# The checks can fail: pay one posted payout of the first batch a second time straight at the rail
# (under a new idempotency key, bypassing rail-proxy's fence, as an unfenced stale holder would) and
# the ground-truth check of step 7 must now refuse that batch.
step negative-control
victim="$(sql "SELECT payout_id || ' ' || account_id || ' ' || amount_minor FROM payout WHERE idempotency_key = '$run1-1';")"
read -r v_payout v_account v_amount <<<"$victim"
printf '{"idempotencyKey":"%s","payoutId":"%s","accountId":"%s","amountMinor":%d,"currency":"EUR"}' \
    "negative-control-$run1" "$v_payout" "$v_account" "$v_amount" | svc_post "$pstack-rail-stub" /v1/payments >/dev/null
if (check_batch "$run1") 2>"$workdir/negative.log"; then
    die "the checks accepted a payout the rail paid twice"
fi
grep -q 'paid 1 payouts twice\|paid .* twice' "$workdir/negative.log" || { cat "$workdir/negative.log" >&2; die "the checks failed for another reason than the double payment"; }
log "negative control: a second payment of $v_payout at the rail is caught ($(grep -o 'the rail paid [0-9]* payouts twice' "$workdir/negative.log"))"

step done
all_running || die "not every pod is Running at the end"
kubectl -n "$ns" get pods -o wide >&2
