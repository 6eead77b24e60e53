//! Writes `wit/plugin.wit`: the real contract (`guest-sdk/wit/plugin.wit`) with its package
//! version changed to 0.1.0, the one before, so this guest is the real world at the wrong version and never
//! drifts from it in anything else. (`wit_bindgen::generate!` takes only a literal path, hence
//! a generated file inside the crate; it is git-ignored.)

use std::path::Path;

fn main() {
    let real = Path::new("../../../guest-sdk/wit/plugin.wit");
    println!("cargo:rerun-if-changed={}", real.display());
    let text = std::fs::read_to_string(real).expect("reading guest-sdk/wit/plugin.wit");
    assert!(
        text.contains("package wasmop:plugin@0.2.0;"),
        "the real WIT is no longer at 0.2.0: update the wrong-version guest"
    );
    let wrong = text.replace(
        "package wasmop:plugin@0.2.0;",
        "package wasmop:plugin@0.1.0;",
    );
    std::fs::create_dir_all("wit").expect("creating wit/");
    let out = Path::new("wit/plugin.wit");
    if std::fs::read_to_string(out).ok().as_deref() != Some(wrong.as_str()) {
        std::fs::write(out, wrong).expect("writing wit/plugin.wit");
    }
}
