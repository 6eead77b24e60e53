#!/usr/bin/env bash
# `make test`: every phase in order, each timed, then a table of how long each took. The test
# binaries of `cargo test --workspace` are timed one by one from the runner's own output.
set -euo pipefail
cd "$(dirname "$0")/.."

phases=()
phase() {
  local name=$1 start=$SECONDS
  shift
  printf '\n==> %s\n' "$name"
  "$@"
  phases+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}

# Passes cargo test's output through and notes, per test binary (its `Running …` or
# `Doc-tests …` line), how long it ran: the time to the next such line.
binaries=$(mktemp)
trap 'rm -f "$binaries"' EXIT
timed_tests() {
  local last=$SECONDS current=build
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [[ $line =~ ^[[:space:]]+Running[[:space:]].*\(([^\)]+)\)$ ]]; then
      printf '  %-26s %5d s\n' "$current" $((SECONDS - last)) >>"$binaries"
      current=$(basename "${BASH_REMATCH[1]}" | sed 's/-[0-9a-f]\{16\}$//')
      last=$SECONDS
    elif [[ $line =~ ^[[:space:]]+Doc-tests[[:space:]]+(.+)$ ]]; then
      printf '  %-26s %5d s\n' "$current" $((SECONDS - last)) >>"$binaries"
      current="doc-tests ${BASH_REMATCH[1]}"
      last=$SECONDS
    fi
  done
  printf '  %-26s %5d s\n' "$current" $((SECONDS - last)) >>"$binaries"
}
workspace_tests() {
  cargo test --workspace 2>&1 | timed_tests
  return "${PIPESTATUS[0]}"
}

total=$SECONDS
phase setup tests/setup.sh
phase plane cargo run -q -p testenv -- build
phase "lint: fmt" cargo fmt --all -- --check
phase "lint: clippy" cargo clippy --workspace --all-targets -- -D warnings
# The SDK and the contract it needs package and build on their own, as crates.io users get them.
phase "lint: package" cargo package -q -p wasmop-contract -p wasmop-guest --allow-dirty
phase "cargo test --workspace" workspace_tests
phase demo tests/demo-test.sh
phase scaffold tests/scaffold-test.sh
phase "bench --quick" cargo run -p bench -- --quick

printf '\n==> phases\n'
printf '%s\n' "${phases[@]}"
printf 'cargo test --workspace, by binary (build, then each binary as it ran):\n'
cat "$binaries"
printf '%-28s %5d s\n' total $((SECONDS - total))
