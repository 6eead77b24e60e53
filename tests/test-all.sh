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
# A build from scratch (CI's) gains nothing from incremental caches, only the time to write them.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
# Clippy rides on the test build: clippy-driver wraps rustc for this workspace's crates, which
# then compile once, linted with `-D warnings` (what `make lint` checks), instead of a check pass
# and a build pass over every dependency. Later phases keep the wrapper, so cargo reuses these
# builds; nested builds (guests, the interpreter) remove it.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(rustc --print sysroot)/bin/clippy-driver
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
phase "build + clippy" cargo test --workspace --all-targets --no-run
# The SDK and the contract it needs package and build on their own, as crates.io users get them.
phase "lint: package" cargo package -q -p wasmop-contract -p wasmop-guest --allow-dirty
phase "cargo test --workspace" workspace_tests

# The demo, the scaffold and the quick benchmark each start planes of their own and mostly
# wait on them: the benchmark runs beside the other two, each into its own log, shown whole as
# each ends (its figures only show that it runs). The demo and the scaffold run one after the
# other: both run tests/demo.sh, whose host serves the fixed ports 8080 and 8081 and whose work
# directory is target/demo, so side by side one demo's host could not bind or lost its log.
demo() { tests/demo-test.sh; }
scaffold() { tests/scaffold-test.sh; }
demo_then_scaffold() {
  local begin=$SECONDS
  demo || { echo "FAILED: demo" >&2; return 1; }
  echo "demo took $((SECONDS - begin)) s"
  scaffold
}
bench_quick() { cargo run -p bench -- --quick; }
side_by_side() {
  local logs start=$SECONDS failed=() name rc
  logs=$(mktemp -d)
  declare -A took=() pid_of=()
  printf '\n==> side by side: %s\n' "$*"
  for name in "$@"; do
    (
      begin=$SECONDS
      if "$name" >"$logs/$name" 2>&1; then rc=0; else rc=$?; fi
      echo "$rc $((SECONDS - begin))" >"$logs/$name.rc"
    ) &
    pid_of[$!]=$name
  done
  for _ in "$@"; do
    wait -n -p done_pid || true
    name=${pid_of[$done_pid]}
    read -r rc took[$name] <"$logs/$name.rc"
    printf '\n==> %s (side by side, %d s)\n' "$name" "${took[$name]}"
    cat "$logs/$name"
    phases+=("$(printf '%-28s %5d s' "$name (side by side)" "${took[$name]}")")
    [ "$rc" = 0 ] || failed+=("$name (exit $rc)")
  done
  rm -rf "$logs"
  phases+=("$(printf '%-28s %5d s' "  side by side, wall" $((SECONDS - start)))")
  if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    return 1
  fi
}
side_by_side demo_then_scaffold bench_quick

printf '\n==> phases\n'
printf '%s\n' "${phases[@]}"
printf 'cargo test --workspace, by binary (build, then each binary as it ran):\n'
cat "$binaries"
printf '%-28s %5d s\n' total $((SECONDS - total))
