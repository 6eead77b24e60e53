#!/usr/bin/env bash
# Installs what building and testing wasmop needs and a fresh machine may lack. Idempotent:
# each step checks first.
set -euo pipefail

need() { command -v "$1" >/dev/null 2>&1; }

if ! need cargo || ! need rustup; then
  echo "setup: cargo and rustup are required (https://rustup.rs)" >&2
  exit 1
fi
if ! need go; then
  echo "setup: Go 1.26 or newer is required to build the local control plane" >&2
  exit 1
fi
installed=$(rustup target list --installed)
grep -qx wasm32-wasip2 <<<"$installed" || rustup target add wasm32-wasip2
components=$(rustup component list --installed)
grep -q '^rustfmt' <<<"$components" || rustup component add rustfmt
grep -q '^clippy' <<<"$components" || rustup component add clippy
# The Go side fetches its modules through the module proxy; a proxy-less GOFLAGS would break it.
go env GOPROXY >/dev/null
# A real registry for the registry tests: Debian's docker-registry, unpacked into the cache
# (no root, no service). Only where none is on PATH.
registry_root=${XDG_CACHE_HOME:-$HOME/.cache}/wasmop/registry
if ! need docker-registry && [ ! -x "$registry_root/usr/bin/docker-registry" ]; then
  echo "setup: fetching Debian's docker-registry into $registry_root"
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download -q docker-registry >/dev/null 2>&1) ||
    { apt-get update -q >/dev/null 2>&1 && (cd "$tmp" && apt-get download -q docker-registry >/dev/null 2>&1); }; then
    mkdir -p "$registry_root"
    dpkg-deb -x "$tmp"/docker-registry_*.deb "$registry_root"
  else
    echo "setup: could not fetch docker-registry (apt-get download docker-registry); the registry tests need it" >&2
    rm -rf "$tmp"
    exit 1
  fi
  rm -rf "$tmp"
fi
