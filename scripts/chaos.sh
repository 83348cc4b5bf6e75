#!/usr/bin/env bash
# The full fault campaign (docs/reliability.md): on each backend, one long run with every nemesis,
# then one run per nemesis alone; each prints its verdict and a report row. Not a test: its results
# are recorded in docs/reliability.md. Exit 0 only when every run's checks held.
#
# On PostgreSQL "every nemesis" includes failover (lockdb a primary with a synchronous standby), and
# failover runs alone twice: with synchronous replication, and with asynchronous replication and the
# standby held behind (lock-server's sequence jump is what keeps that one clean).
#
#   scripts/chaos.sh                      10,000 payouts per backend with all nemeses, then each alone
#   DLOCK_CHAOS_PAYOUTS=2000 scripts/chaos.sh   a smaller full campaign
#   DLOCK_CHAOS_SEED=42 scripts/chaos.sh        replay: the same seeds, the same schedules
#   scripts/chaos.sh --plaintext                every run in plain HTTP (warned; the rows say so)
#
# Every run serves HTTPS on every hop (a CA made for the run) unless --plaintext is given, the
# only argument this script takes; it is passed to every `dlock-dev chaos` run.
#
# Env: DLOCK_CHAOS_PAYOUTS (default 10000), DLOCK_CHAOS_SECONDS (default payouts/20),
#      DLOCK_CHAOS_SINGLE_PAYOUTS (per single-nemesis run, default 1500), DLOCK_CHAOS_SEED (default:
#      fresh), DLOCK_CHAOS_BACKENDS (default "postgres etcd"), DLOCK_CHAOS_ONLY (run only the runs
#      whose label contains it, e.g. "postgres-failover"; the seeds stay those of the full campaign),
#      DLOCK_BIN_DIR (the binaries to run; default the build), DLOCK_CHAOS_DIR (default a fresh
#      folder under /var/tmp, kept: every run's history, final state, schedule and logs).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$DLOCK_ROOT"

transport=()
for arg in "$@"; do
  case "$arg" in
    --plaintext) transport=(--plaintext) ;;
    *) die "unknown argument $arg (scripts/chaos.sh takes only --plaintext; the rest is DLOCK_CHAOS_* in the environment)" ;;
  esac
done
if [ "${#transport[@]}" -gt 0 ]; then
  printf 'WARNING: --plaintext: every run of this campaign serves plain HTTP (credentials and grants in cleartext on loopback); the services are deployed with HTTPS\n' >&2
fi
[ -n "${DLOCK_BIN_DIR:-}" ] || "$DLOCK_ROOT/scripts/setup.sh"

payouts="${DLOCK_CHAOS_PAYOUTS:-10000}"
# About 20 payouts a second: what three executors drain on two cores under the nemeses.
seconds="${DLOCK_CHAOS_SECONDS:-$(( payouts / 20 > 20 ? payouts / 20 : 20 ))}"
single="${DLOCK_CHAOS_SINGLE_PAYOUTS:-1500}"
single_seconds=$(( single / 20 > 20 ? single / 20 : 20 ))
seed="${DLOCK_CHAOS_SEED:-$(( (RANDOM << 15) | RANDOM ))}"
backends="${DLOCK_CHAOS_BACKENDS:-postgres etcd}"
out="${DLOCK_CHAOS_DIR:-/var/tmp/dlock-chaos-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
# DLOCK_BIN_DIR: run binaries copied aside, so that a build during a long campaign cannot swap
# them under the processes it restarts.
dlock_dev="${DLOCK_BIN_DIR:-$CARGO_TARGET_DIR/debug}/dlock-dev"
rows="$out/rows.md"
: > "$rows"
failed=0

one() { # label, args...
  local label="$1"; shift
  case "$label" in *"${DLOCK_CHAOS_ONLY:-}"*) ;; *) return 0 ;; esac
  say "chaos: $label ($*)"
  if "$dlock_dev" --run-dir "$out/$label" chaos "$@" ${transport[@]+"${transport[@]}"} | tee "$out/$label.txt"; then :; else failed=1; fi
  grep '^report row: ' "$out/$label.txt" | sed 's/^report row: //' >> "$rows" || true
}

n=0
for backend in $backends; do
  one "$backend-all" --backend "$backend" --payouts "$payouts" --seconds "$seconds" --seed "$((seed + n))"
  n=$((n + 1))
  for nemesis in pause kill database partition clock rail; do
    one "$backend-$nemesis" --backend "$backend" --nemesis "$nemesis" --payouts "$single" \
      --seconds "$single_seconds" --seed "$((seed + n))"
    n=$((n + 1))
  done
  if [ "$backend" = postgres ]; then
    # Seeds of their own (seed+100, seed+101), so that every other run keeps the seed it had
    # before failover existed.
    f=100
    for replication in sync async; do
      one "$backend-failover-$replication" --backend "$backend" --nemesis failover \
        --replication "$replication" --payouts "$single" --seconds "$single_seconds" --seed "$((seed + f))"
      f=$((f + 1))
    done
  fi
done
say "chaos: rows for docs/reliability.md ($rows)"
cat "$rows"
[ "$failed" = 0 ] || die "a campaign run failed its checks: see $out"
