#!/usr/bin/env bash
# The kind tier: the whole system in a real (kind) Kubernetes cluster, for machines with Docker.
#
#   1. docker build the dlock image (repository Dockerfile)
#   2. create a kind cluster and load the image into it
#   3. helm install charts/dlock-operator (CRDs, RBAC, the operator, leader-elected)
#   4. apply the managed LockService + PaymentStack samples and wait for both to be Ready
#   5. run a payout batch: seed PENDING payouts into paydb, let payout-executor drain them, and
#      check every one is POSTED with two balanced ledger legs and no fenced-out write
#
# Without docker (or a reachable Docker daemon) or kind it prints why and exits 0 with "skipped".
#
# Env: DLOCK_KIND_CLUSTER (default dlock-e2e), DLOCK_KIND_KEEP=1 (leave the cluster running),
#      DLOCK_KIND_IMAGE (default dlock:kind-e2e), DLOCK_KIND_PAYOUTS (default 20),
#      DLOCK_KIND_TIMEOUT (seconds per wait, default 600).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cluster="${DLOCK_KIND_CLUSTER:-dlock-e2e}"
image="${DLOCK_KIND_IMAGE:-dlock:kind-e2e}"
payouts="${DLOCK_KIND_PAYOUTS:-20}"
timeout="${DLOCK_KIND_TIMEOUT:-600}"
ns=dlock-e2e
op_ns=dlock-system
tools="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
export PATH="$tools/bin:$PATH"

log() { printf '[kind] %s\n' "$*" >&2; }
skip() { log "$*"; echo "skipped"; exit 0; }
die() { log "ERROR: $*"; exit 1; }

command -v docker >/dev/null || skip "docker is not installed; the kind tier needs Docker"
docker info >/dev/null 2>&1 || skip "docker is installed but no Docker daemon answers (docker info failed)"
command -v kind >/dev/null || skip "kind is not installed (go install sigs.k8s.io/kind@latest, or see https://kind.sigs.k8s.io)"
command -v kubectl >/dev/null || die "kubectl is required"
command -v helm >/dev/null || die "helm is required (scripts/cluster-tools.sh helm builds it into $tools/bin)"

# ---------------------------------------------------------------- 1. image
log "building $image"
docker build -t "$image" "$root"

# ---------------------------------------------------------------- 2. cluster
kubeconfig="$(mktemp "${TMPDIR:-/tmp}/dlock-kind-kubeconfig.XXXXXX")"
export KUBECONFIG="$kubeconfig"
created=0
cleanup() {
    local rc=$?
    if ((rc != 0)); then
        log "failed; state for debugging:"
        kubectl get lsvc,pstack,deploy,sts,jobs,pods -A -o wide 2>&1 | tail -n 60 >&2 || true
        kubectl -n "$op_ns" logs deploy/dlock-operator --tail 80 >&2 || true
    fi
    if ((created)) && [[ "${DLOCK_KIND_KEEP:-0}" != 1 ]]; then
        kind delete cluster --name "$cluster" >&2 || true
    fi
    rm -f "$kubeconfig"
    exit "$rc"
}
trap cleanup EXIT

if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    log "reusing kind cluster $cluster"
    kind export kubeconfig --name "$cluster" --kubeconfig "$kubeconfig"
else
    log "creating kind cluster $cluster"
    kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 180s
    created=1
fi
log "loading $image into $cluster"
kind load docker-image "$image" --name "$cluster"

# ---------------------------------------------------------------- 3. operator
repo="${image%:*}"
tag="${image##*:}"
log "installing the chart (operator in $op_ns)"
helm upgrade --install dlock-operator "$root/charts/dlock-operator" \
    --namespace "$op_ns" --create-namespace \
    --set image.repository="$repo" --set image.tag="$tag" --set image.pullPolicy=Never \
    --wait --timeout "${timeout}s"
kubectl wait --for=condition=Established crd/lockservices.dlock.dev crd/paymentstacks.dlock.dev --timeout=60s

# ---------------------------------------------------------------- 4. the stack
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$ns" apply -f "$root/config/samples/lockservice-managed.yaml"
kubectl -n "$ns" apply -f "$root/config/samples/paymentstack-managed.yaml"
lsvc="$(kubectl -n "$ns" get lsvc -o jsonpath='{.items[0].metadata.name}')"
pstack="$(kubectl -n "$ns" get pstack -o jsonpath='{.items[0].metadata.name}')"
log "waiting for LockService $lsvc and PaymentStack $pstack to be Ready"
kubectl -n "$ns" wait --for=condition=Ready "lsvc/$lsvc" --timeout="${timeout}s"
kubectl -n "$ns" wait --for=condition=Ready "pstack/$pstack" --timeout="${timeout}s"
kubectl -n "$ns" get lsvc,pstack,deploy,sts,jobs

# ---------------------------------------------------------------- 5. a payout batch
# paydb is reached with the owner URL from the stack's connection Secret (never printed) by throwaway
# postgres:16 Jobs running psql. The batch needs only the schema (C1 + V3) and the synthetic accounts
# of R__seed_synthetic_accounts.sql: PENDING payouts with unique idempotency keys against the EUR
# customer accounts; payout-executor (already running) claims each one, takes the account lock,
# submits through rail-proxy to the rail-stub (ack) and posts it.
conn_secret="$pstack-paydb-conn"
kubectl -n "$ns" get secret "$conn_secret" >/dev/null || die "no connection Secret $conn_secret"
run_id="kind-$(date +%s)"

psql_job() { # psql_job NAME SQL: runs SQL against paydb in a Job, prints psql's output
    local name="$1" sql="$2"
    kubectl -n "$ns" delete job,configmap "$name" --ignore-not-found >/dev/null
    kubectl -n "$ns" create configmap "$name" --from-literal=sql="$sql" >/dev/null
    kubectl -n "$ns" apply -f - >/dev/null <<JOB
apiVersion: batch/v1
kind: Job
metadata:
  name: $name
spec:
  backoffLimit: 0
  ttlSecondsAfterFinished: 600
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: psql
          image: postgres:16
          command: ["sh", "-c", 'exec psql "\$PGURL" -v ON_ERROR_STOP=1 -At -c "\$SQL"']
          env:
            - name: PGURL
              valueFrom:
                secretKeyRef: {name: $conn_secret, key: admin-url}
            - name: SQL
              valueFrom:
                configMapKeyRef: {name: $name, key: sql}
JOB
    if ! kubectl -n "$ns" wait --for=condition=Complete "job/$name" --timeout=300s >/dev/null; then
        kubectl -n "$ns" logs "job/$name" >&2 || true
        die "psql Job $name did not complete"
    fi
    kubectl -n "$ns" logs "job/$name"
}

log "seeding $payouts PENDING payouts (run $run_id)"
psql_job dlock-kind-seed "
INSERT INTO payout (payout_id, account_id, amount_minor, currency, idempotency_key)
SELECT gen_random_uuid(),
       ('00000000-0000-4000-8000-0000000000' || lpad((1 + i % 10)::text, 2, '0'))::uuid,
       100 + i, 'EUR', '$run_id-' || i
  FROM generate_series(1, $payouts) AS i;
SELECT count(*) FROM payout WHERE idempotency_key LIKE '$run_id-%';" >/dev/null

log "waiting for payout-executor to post the batch"
deadline=$((SECONDS + timeout))
while :; do
    counts="$(psql_job dlock-kind-poll "
SELECT count(*) FILTER (WHERE state = 'POSTED') || ' ' ||
       count(*) FILTER (WHERE state IN ('FAILED','ABANDONED','RAIL_AMBIGUOUS'))
  FROM payout WHERE idempotency_key LIKE '$run_id-%';")"
    posted="${counts% *}"
    bad="${counts#* }"
    log "posted $posted/$payouts, failed $bad"
    ((bad == 0)) || die "$bad payouts of the batch failed"
    ((posted == payouts)) && break
    ((SECONDS < deadline)) || die "the batch was not posted within ${timeout}s"
    sleep 5
done

log "checking the ledger"
verdict="$(psql_job dlock-kind-check "
WITH batch AS (SELECT payout_id, amount_minor FROM payout WHERE idempotency_key LIKE '$run_id-%'),
legs AS (
  SELECT b.payout_id,
         count(*) FILTER (WHERE l.direction = 'DEBIT')  AS debits,
         count(*) FILTER (WHERE l.direction = 'CREDIT') AS credits,
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
  (SELECT count(*) FROM rail_submission s JOIN batch b ON b.payout_id = s.payout_id WHERE s.outcome = 'FENCED');")"
read -r unbalanced drifted fenced <<<"$verdict"
log "payouts with unbalanced legs: $unbalanced; customer accounts whose balance != opening - debits + credits: $drifted; fenced submissions: $fenced"
((unbalanced == 0 && drifted == 0)) || die "the ledger does not balance"
((fenced == 0)) || die "a healthy run fenced out $fenced submissions (lock_fenced_out must stay zero)"
log "OK: $payouts payouts posted through the operator-managed stack in kind"
