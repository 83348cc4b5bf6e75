#!/usr/bin/env bash
# Installs what the cluster tier (e2e/) needs, idempotently, into a cache outside the clone:
#
#   $DLOCK_TOOLS_DIR/bin/kube-apiserver   built with Go from k8s.io/kubernetes (only the Go module proxy
#                                         is needed, not github)
#   $DLOCK_TOOLS_DIR/bin/helm             built with Go from helm.sh/helm/v3
#   $DLOCK_TOOLS_DIR/bin/etcd             etcd-server from apt if it is new enough, else built with Go
#   $DLOCK_TOOLS_DIR/bin/etcdutl          etcd's offline tool (snapshot restore --bump-revision), built
#                                         with Go at $ETCD_VERSION; not in the default set (setup.sh
#                                         asks for it: the etcd restore test uses it)
#   $DLOCK_TOOLS_DIR/bin/promtool         Prometheus's rule checker, built with Go at $PROMETHEUS_VERSION
#                                         (the promtool package only, without the service discoveries);
#                                         not in the default set (test.sh asks for it: the chart's
#                                         alerts and dashboard are checked with it)
#   kubectl                               must already be on PATH (checked, not installed)
#
# Reruns reuse everything: each tool has a stamp file naming the version it was built from. The Go
# module and build caches live under the tools dir as well, so a rebuild after a version bump only
# compiles what changed. Builds run under `nice` (a cargo build beside them keeps the CPU it needs)
# with two packages at a time, as scripts/kind-tools.sh does: in the test command nothing else runs
# while they build, and one at a time left one of the machine's two cores idle
# (DLOCK_GO_P=1 restores that).
#
# Usage: scripts/cluster-tools.sh [--check] [TOOL...]
#   --check   report what is missing, install nothing (exit 1 if anything is)
#   TOOL      any of kubectl etcd etcdutl helm kube-apiserver promtool (default: all but etcdutl
#             and promtool)
set -euo pipefail

TOOLS="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
BIN="$TOOLS/bin"
K8S_VERSION="${DLOCK_K8S_VERSION:-v1.34.4}"
HELM_VERSION="${DLOCK_HELM_VERSION:-v3.19.5}"
# Only used when apt's etcd is too old or absent (or DLOCK_ETCD_BUILD=1); see need_etcd.
ETCD_VERSION="${DLOCK_ETCD_VERSION:-v3.5.21}"
ETCD_MIN="3.4.0"
# Prometheus 3.5.1, the long-term-support line: its Go module is tagged v0.<300+minor>.<patch>; its
# go.mod asks for Go 1.23, so the Go that builds kube-apiserver (>= 1.24) builds it (checked with 1.26).
PROMETHEUS_VERSION="${DLOCK_PROMETHEUS_VERSION:-v0.305.1}"

CHECK_ONLY=0
if [[ "${1:-}" == "--check" ]]; then CHECK_ONLY=1; shift; fi
WANT=("$@")
((${#WANT[@]})) || WANT=(kubectl etcd helm kube-apiserver)

log() { printf '[cluster-tools] %s\n' "$*" >&2; }
die() { printf '[cluster-tools] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$BIN"
export GOMODCACHE="$TOOLS/go/mod"
export GOCACHE="$TOOLS/go/cache"
export GOPATH="$TOOLS/go/path"
# DLOCK_GO_P packages at a time; no VCS stamping (the throwaway modules are not repositories).
export GOFLAGS="-p=${DLOCK_GO_P:-2} -buildvcs=false -mod=mod"
export CGO_ENABLED=0

gentle() { nice -n 10 "$@"; }

# Throwaway build modules, removed however the script ends.
WORKDIRS=()
cleanup() { if ((${#WORKDIRS[@]})); then rm -rf "${WORKDIRS[@]}"; fi; }
trap cleanup EXIT

stamp_ok() { # stamp_ok NAME VERSION: the binary exists and was built from VERSION
    [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]
}

write_stamp() { printf '%s\n' "$2" >"$BIN/.$1.version"; }

version_ge() { # version_ge A B: A >= B (dotted numbers)
    [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" == "$2" ]]
}

need_go() {
    command -v go >/dev/null || die "go is not installed; install Go >= 1.24 (https://go.dev/dl/)"
}

# ---------------------------------------------------------------- kube-apiserver
need_kube_apiserver() {
    if stamp_ok kube-apiserver "$K8S_VERSION"; then
        log "kube-apiserver $K8S_VERSION: cached at $BIN/kube-apiserver"
        return
    fi
    if ((CHECK_ONLY)); then log "kube-apiserver $K8S_VERSION: MISSING"; MISSING=1; return; fi
    need_go
    local minor="${K8S_VERSION#v1.}"
    minor="${minor%%.*}"
    local staging="v0.${K8S_VERSION#v1.}"
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/dlock-kube-apiserver.XXXXXX")"
    WORKDIRS+=("$work")
    log "kube-apiserver $K8S_VERSION: building in $work (slow: tens of minutes on 2 cores)"

    # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging paths,
    # which do not exist outside its repository. Read that list from its go.mod and point each one at
    # the published tag of the same release instead.
    local modfile
    modfile="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$modfile" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
    local replaces
    replaces="$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*#\1#p' "$modfile")"
    [[ -n "$replaces" ]] || die "no staging replace directives found in $modfile"

    {
        echo "module dlock.local/kube-apiserver-build"
        echo
        echo "go $(sed -n 's/^go \(.*\)/\1/p' "$modfile")"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        local m
        for m in $replaces; do echo "	$m => $m $staging"; done
        echo ")"
    } >"$work/go.mod"
    log "kube-apiserver: $(wc -w <<<"$replaces") staging modules pinned to $staging"

    (cd "$work" && gentle go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION") ||
        die "go get k8s.io/kubernetes/cmd/kube-apiserver failed"
    local pkg=k8s.io/component-base/version
    local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (cd "$work" && gentle go build -trimpath -ldflags "$ldflags" -o "$BIN/kube-apiserver.new" \
        k8s.io/kubernetes/cmd/kube-apiserver) || die "go build kube-apiserver failed"
    mv "$BIN/kube-apiserver.new" "$BIN/kube-apiserver"
    write_stamp kube-apiserver "$K8S_VERSION"
    log "kube-apiserver: $("$BIN/kube-apiserver" --version)"
}

# ---------------------------------------------------------------- helm
need_helm() {
    # The stamp names the build recipe too, so a binary built without the capability flags is redone.
    local stamp="$HELM_VERSION+kube-capabilities"
    if stamp_ok helm "$stamp"; then
        log "helm $HELM_VERSION: cached at $BIN/helm"
        return
    fi
    if ((CHECK_ONLY)); then log "helm $HELM_VERSION: MISSING"; MISSING=1; return; fi
    need_go
    log "helm $HELM_VERSION: building"
    # As helm's Makefile does: stamp the version, and the Kubernetes version `helm template` and
    # `helm lint` assume (derived from the client-go it is built with: v0.34 -> 1.34). Without the
    # latter they assume 1.20 and refuse any chart with a newer kubeVersion constraint.
    local modfile cg major minor
    modfile="$(cd / && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$modfile" ]] || die "could not download helm.sh/helm/v3@$HELM_VERSION"
    cg="$(sed -n 's#^[[:space:]]*k8s\.io/client-go v\([0-9]*\)\.\([0-9]*\)\..*#\1 \2#p' "$modfile" | head -n1)"
    [[ -n "$cg" ]] || die "no k8s.io/client-go requirement in $modfile"
    major=$((${cg% *} + 1))
    minor="${cg#* }"
    local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    local p
    for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        ld+=" -X $p.k8sVersionMajor=$major -X $p.k8sVersionMinor=$minor"
    done
    # `go install pkg@version` works outside any module; helm's go.mod has no replace directives.
    (cd / && GOBIN="$BIN" gentle go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") ||
        die "go install helm failed"
    write_stamp helm "$stamp"
    log "helm: $("$BIN/helm" version --short), templates for Kubernetes $major.$minor"
}

# ---------------------------------------------------------------- etcd
etcd_version_of() { "$1" --version 2>/dev/null | sed -n 's/^etcd Version: \([0-9.]*\).*/\1/p'; }

need_etcd() {
    # Debian bookworm's etcd-server is 3.4.23. kube-apiserver 1.34 is released against etcd 3.5/3.6
    # but accepts 3.4: checked, it starts, serves and passes the e2e tier; it only logs
    # "RequestWatchProgress feature is not supported" and falls back from consistent reads out of its
    # watch cache to reading etcd, which changes nothing the tests observe. So the distro package is
    # used when present (>= $ETCD_MIN); without it (or with DLOCK_ETCD_BUILD=1) etcd $ETCD_VERSION is
    # built from go.etcd.io with Go.
    local force="${DLOCK_ETCD_BUILD:-0}"
    if [[ -x "$BIN/etcd" ]] && ! { ((force)) && [[ -L "$BIN/etcd" ]]; }; then
        log "etcd $(etcd_version_of "$BIN/etcd"): cached at $BIN/etcd"
        return
    fi
    if ! command -v etcd >/dev/null && ((!CHECK_ONLY && !force)) && command -v apt-get >/dev/null; then
        log "etcd: installing Debian's etcd-server"
        if [[ $(id -u) -eq 0 ]]; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >&2 ||
                { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >&2; } ||
                log "etcd: apt-get install etcd-server failed; will build from source"
        else
            sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >&2 ||
                log "etcd: cannot apt-get install without root; will build from source"
        fi
        # Debian enables and starts the packaged service on :2379; ours use their own ports, but do
        # not leave a stray server running on a test machine.
        if command -v systemctl >/dev/null; then systemctl disable --now etcd >/dev/null 2>&1 || true; fi
    fi
    local sys
    sys="$(command -v etcd || true)"
    if [[ -n "$sys" ]] && ((!force)); then
        local v
        v="$(etcd_version_of "$sys")"
        if [[ -n "$v" ]] && version_ge "$v" "$ETCD_MIN"; then
            ln -sf "$sys" "$BIN/etcd"
            log "etcd $v: using $sys"
            return
        fi
        log "etcd: $sys is $v, older than $ETCD_MIN; building $ETCD_VERSION with Go instead"
    fi
    if ((CHECK_ONLY)); then log "etcd >= $ETCD_MIN: MISSING"; MISSING=1; return; fi
    need_go
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/dlock-etcd.XXXXXX")"
    WORKDIRS+=("$work")
    # etcd's main package is go.etcd.io/etcd/server/v3 (server/main.go). Its go.mod replaces the
    # sibling modules with ../ paths, which is why `go install ...@version` refuses it; built from a
    # throwaway module instead, those replaces (a dependency's) are ignored and the versions its
    # go.mod requires (api/v3 v3.5.x, client/v2 v2.305.x, ...) come from the module proxy.
    local ev="$ETCD_VERSION"
    printf 'module dlock.local/etcd-build\n\ngo 1.23\n' >"$work/go.mod"
    log "etcd $ev: building in $work"
    (cd "$work" && gentle go get "go.etcd.io/etcd/server/v3@$ev") || die "go get go.etcd.io/etcd/server/v3 failed"
    (cd "$work" && gentle go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.new" go.etcd.io/etcd/server/v3) ||
        die "go build etcd failed"
    "$BIN/etcd.new" --version >/dev/null || die "the etcd build does not run"
    rm -f "$BIN/etcd"
    mv "$BIN/etcd.new" "$BIN/etcd"
    log "etcd: $("$BIN/etcd" --version | head -n1)"
}

# ---------------------------------------------------------------- etcdutl
need_etcdutl() {
    # Restoring a snapshot rewinds etcd's revision, and the revision is lock-server's fencing token,
    # so a restore must be able to move it forward: `etcdutl snapshot restore --bump-revision N
    # --mark-compacted`, which exists from etcd 3.5 on (Debian ships 3.4: no etcdutl, no such flags).
    # Only the offline tool is built. Checked: the 3.4 server (bin/etcd) starts on a data dir this
    # etcdutl restored, continues from the bumped revision and answers reads below it as compacted,
    # so bin/etcd stays whatever need_etcd chose and no second server is needed.
    local ev="$ETCD_VERSION"
    if stamp_ok etcdutl "$ev"; then
        log "etcdutl $ev: cached at $BIN/etcdutl"
        return
    fi
    if ((CHECK_ONLY)); then log "etcdutl $ev: MISSING"; MISSING=1; return; fi
    need_go
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/dlock-etcdutl.XXXXXX")"
    WORKDIRS+=("$work")
    # As for need_etcd: etcdutl's go.mod replaces its sibling modules with ../ paths, so it is built
    # from a throwaway module that requires it at the release tag.
    printf 'module dlock.local/etcdutl-build\n\ngo 1.23\n' >"$work/go.mod"
    log "etcdutl $ev: building in $work"
    (cd "$work" && gentle go get "go.etcd.io/etcd/etcdutl/v3@$ev") || die "go get go.etcd.io/etcd/etcdutl/v3 failed"
    (cd "$work" && gentle go build -trimpath -ldflags "-s -w" -o "$BIN/etcdutl.new" go.etcd.io/etcd/etcdutl/v3) ||
        die "go build etcdutl failed"
    # The flags are the reason for this tool; a release without them is not good enough.
    "$BIN/etcdutl.new" snapshot restore --help 2>&1 | grep -q -- '--bump-revision' ||
        die "etcdutl $ev has no snapshot restore --bump-revision"
    mv "$BIN/etcdutl.new" "$BIN/etcdutl"
    write_stamp etcdutl "$ev"
    log "etcdutl: $("$BIN/etcdutl" version | head -n1)"
}

# ---------------------------------------------------------------- promtool
need_promtool() {
    # The stamp names the recipe too (the service discoveries left out), so a change of it rebuilds.
    local stamp="$PROMETHEUS_VERSION+remove_all_sd"
    if stamp_ok promtool "$stamp"; then
        log "promtool $PROMETHEUS_VERSION: cached at $BIN/promtool"
        return
    fi
    if ((CHECK_ONLY)); then log "promtool $PROMETHEUS_VERSION: MISSING"; MISSING=1; return; fi
    need_go
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/dlock-promtool.XXXXXX")"
    WORKDIRS+=("$work")
    # Prometheus's go.mod has exclude and replace directives, which `go install pkg@version`
    # refuses; as for etcd, a throwaway module requires it at the release tag, and carries those
    # directives over (a dependency's are ignored, and its build relies on them).
    local modfile
    modfile="$(cd "$work" && go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$modfile" ]] || die "could not download github.com/prometheus/prometheus@$PROMETHEUS_VERSION"
    {
        echo "module dlock.local/promtool-build"
        echo
        echo "go $(sed -n 's/^go \(.*\)/\1/p' "$modfile")"
        echo
        echo "require github.com/prometheus/prometheus $PROMETHEUS_VERSION"
        echo
        awk '/^(exclude|replace)[[:space:]]*\($/ {block = 1}
             block {print; if ($0 ~ /^\)/) block = 0; next}
             /^(exclude|replace)[[:space:]]/ {print}' "$modfile"
    } >"$work/go.mod"
    log "promtool $PROMETHEUS_VERSION: building in $work (the promtool package only)"
    # remove_all_sd: promtool registers every service discovery (cloud SDKs) by default; it checks
    # and tests rules without any of them.
    local tags=remove_all_sd
    (cd "$work" && gentle go get -tags "$tags" "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION") ||
        die "go get github.com/prometheus/prometheus/cmd/promtool failed"
    local tag="${PROMETHEUS_VERSION#v0.}"
    local release="3.$((10#${tag%%.*} - 300)).${tag#*.}"
    local pkg=github.com/prometheus/common/version
    (cd "$work" && gentle go build -trimpath -tags "$tags" \
        -ldflags "-s -w -X $pkg.Version=$release -X $pkg.Branch=$PROMETHEUS_VERSION -X $pkg.BuildUser=dlock" \
        -o "$BIN/promtool.new" github.com/prometheus/prometheus/cmd/promtool) || die "go build promtool failed"
    "$BIN/promtool.new" test rules --help >/dev/null 2>&1 || die "the promtool build does not run"
    mv "$BIN/promtool.new" "$BIN/promtool"
    write_stamp promtool "$stamp"
    log "promtool: $("$BIN/promtool" --version 2>&1 | head -n1)"
}

# ---------------------------------------------------------------- kubectl
need_kubectl() {
    command -v kubectl >/dev/null ||
        die "kubectl is not on PATH; install it (https://kubernetes.io/docs/tasks/tools/) and rerun"
    log "kubectl: $(kubectl version --client 2>/dev/null | head -n1)"
}

MISSING=0
for tool in "${WANT[@]}"; do
    case "$tool" in
    kubectl) need_kubectl ;;
    etcd) need_etcd ;;
    etcdutl) need_etcdutl ;;
    helm) need_helm ;;
    kube-apiserver) need_kube_apiserver ;;
    promtool) need_promtool ;;
    *) die "unknown tool $tool (want kubectl, etcd, etcdutl, helm, kube-apiserver or promtool)" ;;
    esac
done
if ((CHECK_ONLY && MISSING)); then
    log "some tools are missing; run scripts/cluster-tools.sh to install them"
    exit 1
fi
log "all cluster tools ready under $BIN"
