#!/usr/bin/env bash
# A plugin author's first hour, as docs/writing-plugins.md tells it, run for real: `wasmop new`
# outside this repository (no flags: the SDK comes with the binary), `cargo test`, the wasm
# build, the CRD from the Rust types, `wasmop render` of the sample, `wasmop package`, then on
# `make demo`'s plane, beside its host: the CRD, `wasmop rbac`, the ConfigMap, the sample CR,
# until it is Ready with its pods; its fields and `kubectl scale`; `kubectl get wasmopplugins`;
# an upgrade and the plugin's removal as the README says; then the Starlark path on the same
# plane (`wasmop new --lang starlark`, `wasmop test`, install, a new version) with no build.
# Each step's time is printed.
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
# The new crate builds as its author's would: without the clippy wrapper `make test` may set
# for this repository's own builds (tests/demo.sh, run below, keeps it and so reuses them).
cargo() { env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo "$@"; }
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

step "make demo's plane (the guide's step 7 runs on it, beside the demo's host)"
# The demo builds into the workspace's target, not the scaffold's.
# SIGINT as a terminal leaves it (a background job of a script starts with it ignored), so
# that the Ctrl-C at the end is the user's.
env -u CARGO_TARGET_DIR --default-signal=INT DEMO_TIMEOUT=$timeout_s "$root/tests/demo.sh" \
  >"$work/demo.log" 2>&1 </dev/null &
demo=$!
pids+=($demo)
wait_for "make demo to be ready (log: $work/demo.log)" grep -q '==> ready' "$work/demo.log"
export "$(sed -n 's/^export \(KUBECONFIG=.*\)/\1/p' "$work/demo.log")"
took "the demo's plane"

step "install, as the guide says (no wasmop run: the demo's host loads it)"
k apply -f crd.yaml
k create namespace wasmop-system --dry-run=client -o yaml | k apply -f -
"$wasmop" rbac "$wasm" | k apply -f -
k apply --server-side -f configmap.yaml
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

step "the plugin's state, one kubectl away"
shows() {
  [ "$(k -n wasmop-system get wasmopplugin web-app -o jsonpath='{.status.state} {.status.version}')" = "Running web-app $1" ]
}
wait_for "kubectl get wasmopplugins to show web-app 0.1.0 running" shows 0.1.0
k -n wasmop-system get wasmopplugins

step "upgrade, as the README says: a new build, packaged and applied"
sed -i 's/^version = "0.1.0"/version = "0.2.0"/' Cargo.toml
cargo build -q --release --target wasm32-wasip2
"$wasmop" package "$wasm" | k apply --server-side -f -
wait_for "kubectl get wasmopplugins to show web-app 0.2.0 running" shows 0.2.0
[ "$(k -n wasmop-system get wasmopplugin web-app -o jsonpath='{.status.reason}')" = Swapped ] ||
  fail "the upgrade is not shown as Swapped"
k -n wasmop-system get wasmopplugins
took "upgrade"

step "remove the plugin, as the README says: nothing of it is left"
k -n wasmop-system delete configmap web-app
k delete serviceaccount,role,rolebinding,clusterrole,clusterrolebinding -A -l wasmop.io/rbac-for=web-app
left=$(k get serviceaccount,role,rolebinding,clusterrole,clusterrolebinding -A -l wasmop.io/rbac-for=web-app -o name)
[ -z "$left" ] || fail "left behind: $left"
gone() { ! k -n wasmop-system get wasmopplugin web-app; }
wait_for "WasmopPlugin web-app to go with its ConfigMap" gone
# Its parent and children stay theirs; Memcached, the demo's plugin, still runs.
k get deploy webapp-sample >/dev/null || fail "removing the plugin took its parent's children"
[ "$(k -n wasmop-system get wasmopplugin memcached -o jsonpath='{.status.state}')" = Running ] ||
  fail "the demo's plugin is not running"
took "removal"

step "the Starlark path: wasmop new --lang starlark, wasmop test, install, a new version"
# Only wasmop and kubectl: no build.
star=$(mktemp -d)/web-star
"$wasmop" new web-star --lang starlark --dir "$star"
cd "$star"
"$wasmop" test || fail "wasmop test in the Starlark scaffold"
"$wasmop" render --plugin plugin.star --parent sample.yaml >"$work/render-star.yaml"
grep -q '^kind: Deployment' "$work/render-star.yaml" || fail "render of the script printed no Deployment"
k apply -f crd.yaml
"$wasmop" rbac plugin.star | k apply -f -
"$wasmop" package plugin.star | k apply --server-side -f -
k wait --for condition=Established crd/webstars.example.com --timeout=60s
k apply -f sample.yaml
star_ready() {
  [ "$(k get webstar webstar-sample -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] &&
    [ "$(k get webstar webstar-sample -o jsonpath='{.status.readyReplicas}')" = 2 ]
}
wait_for "WebStar webstar-sample to be Ready with 2 ready pods" star_ready
sed -i 's/"version": "0.1.0"/"version": "0.2.0"/' plugin.star
"$wasmop" test >/dev/null || fail "wasmop test after the edit"
"$wasmop" package plugin.star | k apply --server-side -f -
star_shows() {
  [ "$(k -n wasmop-system get wasmopplugin web-star -o jsonpath='{.status.state} {.status.version}')" = "Running web-star 0.2.0" ]
}
wait_for "kubectl get wasmopplugins to show web-star 0.2.0 running" star_shows
k -n wasmop-system get wasmopplugins
took "the Starlark path"

step "stop the demo"
kill -INT "$demo"
wait "$demo" || fail "make demo did not end cleanly on Ctrl-C"
grep -q '^demo: stopped' "$work/demo.log" || fail "make demo did not say it stopped"
echo
echo "scaffold-test: ok: from wasmop new to a Ready WebApp in $((SECONDS - begin)) s"
