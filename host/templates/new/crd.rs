//! Prints the CRD written from the plugin's types: `cargo run --example crd > crd.yaml`.

fn main() {
    let yaml = serde_yaml::to_string(&__CRATE__::crd().to_json()).expect("a CRD is YAML");
    print!("{yaml}");
}
