#!/usr/bin/env bash
# The local demo: installs what it needs, starts the databases and the services on loopback, and
# shows fencing at work. Extra arguments go to `dlock-dev demo` (try --help).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$DLOCK_ROOT/scripts/prereqs.sh" demo
"$DLOCK_ROOT/scripts/setup.sh"
cd "$DLOCK_ROOT"
exec cargo run --quiet -p dlock-devtools --bin dlock-dev -- demo "$@"
