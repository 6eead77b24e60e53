#!/usr/bin/env bash
# The main job, on one machine: a local control plane, the wasmop host, the Memcached plugin
# loaded from a ConfigMap, a Memcached CR reconciled, then a hot swap to the plugin's second
# build. It leaves everything running for kubectl until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/demo
mkdir -p "$work"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
pids=()
cleanup() {
  trap - EXIT INT TERM
  step "stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

step "building the control plane (about 10 minutes the first time, then cached)"
cargo run -q -p testenv -- build
kubectl=$(cargo run -q -p testenv -- which kubectl)

step "building wasmop and the Memcached plugin (two builds)"
cargo build -q -p wasmop
cargo build -q --release --target wasm32-wasip2 -p memcached -p memcached-v2
wasm=$root/target/wasm32-wasip2/release

step "starting the control plane"
cargo run -q -p testenv -- up >"$work/plane.out" 2>"$work/plane.log" &
pids+=($!)
for _ in $(seq 1 240); do
  grep -q '^KUBECONFIG=' "$work/plane.out" 2>/dev/null && break
  kill -0 "${pids[0]}" 2>/dev/null || { tail -30 "$work/plane.log"; exit 1; }
  sleep 0.5
done
export "$(grep '^KUBECONFIG=' "$work/plane.out")"
k() { "$kubectl" "$@"; }

step "installing the CRD and the plugin ConfigMap"
k apply -f deploy/crds/
k create namespace wasmop-system
k -n wasmop-system create configmap memcached --from-file=memcached.wasm="$wasm/memcached.wasm"
k -n wasmop-system label configmap memcached wasmop.io/plugin=

step "starting the host (log: target/demo/host.log)"
"$root/target/debug/wasmop" run >"$work/host.log" 2>&1 &
pids+=($!)

step "creating a Memcached of size 3"
k apply -f deploy/samples/memcached.yaml
start=$(date +%s%N)
until [ "$(k get memcached memcached-sample -o jsonpath='{.status.nodes}' | tr -cd ',' | wc -c)" = 2 ]; do sleep 0.2; done
echo "status.nodes filled $(( ($(date +%s%N) - start) / 1000000 )) ms after the CR was created"
k get memcached,deploy,pods -o wide

step "hot swap: the second build adds a headless Service, no restart"
k -n wasmop-system create configmap memcached --from-file=memcached.wasm="$wasm/memcached_v2.wasm" \
  --dry-run=client -o yaml | k label --local -f - wasmop.io/plugin= -o yaml | k apply --server-side --force-conflicts -f -
until k get service memcached-sample >/dev/null 2>&1; do sleep 0.2; done
k get memcached,services
# The plugin's history, as `kubectl describe configmap` shows it.
until k -n wasmop-system get events --field-selector involvedObject.name=memcached | grep -q 0.2.0; do sleep 0.2; done
k -n wasmop-system get events --field-selector involvedObject.name=memcached

step "ready: keep playing, Ctrl-C stops everything"
echo "export $(grep '^KUBECONFIG=' "$work/plane.out")"
echo "kubectl: $kubectl"
wait "${pids[0]}"
