# The two entry points of the README, plus the steps they are made of.
.PHONY: demo test setup plane lint unit demo-test scaffold-test install

# The main job: a local control plane, the host, the Memcached plugin from a ConfigMap, a CR
# reconciled, then a hot swap. Ctrl-C stops everything.
demo: setup
	tests/demo.sh

# Every test: lints, unit tests, the sandbox suite and the end-to-end suite on a real
# control plane, the demo as a user runs it, a plugin author's first hour (docs/writing-plugins.md)
# on its own plane, then the benchmark runner in its quick mode (20 objects) so it keeps working.
# tests/test-all.sh runs them in that order and prints how long each phase and test binary took.
test:
	tests/test-all.sh

# The README's first command, run to "ready" and stopped with Ctrl-C and SIGTERM; nothing may
# be left running (after `cargo test`, whose builds it reuses).
demo-test: setup plane
	tests/demo-test.sh

# `wasmop new` outside the repository, through build, render and package, to a Ready CR on a
# fresh local plane: the commands of docs/writing-plugins.md.
scaffold-test: setup plane
	tests/scaffold-test.sh

setup:
	tests/setup.sh

# Builds (or finds cached) control-plane binaries, with progress, before any test needs them.
plane:
	cargo run -q -p testenv -- build

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	# The SDK and the contract it needs package and build on their own, as crates.io users get them.
	cargo package -q -p wasmop-contract -p wasmop-guest --allow-dirty

# Builds the Memcached plugin into deploy/plugins/, where `kubectl apply --server-side -k deploy/`
# takes it from (kustomize reads files inside its own directory only).
.PHONY: deploy-plugin
deploy-plugin:
	rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	cargo build --release --target wasm32-wasip2 -p memcached
	cp target/wasm32-wasip2/release/memcached.wasm deploy/plugins/memcached.wasm

# Puts `wasmop` on PATH (~/.cargo/bin), built from this checkout.
install:
	cargo install --locked --path host
