#!/usr/bin/env bash
# Builds, once, everything the kind tier (e2e/kind/run.sh) needs, into the tools cache outside the
# clone ($DLOCK_TOOLS_DIR, default /var/tmp/dlock-tools). Nothing is pulled from an image registry:
# every image is assembled here from Debian packages and from Go modules (Go module proxy only).
#
#   bin/kind                         sigs.k8s.io/kind, built with Go
#   k8s/kubernetes/server/bin/...    kubelet, kubeadm, kubectl, kube-controller-manager,
#                                    kube-scheduler, kube-proxy (kube-apiserver comes from
#                                    scripts/cluster-tools.sh) + their images as docker archives, the
#                                    layout `kind build node-image` reads
#   images                           dlock-local/debian (debootstrap), dlock-local/kind-base, the
#                                    auxiliary images the node image references (pause, etcd,
#                                    CoreDNS, kindnetd, local-path-provisioner/-helper) and the
#                                    node image dlock-local/kind-node:$K8S_VERSION
#   kind-aux/kube-router + image     the NetworkPolicy enforcer of the kind tier: kube-router's network
#                                    policy controller (github.com/cloudnativelabs/kube-router, Go),
#                                    on the Debian base with iptables and ipset: dlock-local/kube-router
#   cnpg/manager + image + manifest  CloudNativePG (github.com/cloudnative-pg/cloudnative-pg, Go):
#                                    the operator image dlock-local/cloudnative-pg:1.27.1 and its
#                                    release manifest (CRDs, RBAC, webhooks, Deployment) rewritten
#                                    for that image: cnpg/cnpg-1.27.1.yaml. Its PostgreSQL operand
#                                    is the postgres step's image, also tagged with the full
#                                    version (dlock-local/postgres:16.15)
#
# Each step leaves a stamp naming what it was built from; a rerun skips what is current. Go builds
# run under `nice` with bounded parallelism (the machine has two cores shared with cargo).
#
# Usage: scripts/kind-tools.sh [--check] [STEP...]
#   --check   build nothing; exit 1 naming what is not built yet
#   steps (default: all, in this order): kind k8s apiserver aux debian base node postgres cnpg netpol
# Needs a Docker daemon (scripts/docker-up.sh starts one).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
BIN="$TOOLS/bin"
K8S_VERSION="${DLOCK_K8S_VERSION:-v1.34.4}"
KIND_VERSION="${DLOCK_KIND_VERSION:-v0.30.0}"
GO_P="${DLOCK_GO_P:-2}"
K8S_DIR="$TOOLS/k8s/$K8S_VERSION"

log() { printf '[kind-tools] %s\n' "$*" >&2; }
die() { printf '[kind-tools] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$BIN" "$TOOLS/stamps"
export GOMODCACHE="$TOOLS/go/mod"
export GOCACHE="$TOOLS/go/cache"
export GOPATH="$TOOLS/go/path"
export GOFLAGS="-p=$GO_P -buildvcs=false -mod=mod"
export CGO_ENABLED=0

gentle() { nice -n 10 "$@"; }
timed() { # timed LABEL CMD...: runs CMD, logs how long it took
    local label="$1" t0=$SECONDS
    shift
    "$@"
    log "$label: done in $((SECONDS - t0))s"
}

WORKDIRS=()
cleanup() { if ((${#WORKDIRS[@]})); then rm -rf "${WORKDIRS[@]}"; fi; }
trap cleanup EXIT
workdir() { local d; d="$(mktemp -d "${TMPDIR:-/tmp}/dlock-kind-tools.XXXXXX")"; WORKDIRS+=("$d"); echo "$d"; }

stamp_ok() { [[ -f "$TOOLS/stamps/$1" && "$(cat "$TOOLS/stamps/$1")" == "$2" ]]; }
write_stamp() { printf '%s\n' "$2" >"$TOOLS/stamps/$1"; }

# ---------------------------------------------------------------- kind
need_kind() {
    if [[ -x "$BIN/kind" ]] && stamp_ok kind "$KIND_VERSION"; then log "kind $KIND_VERSION: cached"; return; fi
    missing_in_check "${FUNCNAME[0]}" && return
    log "kind $KIND_VERSION: building"
    (cd / && GOBIN="$BIN" gentle go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION") ||
        die "go install sigs.k8s.io/kind failed"
    write_stamp kind "$KIND_VERSION"
    log "kind: $("$BIN/kind" version)"
}

# ---------------------------------------------------------------- Kubernetes binaries
# The same trick as scripts/cluster-tools.sh: a throwaway module requiring k8s.io/kubernetes, with its
# staging modules (replaced by ./staging paths in its own go.mod) pinned to the published tags.
k8s_module() { # k8s_module DIR: writes DIR/go.mod
    local work="$1" modfile replaces staging="v0.${K8S_VERSION#v1.}" m
    modfile="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$modfile" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
    replaces="$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*#\1#p' "$modfile")"
    {
        printf 'module dlock.local/kind-k8s-build\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' \
            "$(sed -n 's/^go \(.*\)/\1/p' "$modfile")" "$K8S_VERSION"
        for m in $replaces; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
        echo ")"
    } >"$work/go.mod"
}

K8S_BINS=(kubelet kubeadm kubectl kube-controller-manager kube-scheduler kube-proxy)
need_k8s_bins() {
    local out="$K8S_DIR/kubernetes/server/bin"
    if stamp_ok k8s-bins "$K8S_VERSION"; then log "Kubernetes $K8S_VERSION binaries: cached"; return; fi
    missing_in_check "${FUNCNAME[0]}" && return
    mkdir -p "$out"
    local work minor="${K8S_VERSION#v1.}" pkgs=() b
    minor="${minor%%.*}"
    work="$(workdir)"
    k8s_module "$work"
    for b in "${K8S_BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
    log "Kubernetes $K8S_VERSION: building ${K8S_BINS[*]} (slow on a cold cache)"
    (cd "$work" && gentle go get "${pkgs[@]/%/@$K8S_VERSION}") || die "go get Kubernetes commands failed"
    local pkg=k8s.io/component-base/version
    local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    # kubeadm stamps its own copy of the version as well
    ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
    (cd "$work" && gentle go build -trimpath -ldflags "$ld" -o "$out/" "${pkgs[@]}") ||
        die "go build of the Kubernetes commands failed"
    echo "$K8S_VERSION" >"$K8S_DIR/kubernetes/version"
    write_stamp k8s-bins "$K8S_VERSION"
}


# ---------------------------------------------------------------- kube-apiserver
# Built (and cached under the same stamp) by scripts/cluster-tools.sh for the cluster tier.
need_apiserver() {
    if ((CHECK_ONLY)); then
        [[ "$(cat "$BIN/.kube-apiserver.version" 2>/dev/null)" == "$K8S_VERSION" && -x "$K8S_DIR/kubernetes/server/bin/kube-apiserver" ]] ||
            missing_in_check "${FUNCNAME[0]}"
        return
    fi
    # Another run building it right now (the cluster tier's tools step): wait for it rather than
    # compiling the same thing twice on a shared machine.
    local deadline=$((SECONDS + 3600))
    while [[ "$(cat "$BIN/.kube-apiserver.version" 2>/dev/null)" != "$K8S_VERSION" ]] &&
        pgrep -f "k8s.io/kubernetes/cmd/kube-apiserver" >/dev/null; do
        ((SECONDS < deadline)) || die "waited an hour for another build of kube-apiserver"
        log "kube-apiserver: another build is running; waiting for its stamp"
        sleep 20
    done
    "$ROOT/scripts/cluster-tools.sh" kube-apiserver
    local out="$K8S_DIR/kubernetes/server/bin"
    mkdir -p "$out"
    cp "$BIN/kube-apiserver" "$out/kube-apiserver"
}

# ---------------------------------------------------------------- node-side and add-on binaries
AUX="$TOOLS/kind-aux"
CRICTL_VERSION="${DLOCK_CRICTL_VERSION:-v1.34.0}"
ETCD_IMAGE_VERSION="3.6.5" # what kubeadm $K8S_VERSION deploys (registry.k8s.io/etcd:3.6.5-0)
COREDNS_VERSION="v1.12.1"  # kubeadm's CoreDNSVersion for 1.34
LPP_VERSION="v0.0.30"      # github.com/rancher/local-path-provisioner
# github.com/cloudnativelabs/kube-router/v2: the newest release the Go module proxy serves
# (e2e/kind/kube-router.yaml runs the image of this tag).
KUBE_ROUTER_VERSION="v2.1.0"
aux_one() { # aux_one NAME VERSION: builds add-on binary NAME into $AUX unless its stamp matches
    local name="$1" v="$2" t0=$SECONDS
    if [[ -x "$AUX/$name" ]] && stamp_ok "aux-$name" "$v"; then log "$name $v: cached"; return; fi
    missing_in_check "$name" && return
    mkdir -p "$AUX"
    log "$name $v: building"
    "build_$name" "$v"
    write_stamp "aux-$name" "$v"
    log "$name: built in $((SECONDS - t0))s"
}
build_crictl() {
    (cd / && GOBIN="$AUX" gentle go install -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$1" \
        "sigs.k8s.io/cri-tools/cmd/crictl@$1") || die "go install crictl failed"
}
build_etcd() {
    # etcd's server module replaces its siblings with ../ paths; from a throwaway module those
    # replaces (a dependency's) are ignored and the required versions come from the proxy.
    local work
    work="$(workdir)"
    printf 'module dlock.local/etcd-build\n\ngo 1.24\n' >"$work/go.mod"
    (cd "$work" && gentle go get "go.etcd.io/etcd/server/v3@v$1" &&
        gentle go build -trimpath -ldflags "-s -w" -o "$AUX/etcd" go.etcd.io/etcd/server/v3) ||
        die "etcd build failed"
}
build_coredns() {
    (cd / && GOBIN="$AUX" gentle go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$1") ||
        die "go install coredns failed"
}
build_local-path-provisioner() {
    (cd / && GOBIN="$AUX" gentle go install -trimpath -ldflags "-s -w" \
        "github.com/rancher/local-path-provisioner@$1") || die "go install local-path-provisioner failed"
}
build_kube-router() {
    local v=github.com/cloudnativelabs/kube-router/v2/pkg/version
    (cd / && GOBIN="$AUX" gentle go install -trimpath -ldflags "-s -w -X $v.Version=$1" \
        "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$1") || die "go install kube-router failed"
}
build_pause() { # Kubernetes' own pause.c from the k8s.io/kubernetes module, linked statically
    local src
    src="$(cd / && go mod download -json "k8s.io/kubernetes@$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    gentle gcc -Os -Wall -static -DVERSION="$1" -o "$AUX/pause" "$src/build/pause/linux/pause.c" ||
        die "compiling pause failed"
}
aux_version() {
    case "$1" in
    crictl) echo "$CRICTL_VERSION" ;; pause) echo "$K8S_VERSION" ;; etcd) echo "$ETCD_IMAGE_VERSION" ;;
    local-path-provisioner) echo "$LPP_VERSION" ;; coredns) echo "$COREDNS_VERSION" ;;
    kube-router) echo "$KUBE_ROUTER_VERSION" ;;
    esac
}
need_aux_bins() {
    local b
    for b in crictl pause etcd local-path-provisioner coredns; do aux_one "$b" "$(aux_version "$b")"; done
}

# ---------------------------------------------------------------- images
DEBIAN_IMAGE=dlock-local/debian:bookworm
BASE_IMAGE=dlock-local/kind-base:$KIND_VERSION
NODE_IMAGE="${DLOCK_KIND_NODE_IMAGE:-dlock-local/kind-node:$K8S_VERSION}"
DEBIAN_MIRROR="${DLOCK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

have_image() { docker image inspect "$1" >/dev/null 2>&1; }
# The legacy builder: BuildKit would try to pull its frontend image, and there is no registry.
dbuild() { DOCKER_BUILDKIT=0 gentle docker build -q "$@" >/dev/null; }

recipe_hash() { # recipe_hash PATH...: hash of the recipe files, so an edited recipe is rebuilt
    (cd "$ROOT" && find "$@" -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}

need_debian() {
    if have_image "$DEBIAN_IMAGE"; then log "$DEBIAN_IMAGE: present"; return; fi
    missing_in_check "${FUNCNAME[0]}" && return
    command -v debootstrap >/dev/null || {
        [[ $(id -u) -eq 0 ]] || die "debootstrap is missing (apt-get install debootstrap)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >&2
    }
    local tree="$TOOLS/rootfs/bookworm"
    if [[ ! -f "$tree/.complete" ]]; then
        rm -rf "$tree"
        log "debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR"
        gentle debootstrap --variant=minbase bookworm "$tree" "$DEBIAN_MIRROR" >&2 || die "debootstrap failed"
        # Docker images carry no apt caches, nor the host's identity.
        rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/*
        : >"$tree/etc/hostname"
        touch "$tree/.complete"
    fi
    log "importing $DEBIAN_IMAGE"
    tar --exclude=./.complete --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
        -C "$tree" -c . | docker import -c 'CMD ["/bin/bash"]' - "$DEBIAN_IMAGE" >/dev/null
}

need_base() {
    local h tag
    h="$(recipe_hash images/kind-base)"
    tag="$BASE_IMAGE-$h"
    if have_image "$tag"; then docker tag "$tag" "$BASE_IMAGE"; log "$BASE_IMAGE: present"; return; fi
    missing_in_check "${FUNCNAME[0]}" && return
    local ctx kindsrc
    ctx="$(workdir)"
    kindsrc="$(cd / && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    cp -r "$kindsrc/images/base/files" "$ctx/files"
    chmod -R u+w "$ctx/files"
    cp "$ROOT"/images/kind-base/* "$ctx/"
    cp "$AUX/crictl" "$ctx/crictl"
    log "building $BASE_IMAGE from $DEBIAN_IMAGE (kind's images/base files + Debian packages)"
    dbuild -t "$tag" -t "$BASE_IMAGE" "$ctx" || die "building the kind base image failed"
}

# docker save writes docker.io names in their short form (kindest/kindnetd:...), but kind compares
# the archive's tags with the fully qualified names it wants; and it reads only the first entry of
# manifest.json, or every entry of `repositories` when that comes first. So: save, then rewrite.
save_archive() { # save_archive OUT IMAGE...
    local out="$1"
    shift
    docker save -o "$out.raw" "$@"
    python3 "$ROOT/images/kind-node/qualify-archive.py" "$out.raw" "$out"
    rm -f "$out.raw"
}

PG_IMAGE="${DLOCK_KIND_PG_IMAGE:-dlock-local/postgres:16}"
# The image carries the complete PostgreSQL 16 build scripts/setup.sh installs ($TOOLS/pg16: the
# server, psql, pg_isready, pg_basebackup, …); an older install (server binaries only) is replaced
# by setup.sh first.
need_postgres() {
    local pg="$TOOLS/pg16" h
    if ! (source "$ROOT/scripts/lib.sh" && pg16_current "$pg"); then
        missing_in_check pg16 && return
        "$ROOT/scripts/setup.sh"
    fi
    h="$(recipe_hash images/postgres)-$("$pg/bin/postgres" --version | awk '{print $3}')"
    if have_image "$PG_IMAGE" && [[ "$(docker image inspect -f '{{index .Config.Labels "dlock.recipe"}}' "$PG_IMAGE")" == "$h" ]]; then
        log "$PG_IMAGE: present"
        ((CHECK_ONLY)) || pg_operand_tag
        return
    fi
    missing_in_check "${FUNCNAME[0]}" && return
    local ctx
    ctx="$(workdir)"
    cp "$ROOT"/images/postgres/* "$ctx/"
    cp -a "$pg" "$ctx/pg16"
    log "building $PG_IMAGE"
    dbuild --label "dlock.recipe=$h" -t "$PG_IMAGE" "$ctx" || die "building the PostgreSQL image failed"
    pg_operand_tag
}
# CloudNativePG's operand name for the same image: its tag must start with the major version, and the
# full version (16.15) says which build it is.
pg_operand_image() { echo "${PG_IMAGE%:*}:$("$TOOLS/pg16/bin/postgres" --version | awk '{print $3}')"; }
pg_operand_tag() {
    local operand
    operand="$(pg_operand_image)"
    if [[ "$(docker image inspect -f '{{.Id}}' "$operand" 2>/dev/null)" != \
        "$(docker image inspect -f '{{.Id}}' "$PG_IMAGE")" ]]; then
        docker tag "$PG_IMAGE" "$operand"
        log "$operand: tagged"
    fi
}

# CloudNativePG: the PostgreSQL operator the operator's highly available lockdb/paydb run on. The
# release manifest names ghcr.io's image, pulled Always; the kind tier has no registry, so the
# manifest is rewritten for the local image, pulled IfNotPresent (kind load puts it on the node).
# OPERATOR_IMAGE_NAME must name that same image: every instance pod's bootstrap-controller init
# container copies the manager out of it.
CNPG_VERSION="${DLOCK_CNPG_VERSION:-1.27.1}"
CNPG_IMAGE="dlock-local/cloudnative-pg:$CNPG_VERSION"
CNPG_DIR="$TOOLS/cnpg"
CNPG_MANIFEST="$CNPG_DIR/cnpg-$CNPG_VERSION.yaml"
cnpg_src() {
    (cd / && go mod download -json "github.com/cloudnative-pg/cloudnative-pg@v$CNPG_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}
need_cnpg() {
    local src
    if [[ -x "$CNPG_DIR/manager" ]] && stamp_ok cnpg-manager "$CNPG_VERSION"; then
        log "cloudnative-pg manager $CNPG_VERSION: cached"
    else
        missing_in_check cnpg-manager && return
        src="$(cnpg_src)"
        [[ -d "$src/cmd/manager" ]] || die "could not download github.com/cloudnative-pg/cloudnative-pg@v$CNPG_VERSION"
        # Built inside a copy of the module, with its own go.mod and go.sum, rather than by
        # `go install ...@v$CNPG_VERSION`: that looks up the module's deprecation in its version
        # list, which the proxy refuses for this module (403), and fails on it.
        local work
        work="$(workdir)"
        cp -r "$src/." "$work/"
        chmod -R u+w "$work"
        mkdir -p "$CNPG_DIR"
        log "cloudnative-pg manager $CNPG_VERSION: building (about 5 min on a quiet 2-core machine)"
        (cd "$work" && gentle go build -trimpath \
            -ldflags "-s -w -X github.com/cloudnative-pg/cloudnative-pg/pkg/versions.buildVersion=$CNPG_VERSION" \
            -o "$CNPG_DIR/manager.tmp" ./cmd/manager) || die "go build of the cloudnative-pg manager failed"
        mv "$CNPG_DIR/manager.tmp" "$CNPG_DIR/manager"
        write_stamp cnpg-manager "$CNPG_VERSION"
    fi

    local h
    h="$(recipe_hash images/cloudnative-pg)-$CNPG_VERSION"
    if have_image "$CNPG_IMAGE" && [[ "$(docker image inspect -f '{{index .Config.Labels "dlock.recipe"}}' "$CNPG_IMAGE")" == "$h" ]]; then
        log "$CNPG_IMAGE: present"
    else
        missing_in_check cnpg-image && return
        local ctx
        ctx="$(workdir)"
        cp "$ROOT"/images/cloudnative-pg/* "$ctx/"
        cp "$CNPG_DIR/manager" "$ctx/manager"
        log "building $CNPG_IMAGE"
        dbuild --label "dlock.recipe=$h" --build-arg "CNPG_VERSION=$CNPG_VERSION" -t "$CNPG_IMAGE" "$ctx" ||
            die "building the cloudnative-pg image failed"
    fi

    # The manifest is derived on every run (a sed over the release file): it is always the one for
    # the current image name.
    if ((CHECK_ONLY)); then
        [[ -s "$CNPG_MANIFEST" ]] || missing_in_check cnpg-manifest
    else
        src="${src:-$(cnpg_src)}"
        local release="$src/releases/cnpg-$CNPG_VERSION.yaml"
        local upstream="ghcr.io/cloudnative-pg/cloudnative-pg:$CNPG_VERSION"
        [[ -f "$release" ]] || die "$release is missing"
        # Exactly the two image references (the Deployment's image and OPERATOR_IMAGE_NAME) and
        # the one pull policy: a release that grew another would need a look before it is rewritten.
        [[ "$(grep -cF "$upstream" "$release")" == 2 && "$(grep -c 'imagePullPolicy: Always$' "$release")" == 1 ]] ||
            die "$release does not name $upstream twice and pull it Always once; review the rewrite"
        sed -e "s#$upstream#$CNPG_IMAGE#" -e 's#imagePullPolicy: Always$#imagePullPolicy: IfNotPresent#' \
            "$release" >"$CNPG_MANIFEST.tmp"
        mv "$CNPG_MANIFEST.tmp" "$CNPG_MANIFEST"
        log "cloudnative-pg manifest: $CNPG_MANIFEST"
    fi

    if ! have_image "$(pg_operand_image)"; then
        missing_in_check cnpg-operand && return
        die "the operand image $(pg_operand_image) is missing: run the postgres step first"
    fi
}

# NetworkPolicy enforcement: NetworkPolicies are only objects until a network plugin filters packets
# by them. SIG Network's kube-network-policies hands packets to userspace with nftables' `queue`
# statement, which needs the kernel's nft_queue (CONFIG_NFT_QUEUE); kernels built without it, and
# without modules to load it, cannot run it. kube-router's policy controller needs only iptables
# (with the xt_set match) and ipset. Its image is loaded into the cluster by e2e/kind/run.sh and run
# by e2e/kind/kube-router.yaml as a firewall alone: the CNI config and kube-proxy stay as they are.
KUBE_ROUTER_IMAGE="dlock-local/kube-router:$KUBE_ROUTER_VERSION"
need_netpol() {
    aux_one kube-router "$KUBE_ROUTER_VERSION"
    local h
    h="$(recipe_hash images/kube-router)-$KUBE_ROUTER_VERSION"
    if have_image "$KUBE_ROUTER_IMAGE" &&
        [[ "$(docker image inspect -f '{{index .Config.Labels "dlock.recipe"}}' "$KUBE_ROUTER_IMAGE")" == "$h" ]]; then
        log "$KUBE_ROUTER_IMAGE: present"; return
    fi
    missing_in_check "${FUNCNAME[0]}" && return
    local ctx
    ctx="$(workdir)"
    cp "$ROOT"/images/kube-router/* "$ctx/"
    cp "$AUX/kube-router" "$ctx/kube-router"
    log "building $KUBE_ROUTER_IMAGE"
    dbuild --label "dlock.recipe=$h" -t "$KUBE_ROUTER_IMAGE" "$ctx" || die "building the kube-router image failed"
}

need_node() {
    local h
    h="$(recipe_hash images/kind-node images/kind-base)"
    if have_image "$NODE_IMAGE" && [[ "$(docker image inspect -f '{{index .Config.Labels "dlock.recipe"}}' "$NODE_IMAGE")" == "$h" ]]; then
        log "$NODE_IMAGE: present"; return
    fi
    missing_in_check "${FUNCNAME[0]}" && return
    local bin="$K8S_DIR/kubernetes/server/bin" ctx b
    [[ -x "$bin/kube-apiserver" && -x "$bin/kubelet" ]] || die "Kubernetes binaries missing under $bin"
    ctx="$(workdir)"
    # Control-plane images: the binary on the Debian base, as the official images carry it.
    for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
        mkdir -p "$ctx/$b"
        cp "$bin/$b" "$ctx/$b/"
        cp "$ROOT/images/kind-node/$b.Dockerfile" "$ctx/$b/Dockerfile" 2>/dev/null ||
            sed "s/@BIN@/$b/g" "$ROOT/images/kind-node/control-plane.Dockerfile" >"$ctx/$b/Dockerfile"
        log "image registry.k8s.io/$b:$K8S_VERSION"
        dbuild -t "registry.k8s.io/$b:$K8S_VERSION" "$ctx/$b" || die "building the $b image failed"
    done
    # What kubeadm, containerd's sandbox_image and kind's CNI/storage manifests reference.
    local pause etcd coredns kindnetd lpp helper
    etcd="registry.k8s.io/etcd:$ETCD_IMAGE_VERSION-0"
    coredns="registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
    local kindsrc consts
    kindsrc="$(cd / && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    consts="$kindsrc/pkg/build/nodeimage"
    pause="$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$kindsrc/images/base/files/etc/containerd/config.toml")"
    kindnetd="$(sed -n 's/^const kindnetdImage = "\(.*\)"/\1/p' "$consts/const_cni.go")"
    lpp="$(sed -n 's/^const storageProvisionerImage = "\(.*\)"/\1/p' "$consts/const_storage.go")"
    helper="$(sed -n 's/^const storageHelperImage = "\(.*\)"/\1/p' "$consts/const_storage.go")"
    local name img
    for name in pause etcd coredns kindnetd local-path-provisioner local-path-helper; do
        mkdir -p "$ctx/$name"
        cp "$ROOT/images/kind-node/$name/"* "$ctx/$name/"
        case "$name" in
        pause) img="$pause"; cp "$AUX/pause" "$ctx/$name/" ;;
        etcd) img="$etcd"; cp "$AUX/etcd" "$ctx/$name/" ;;
        coredns) img="$coredns"; cp "$AUX/coredns" "$ctx/$name/" ;;
        kindnetd) img="$kindnetd" ;;
        local-path-provisioner) img="$lpp"; cp "$AUX/local-path-provisioner" "$ctx/$name/" ;;
        local-path-helper) img="$helper" ;;
        esac
        log "image $img"
        dbuild -t "$img" "$ctx/$name" || die "building the $name image failed"
    done
    # The layout `kind build node-image` reads (kubernetes-server-linux-amd64.tar.gz). The add-on
    # images ride in kube-proxy.tar: kind imports every image of each archive and pulls none of
    # those it finds there.
    local tree="$ctx/tree/kubernetes"
    mkdir -p "$tree/server/bin"
    echo "$K8S_VERSION" >"$tree/version"
    for b in kubeadm kubelet kubectl; do ln "$bin/$b" "$tree/server/bin/$b" 2>/dev/null || cp "$bin/$b" "$tree/server/bin/$b"; done
    for b in kube-apiserver kube-controller-manager kube-scheduler; do
        save_archive "$tree/server/bin/$b.tar" "registry.k8s.io/$b:$K8S_VERSION"
    done
    save_archive "$tree/server/bin/kube-proxy.tar" "registry.k8s.io/kube-proxy:$K8S_VERSION" \
        "$pause" "$etcd" "$coredns" "$kindnetd" "$lpp" "$helper"
    log "packing kubernetes-server-linux-amd64.tar.gz"
    tar -C "$ctx/tree" -c kubernetes | gentle gzip -1 >"$ctx/kubernetes-server-linux-amd64.tar.gz"
    log "kind build node-image -> $NODE_IMAGE"
    gentle "$BIN/kind" build node-image "$ctx/kubernetes-server-linux-amd64.tar.gz" \
        --base-image "$BASE_IMAGE" --image "$NODE_IMAGE.tmp" >&2 || die "kind build node-image failed"
    # Label the result with the recipe it came from, so an edited recipe is rebuilt.
    printf 'FROM %s\nLABEL dlock.recipe=%s\n' "$NODE_IMAGE.tmp" "$h" | DOCKER_BUILDKIT=0 docker build -q -t "$NODE_IMAGE" - >/dev/null
    docker rmi "$NODE_IMAGE.tmp" >/dev/null
}

CHECK_ONLY=0
MISSING=()
missing_in_check() { # in --check mode: records the step as missing, returns 0 (the caller returns)
    ((CHECK_ONLY)) || return 1
    MISSING+=("${1#need_}")
    return 0
}
if [[ "${1:-}" == "--check" ]]; then CHECK_ONLY=1; shift; fi
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(kind k8s apiserver aux debian base node postgres cnpg netpol)
for s in "${STEPS[@]}"; do
    case "$s" in
    kind) timed kind need_kind ;;
    k8s) timed k8s-binaries need_k8s_bins ;;
    apiserver) timed kube-apiserver need_apiserver ;;
    aux) timed add-on-binaries need_aux_bins ;;
    crictl | pause | etcd | local-path-provisioner | coredns | kube-router) aux_one "$s" "$(aux_version "$s")" ;;
    debian) timed debian-image need_debian ;;
    base) timed kind-base-image need_base ;;
    node) timed kind-node-image need_node ;;
    postgres) timed postgres-image need_postgres ;;
    cnpg) timed cloudnative-pg need_cnpg ;;
    netpol) timed kube-router need_netpol ;;
    *) die "unknown step $s" ;;
    esac
done
if ((CHECK_ONLY && ${#MISSING[@]})); then
    log "not built yet: ${MISSING[*]}"
    exit 1
fi
