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
