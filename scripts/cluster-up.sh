#!/usr/bin/env bash
# A real, minimal Kubernetes control plane on loopback for the cluster tier: etcd + kube-apiserver,
# nothing else. There is no kubelet, scheduler or controller-manager, so Deployments, StatefulSets and
# Jobs are stored and validated but no pod ever runs; the e2e tests stand in for the kubelet where
# they need to (see e2e/README.md).
#
#   scripts/cluster-up.sh -- CMD [ARGS...]   start, run CMD with KUBECONFIG exported, tear down; exits
#                                            with CMD's status
#   scripts/cluster-up.sh                    start and keep running until Ctrl-C / SIGTERM
#
# Everything lives in one temp dir (certs, etcd data, logs, kubeconfig) that is removed on exit unless
# DLOCK_E2E_KEEP=1. The dir's cluster.env exports KUBECONFIG and DLOCK_E2E_CLUSTER_DIR for other shells.
# Tools come from scripts/cluster-tools.sh ($DLOCK_TOOLS_DIR/bin).
set -euo pipefail

TOOLS="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
BIN="$TOOLS/bin"
READY_TIMEOUT="${DLOCK_E2E_READY_TIMEOUT:-180}"

log() { printf '[cluster-up] %s\n' "$*" >&2; }
die() { printf '[cluster-up] ERROR: %s\n' "$*" >&2; exit 1; }

for t in etcd kube-apiserver; do
    [[ -x "$BIN/$t" ]] || die "$BIN/$t is missing: run scripts/cluster-tools.sh first"
done
command -v kubectl >/dev/null || die "kubectl is not on PATH"
command -v openssl >/dev/null || die "openssl is not on PATH"
command -v curl >/dev/null || die "curl is not on PATH"

if (($#)) && [[ "$1" == "--" ]]; then shift; fi

DIR="$(mktemp -d "${TMPDIR:-/tmp}/dlock-cluster.XXXXXX")"
PIDS=()

teardown() {
    local rc=$?
    trap - EXIT INT TERM
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ "${DLOCK_E2E_KEEP:-0}" == 1 ]]; then
        log "kept $DIR (DLOCK_E2E_KEEP=1)"
    else
        rm -rf "$DIR"
        log "stopped and removed $DIR"
    fi
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    # Ask the kernel for a free loopback port. Another process could take it before we bind it;
    # if that happens the readiness wait below reports the server's log.
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    else
        local p
        while :; do
            p=$((20000 + RANDOM % 30000))
            (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
        done
    fi
}

ETCD_PORT="${DLOCK_E2E_ETCD_PORT:-$(free_port)}"
ETCD_PEER_PORT="${DLOCK_E2E_ETCD_PEER_PORT:-$(free_port)}"
API_PORT="${DLOCK_E2E_APISERVER_PORT:-$(free_port)}"
SERVER="https://127.0.0.1:$API_PORT"

# ---------------------------------------------------------------- certificates
PKI="$DIR/pki"
mkdir -p "$PKI"
ossl() { openssl "$@" >/dev/null 2>&1 || die "openssl $1 failed"; }

ossl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=dlock-e2e-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt"

sign() { # sign NAME SUBJECT EXTFILE-CONTENT
    ossl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$PKI/$1.key" -out "$PKI/$1.csr"
    printf '%s\n' "$3" >"$PKI/$1.ext"
    ossl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 7 \
        -extfile "$PKI/$1.ext" -out "$PKI/$1.crt"
}

# The serving cert covers every name a client may dial: loopback, and the in-cluster names of the
# kubernetes Service (first IP of the service range) for completeness.
sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"

# Group system:masters is bound to cluster-admin by the apiserver's bootstrap RBAC policy.
sign admin "/O=system:masters/CN=dlock-e2e-admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

# Service-account token signing key pair (TokenRequest, `kubectl create token`).
ossl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key"
ossl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
log "certificates in $PKI"

# ---------------------------------------------------------------- etcd
mkdir -p "$DIR/etcd"
"$BIN/etcd" \
    --name dlock-e2e \
    --data-dir "$DIR/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "dlock-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state new \
    --quota-backend-bytes $((2 * 1024 * 1024 * 1024)) \
    >"$DIR/etcd.log" 2>&1 &
PIDS+=($!)
ETCD_PID=$!

deadline=$((SECONDS + 60))
until curl -fsS "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; do
    kill -0 "$ETCD_PID" 2>/dev/null || { tail -n 30 "$DIR/etcd.log" >&2; die "etcd exited"; }
    ((SECONDS < deadline)) || { tail -n 30 "$DIR/etcd.log" >&2; die "etcd not healthy within 60s"; }
    sleep 0.2
done
log "etcd $("$BIN/etcd" --version | sed -n 's/^etcd Version: //p') healthy on 127.0.0.1:$ETCD_PORT"

# ---------------------------------------------------------------- kube-apiserver
# RBAC only (no Node authorizer: there are no nodes). No endpoint reconciler: it would try to publish
# 127.0.0.1 as the kubernetes Service's endpoint, which the API rejects as loopback.
"$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 \
    --advertise-address 127.0.0.1 \
    --secure-port "$API_PORT" \
    --cert-dir "$DIR/apiserver-certs" \
    --tls-cert-file "$PKI/apiserver.crt" \
    --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --endpoint-reconciler-type none \
    --allow-privileged=false \
    --profiling=false \
    --v=1 \
    >"$DIR/kube-apiserver.log" 2>&1 &
PIDS+=($!)
API_PID=$!

export KUBECONFIG="$DIR/admin.kubeconfig"
kubectl config set-cluster dlock-e2e --server "$SERVER" --certificate-authority "$PKI/ca.crt" \
    --embed-certs >/dev/null
kubectl config set-credentials dlock-e2e-admin --client-certificate "$PKI/admin.crt" \
    --client-key "$PKI/admin.key" --embed-certs >/dev/null
kubectl config set-context dlock-e2e --cluster dlock-e2e --user dlock-e2e-admin >/dev/null
kubectl config use-context dlock-e2e >/dev/null

deadline=$((SECONDS + READY_TIMEOUT))
until curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "$SERVER/readyz" >/dev/null 2>&1; do
    kill -0 "$API_PID" 2>/dev/null || { tail -n 40 "$DIR/kube-apiserver.log" >&2; die "kube-apiserver exited"; }
    if ((SECONDS >= deadline)); then
        curl -sS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
            "$SERVER/readyz?verbose" >&2 || true
        tail -n 40 "$DIR/kube-apiserver.log" >&2
        die "kube-apiserver not ready within ${READY_TIMEOUT}s"
    fi
    sleep 0.5
done
log "kube-apiserver $("$BIN/kube-apiserver" --version | sed 's/^Kubernetes //') ready at $SERVER"

cat >"$DIR/cluster.env" <<EOF
export KUBECONFIG='$KUBECONFIG'
export DLOCK_E2E_CLUSTER_DIR='$DIR'
EOF
export DLOCK_E2E_CLUSTER_DIR="$DIR"
log "admin kubeconfig: $KUBECONFIG (source $DIR/cluster.env in another shell)"

if (($#)); then
    set +e
    "$@"
    rc=$?
    set -e
    exit "$rc"
fi

log "running; Ctrl-C or SIGTERM to stop"
# Exit (and tear down) as soon as either server dies, or on a signal.
wait -n "${PIDS[@]}" || true
kill -0 "$ETCD_PID" 2>/dev/null || log "etcd exited; see $DIR/etcd.log"
kill -0 "$API_PID" 2>/dev/null || log "kube-apiserver exited; see $DIR/kube-apiserver.log"
exit 1
