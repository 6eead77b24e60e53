#!/usr/bin/env bash
# A plugin author's first hour, as docs/writing-plugins.md tells it, run for real: `wasmop new`
# outside this repository (no flags: the SDK comes with the binary), `cargo test`, the wasm build, the CRD
# from the Rust types, `wasmop render` of the sample, `wasmop package`, then on a fresh local
# plane: the CRD, `wasmop rbac`, the ConfigMap, the host, the sample CR, until the host reports
# it Ready and its Deployment's pods are ready. Each step's time is printed.
#
# The scaffold's builds go to target/scaffold (kept between runs, so a second run is warm).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/scaffold-test
rm -rf "$work" && mkdir -p "$work"
timeout_s=${SCAFFOLD_TIMEOUT:-180}

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

last=$SECONDS
step() { printf '\n==> %s\n' "$*"; last=$SECONDS; }
took() { echo "scaffold-test: $1 took $((SECONDS - last)) s"; }
fail() {
  echo "scaffold-test: FAILED: $*" >&2
  tail -n 30 "$work/host.log" "$work/plane.log" 2>/dev/null >&2 || true
  exit 1
}
# wait_for WHAT COMMAND...: until COMMAND succeeds, at most $timeout_s seconds.
wait_for() {
  local what=$1 deadline=$((SECONDS + timeout_s))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "gave up after ${timeout_s}s waiting for $what"
    sleep 0.5
  done
}

cargo build -q -p wasmop -p testenv
wasmop=$root/target/debug/wasmop
testenv=$root/target/debug/testenv
"$testenv" build
kubectl=$("$testenv" which kubectl)
k() { "$kubectl" "$@"; }
export CARGO_TARGET_DIR=$root/target/scaffold
begin=$SECONDS

step "wasmop new web-app, outside the repository"
# mktemp's directory is outside the checkout: the crate must build on its own.
dir=$(mktemp -d)/web-app
# No --sdk-path: the binary writes the SDK it was built with into sdk/.
"$wasmop" new web-app --dir "$dir"
cd "$dir"
took "wasmop new"

step "cargo test"
cargo test -q 2>&1 | grep -E '^test result|FAILED|panicked' || true
cargo test -q >/dev/null 2>&1 || fail "cargo test in the scaffold"
took "cargo test"

step "cargo build --release --target wasm32-wasip2"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
cargo build -q --release --target wasm32-wasip2
wasm=$CARGO_TARGET_DIR/wasm32-wasip2/release/web_app.wasm
echo "$(stat -c %s "$wasm") bytes"
took "the wasm build"

step "the CRD, render, package"
cargo run -q --example crd >crd.yaml
"$wasmop" render --plugin "$wasm" --parent sample.yaml >"$work/render.yaml"
grep -q '^kind: Deployment' "$work/render.yaml" || fail "render printed no Deployment"
grep -q 'fieldManager: wasmop/web-app' "$work/render.yaml" || fail "render printed no field manager"
"$wasmop" package "$wasm" >configmap.yaml
took "crd, render and package"

step "a local plane"
"$testenv" up >"$work/plane.out" 2>"$work/plane.log" &
pids+=($!)
wait_for "the plane's KUBECONFIG" grep -q '^KUBECONFIG=' "$work/plane.out"
export "$(grep '^KUBECONFIG=' "$work/plane.out")"
took "the plane"

step "install and run"
k apply -f crd.yaml
k create namespace wasmop-system --dry-run=client -o yaml | k apply -f -
"$wasmop" rbac "$wasm" | k apply -f -
k apply --server-side -f configmap.yaml
"$wasmop" run >"$work/host.log" 2>&1 &
pids+=($!)
k wait --for condition=Established crd/webapps.example.com --timeout=60s
k apply -f sample.yaml
ready() {
  [ "$(k get webapp webapp-sample -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] &&
    [ "$(k get webapp webapp-sample -o jsonpath='{.status.readyReplicas}')" = 2 ]
}
wait_for "WebApp webapp-sample to be Ready with 2 ready pods" ready
k get webapps,deployments
took "install to Ready"

step "the sample's optional, map and enum fields reach the pods; kubectl scale"
[ "$(k get deploy webapp-sample -o jsonpath='{.spec.template.metadata.labels.team}')" = web ] ||
  fail "spec.podLabels did not reach the pod template"
[ "$(k get deploy webapp-sample -o jsonpath='{.spec.template.spec.containers[0].imagePullPolicy}')" = IfNotPresent ] ||
  fail "spec.pullPolicy did not reach the container"
k scale webapp webapp-sample --replicas 1
scaled() { [ "$(k get deploy webapp-sample -o jsonpath='{.spec.replicas}')" = 1 ]; }
wait_for "kubectl scale to reach the Deployment" scaled
took "fields and scale"

echo
echo "scaffold-test: ok: from wasmop new to a Ready WebApp in $((SECONDS - begin)) s"
