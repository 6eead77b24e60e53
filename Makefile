# The two entry points of the README, plus the steps they are made of.
.PHONY: demo test setup plane lint unit

# The main job: a local control plane, the host, the Memcached plugin from a ConfigMap, a CR
# reconciled, then a hot swap. Ctrl-C stops everything.
demo: setup
	tests/demo.sh

# Every test: lints, unit tests, the sandbox suite and the end-to-end suite on a real
# control plane.
test: setup plane lint
	cargo test --workspace

setup:
	tests/setup.sh

# Builds (or finds cached) control-plane binaries, with progress, before any test needs them.
plane:
	cargo run -q -p testenv -- build

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
