//! `wasmop inspect`: loads a plugin the way the host does (so a broken module fails here the
//! same way) and prints one YAML document: its digest, its size raw and gzipped (plugins ship
//! in ConfigMaps, which hold at most 1 MiB), and its manifest.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde::Serialize;
use wasmop_contract::Manifest;

use crate::cli::InspectArgs;

/// What `inspect` prints, in this order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    digest: &'a str,
    size: usize,
    size_gzip: usize,
    manifest: &'a Manifest,
}

/// Runs `wasmop inspect`.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let (wasm, plugin) = crate::plugin::offline::load_file(&args.plugin)?;
    let report = Report {
        digest: plugin.digest(),
        size: wasm.len(),
        size_gzip: gzip_size(&wasm)?,
        manifest: plugin.manifest(),
    };
    super::print(&serde_yaml::to_string(&report)?)?;
    Ok(())
}

/// Bytes after `gzip -9`.
fn gzip_size(bytes: &[u8]) -> std::io::Result<usize> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?.len())
}

#[cfg(test)]
mod tests {
    #[test]
    fn gzip_shrinks_repetition() {
        let size = super::gzip_size(&[7u8; 10_000]).unwrap();
        assert!(size < 200, "{size}");
    }
}
