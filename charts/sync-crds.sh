#!/usr/bin/env bash
# Keeps the chart's CRDs (charts/dlock-operator/crds/) identical to the generated ones (crds/, written
# by `cargo run -p dlock-operator --bin crdgen`). Helm installs CRDs only from the chart's crds/
# folder, so the chart carries a copy; this script is the only thing that writes it.
#
#   charts/sync-crds.sh          copy crds/*.yaml into the chart (and drop stale ones)
#   charts/sync-crds.sh --check  exit 1 with a diff summary if the copy is stale (CI; the e2e
#                                test chart_crds_match_generated checks the same)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/crds"
dst="$root/charts/dlock-operator/crds"

shopt -s nullglob
generated=("$src"/*.yaml)
((${#generated[@]})) || { echo "no CRDs in $src: run cargo run -p dlock-operator --bin crdgen" >&2; exit 1; }

if [[ "${1:-}" == "--check" ]]; then
    stale=0
    for f in "${generated[@]}"; do
        cmp -s "$f" "$dst/$(basename "$f")" || { echo "stale: charts/dlock-operator/crds/$(basename "$f")" >&2; stale=1; }
    done
    for f in "$dst"/*.yaml; do
        [[ -e "$src/$(basename "$f")" ]] || { echo "extra: charts/dlock-operator/crds/$(basename "$f")" >&2; stale=1; }
    done
    ((stale == 0)) || { echo "run charts/sync-crds.sh" >&2; exit 1; }
    echo "chart CRDs match crds/"
    exit 0
fi

mkdir -p "$dst"
for f in "$dst"/*.yaml; do [[ -e "$src/$(basename "$f")" ]] || rm -v "$f"; done
for f in "${generated[@]}"; do cp -v "$f" "$dst/"; done
