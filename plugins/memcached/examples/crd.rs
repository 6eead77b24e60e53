//! Writes `deploy/crds/memcached.yaml` from the plugin's Rust types:
//! `cargo run -p memcached --example crd > deploy/crds/memcached.yaml`.

fn main() {
    let yaml = serde_yaml::to_string(&memcached::crd().to_json()).expect("a CRD is YAML");
    print!("{HEADER}{yaml}");
}

const HEADER: &str = "\
# The Memcached kind reconciled by the `memcached` plugin (plugins/memcached), written from its
# Rust types: cargo run -p memcached --example crd > deploy/crds/memcached.yaml
";
