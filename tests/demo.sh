#!/usr/bin/env bash
# The main job, on one machine: a local control plane, the wasmop host, the Memcached plugin
# loaded from a ConfigMap, a Memcached CR reconciled, then a hot swap to the plugin's second
# build. It leaves everything running for kubectl until Ctrl-C or SIGTERM, which stop it at
# once.
#
#   tests/demo.sh                    # stays up until Ctrl-C
#   tests/demo.sh --exit-when-ready  # stops by itself after "ready" (what `make test` runs)
#
# Every wait is bounded (DEMO_TIMEOUT seconds, default 120): on timeout the script says what
# it waited for, shows the tail of the host's log, and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/demo
mkdir -p "$work"
exit_when_ready=false
case "${1:-}" in
  --exit-when-ready) exit_when_ready=true ;;
  "") ;;
  *) echo "usage: $0 [--exit-when-ready]" >&2; exit 2 ;;
esac
timeout_s=${DEMO_TIMEOUT:-120}

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
pids=()    # what runs until the end: the plane, the host
current=   # a long step in progress (a build)
stopped=false
cleanup() {
  $stopped && return
  stopped=true
  [ -n "$current" ] && kill -TERM "$current" 2>/dev/null
  [ ${#pids[@]} -eq 0 ] && return
  step "stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
# A signal ends the script at once: stop what it started. Ctrl-C is how a user ends the demo,
# so it exits 0 (make would call 130 an error); SIGTERM exits with its code.
trap 'cleanup; echo "demo: stopped; the host and the control plane are gone"; exit 0' INT
trap 'cleanup; exit 143' TERM
trap cleanup EXIT

# run COMMAND...: a long step, run so that a signal interrupts the script's wait for it at
# once (bash runs a trap only after the foreground command ends).
run() {
  "$@" &
  current=$!
  wait "$current"
  current=
}

# wait_until WHAT COMMAND...: runs COMMAND until it succeeds, for at most $timeout_s seconds.
wait_until() {
  local what=$1 deadline=$((SECONDS + timeout_s))
  shift
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "demo: gave up after ${timeout_s}s waiting for $what" >&2
      if [ -f "$work/host.log" ]; then
        echo "--- last lines of $work/host.log ---" >&2
        tail -n 30 "$work/host.log" >&2
      fi
      exit 1
    fi
    # A component that died will not bring what we wait for.
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || {
        echo "demo: a process it started (pid $pid) exited while waiting for $what" >&2
        tail -n 30 "$work/plane.log" "$work/host.log" 2>/dev/null >&2
        exit 1
      }
    done
    sleep 0.2
  done
}

# Measured on two cores: about 10 minutes with the control plane's binaries cached
# (~/.cache/wasmop/testenv), about 35 from nothing; seconds once everything is built.
step "building wasmop and the control plane (the first time: 10 to 35 minutes, see README)"
run cargo build -p wasmop -p testenv
run "$root/target/debug/testenv" build
kubectl=$("$root/target/debug/testenv" which kubectl)

step "building the Memcached plugin (two builds)"
run cargo build --release --target wasm32-wasip2 -p memcached -p memcached-v2
wasm=$root/target/wasm32-wasip2/release

step "starting the control plane"
rm -f "$work/plane.out"
"$root/target/debug/testenv" up >"$work/plane.out" 2>"$work/plane.log" &
pids+=($!)
wait_until "the control plane to print its KUBECONFIG (log: $work/plane.log)" \
  grep -q '^KUBECONFIG=' "$work/plane.out"
export "$(grep '^KUBECONFIG=' "$work/plane.out")"
k() { "$kubectl" "$@"; }

step "installing the CRD, the plugin's identity and the plugin ConfigMap"
k apply -f deploy/crds/ -f deploy/host/wasmopplugins.yaml
k create namespace wasmop-system
# The plugin writes as its own ServiceAccount, wasmop-plugin-memcached, with only these rights.
"$root/target/debug/wasmop" rbac "$wasm/memcached.wasm" | k apply -f -
k -n wasmop-system create configmap memcached --from-file=memcached.wasm="$wasm/memcached.wasm"
k -n wasmop-system label configmap memcached wasmop.io/plugin=

step "starting the host (log: target/demo/host.log)"
"$root/target/debug/wasmop" run >"$work/host.log" 2>&1 &
pids+=($!)

step "creating a Memcached of size 3"
k apply -f deploy/samples/memcached.yaml
start=$(date +%s%N)
three_nodes() {
  [ "$(k get memcached memcached-sample -o jsonpath='{.status.nodes}' | tr -cd ',' | wc -c)" = 2 ]
}
wait_until "status.nodes of memcached-sample to list 3 pods" three_nodes
echo "status.nodes filled $(( ($(date +%s%N) - start) / 1000000 )) ms after the CR was created"
k get memcached,deploy,pods -o wide

step "hot swap: the second build adds a headless Service, no restart"
# Its rights first: the plugin's identity may now write Services too.
"$root/target/debug/wasmop" rbac "$wasm/memcached_v2.wasm" | k apply -f -
k -n wasmop-system create configmap memcached --from-file=memcached.wasm="$wasm/memcached_v2.wasm" \
  --dry-run=client -o yaml | k label --local -f - wasmop.io/plugin= -o yaml | k apply --server-side --force-conflicts -f -
wait_until "the second build to create Service memcached-sample" k get service memcached-sample
k get memcached,services
# The plugin's history, as `kubectl describe configmap` shows it.
swapped() { k -n wasmop-system describe configmap memcached | grep Swapped | grep -q 0.2.0; }
wait_until "a Swapped Event naming 0.2.0 on ConfigMap wasmop-system/memcached" swapped
k -n wasmop-system describe configmap memcached | sed -n '/^Events:/,$p'

step "ready: keep playing, Ctrl-C stops everything"
echo "The pods are KWOK's: scheduled and Running, but no container runs, so kubectl logs has"
echo "nothing to show (docs/operating.md says what the local plane fakes)."
echo "export $(grep '^KUBECONFIG=' "$work/plane.out")"
echo "kubectl: $kubectl"
$exit_when_ready && exit 0
wait "${pids[0]}"
