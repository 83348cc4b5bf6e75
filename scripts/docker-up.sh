#!/usr/bin/env bash
# Makes a Docker daemon answer, for the kind tier.
#
#   scripts/docker-up.sh start   if `docker info` answers, does nothing; else installs Debian's
#                                docker.io if dockerd is missing (root + apt only), and starts
#                                dockerd with the capability-dropping runc wrapper
#                                (images/docker/dlock-runc) as its default runtime. Prints
#                                "started" when it started one, "running" when one already answered.
#   scripts/docker-up.sh stop    stops the dockerd this script started (and only that one)
#
# Exit status 3 with the reason on stderr: no Docker daemon can run on this machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${DLOCK_TOOLS_DIR:-/var/tmp/dlock-tools}"
STATE="$TOOLS/docker"
PIDFILE="$STATE/dockerd.pid"

log() { printf '[docker-up] %s\n' "$*" >&2; }
cannot() { log "cannot start Docker: $*"; exit 3; }

answers() { timeout 20 docker info >/dev/null 2>&1; }

start() {
    if command -v docker >/dev/null && answers; then echo running; return; fi
    if ! command -v dockerd >/dev/null || ! command -v runc >/dev/null || ! command -v jq >/dev/null; then
        [[ $(id -u) -eq 0 ]] || cannot "dockerd is not installed and this user is not root (apt-get install docker.io jq)"
        command -v apt-get >/dev/null || cannot "dockerd is not installed and there is no apt-get"
        log "installing Debian's docker.io and jq"
        { DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io jq >&2 ||
            { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io jq >&2; }; } ||
            cannot "apt-get install docker.io failed"
    fi
    [[ $(id -u) -eq 0 ]] || cannot "no Docker daemon answers and starting dockerd needs root"
    mkdir -p "$STATE" "$TOOLS/bin"
    install -m 0755 "$ROOT/images/docker/dlock-runc" "$TOOLS/bin/dlock-runc"
    cat >"$STATE/daemon.json" <<JSON
{
  "runtimes": { "dlock-runc": { "path": "$TOOLS/bin/dlock-runc" } },
  "default-runtime": "dlock-runc",
  "storage-driver": "overlay2",
  "log-driver": "json-file",
  "log-opts": { "max-size": "10m" }
}
JSON
    log "starting dockerd (log: $STATE/dockerd.log)"
    # 9>&-: the kind tier holds its run lock on fd 9 (e2e/kind/run.sh); a dockerd that inherited it
    # would hold the lock for as long as it runs, and the next run would wait for it in vain.
    setsid nohup dockerd --config-file "$STATE/daemon.json" --pidfile "$STATE/dockerd.run.pid" \
        >"$STATE/dockerd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$PIDFILE"
    local deadline=$((SECONDS + 60))
    until answers; do
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            tail -n 20 "$STATE/dockerd.log" >&2
            rm -f "$PIDFILE"
            cannot "dockerd exited (see above)"
        fi
        ((SECONDS < deadline)) || { stop >/dev/null; cannot "dockerd did not answer within 60s"; }
        sleep 1
    done
    echo started
}

stop() {
    [[ -f "$PIDFILE" ]] || { log "no dockerd started by this script"; return 0; }
    local pid
    pid="$(cat "$PIDFILE")"
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping dockerd (pid $pid)"
        kill -TERM "$pid"
        local deadline=$((SECONDS + 60))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$PIDFILE"
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
*) log "usage: $0 start|stop"; exit 2 ;;
esac
