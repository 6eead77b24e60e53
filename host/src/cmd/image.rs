//! `wasmop image`: the host's own container image, built without a container engine and
//! pushed to a registry. One layer holds the binary at `/wasmop`, the shared libraries it
//! loads (none for a static musl build; for a glibc build, what `ldd` names, at the same
//! paths), and an empty `/tmp` and `/cache`; the config runs `/wasmop run` as 65532:65532,
//! the user `deploy/host/deployment.yaml` asks for. The same binary always makes the same
//! image: every time in the layer is zero and its entries are sorted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bytes::Bytes;
use serde_json::json;

use crate::cli::ImageArgs;
use crate::plugin::oci::{Digest, IMAGE_CONFIG_MEDIA_TYPE, Limits, OciClient};

/// Media type of the layer.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The user and group the image runs as: distroless's `nonroot`.
pub const USER: &str = "65532:65532";

/// Runs `wasmop image`.
pub fn run(args: ImageArgs) -> anyhow::Result<()> {
    let reference = super::push::target(&args.reference)?;
    let binary = match args.binary {
        Some(path) => path,
        None => std::env::current_exe().context("finding this binary")?,
    };
    let (config, layer) = build(&binary)?;
    let credentials = super::push::credentials(args.docker_config.as_deref(), &reference)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let size = layer.len();
    let digest = runtime.block_on(async {
        let limits = Limits {
            timeout: std::time::Duration::from_secs(300),
            ..Limits::default()
        };
        let registry = OciClient::new(&reference, credentials, limits)?;
        registry
            .push_image(
                &reference,
                IMAGE_CONFIG_MEDIA_TYPE,
                config,
                &[(LAYER_MEDIA_TYPE, Bytes::from(layer))],
            )
            .await
    })?;
    eprintln!("pushed {} ({size} bytes compressed)", binary.display());
    super::print(&format!("{}\n", reference.pinned(digest)))?;
    Ok(())
}

/// The image config and the gzipped layer for `binary`.
pub fn build(binary: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut files = BTreeMap::new();
    files.insert(PathBuf::from("wasmop"), binary.to_path_buf());
    for library in libraries(binary)? {
        let inside = library
            .strip_prefix("/")
            .with_context(|| format!("{}: not an absolute path", library.display()))?
            .to_path_buf();
        files.insert(inside, library);
    }
    let tar = layer_tar(&files)?;
    let diff_id = Digest::of(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar)?;
    let layer = gz.finish()?;
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": USER,
            "Entrypoint": ["/wasmop"],
            "Cmd": ["run"],
            "Env": ["XDG_CACHE_HOME=/cache"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id.as_str()]},
    }))
    .expect("JSON serialises");
    Ok((config, layer))
}

/// The shared libraries `binary` loads, as `ldd` resolves them on this machine: none for a
/// static binary.
fn libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd (libc-bin) to find the binary's libraries")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A static binary: ldd says "statically linked", or fails with "not a dynamic executable".
    let not_dynamic = |t: &str| t.contains("not a dynamic executable");
    if text.contains("statically linked") || not_dynamic(&text) || not_dynamic(&stderr) {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        bail!("ldd {}: {}", binary.display(), stderr.trim());
    }
    parse_ldd(&text).map_err(|e| anyhow::anyhow!("ldd {}: {e}", binary.display()))
}

/// The paths in `ldd`'s answer: `name => /path (addr)` and the loader's `/path (addr)`; the
/// kernel's vDSO has no file.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(format!("{} not found", name.trim()));
                }
                rest
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

/// A tar of `files` (path in the image → file here), their directories, `/tmp` and
/// `/cache`; owned by root, times zero, in path order.
fn layer_tar(files: &BTreeMap<PathBuf, PathBuf>) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    let mut dirs = std::collections::BTreeSet::new();
    for inside in files.keys() {
        for dir in inside.ancestors().skip(1) {
            if !dir.as_os_str().is_empty() {
                dirs.insert(dir.to_path_buf());
            }
        }
    }
    let mut directory = |path: &Path, mode: u32| -> anyhow::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(mode);
        header.set_size(0);
        header.set_mtime(0);
        builder.append_data(&mut header, path, std::io::empty())?;
        Ok(())
    };
    for (path, mode) in [("cache", 0o1777), ("tmp", 0o1777)] {
        directory(Path::new(path), mode)?;
    }
    for dir in &dirs {
        directory(dir, 0o755)?;
    }
    for (inside, here) in files {
        let bytes = std::fs::read(here).with_context(|| format!("reading {}", here.display()))?;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o755);
        header.set_size(bytes.len() as u64);
        header.set_mtime(0);
        builder.append_data(&mut header, inside, &bytes[..])?;
    }
    Ok(builder.into_inner()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_answers_give_the_files_the_binary_loads() {
        let glibc = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(glibc).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err(),
            "libfoo.so.1 not found"
        );
    }

    #[test]
    fn the_same_binary_makes_the_same_image_which_runs_it_as_nonroot() {
        let dir = std::env::temp_dir().join(format!("wasmop-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = dir.join("static");
        std::fs::write(&binary, b"not an ELF: ldd says so").unwrap();
        let (config, layer) = build(&binary).unwrap();
        assert_eq!(build(&binary).unwrap(), (config.clone(), layer.clone()));
        let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(config["config"]["User"], USER);
        assert_eq!(config["config"]["Entrypoint"], json!(["/wasmop"]));
        assert_eq!(config["config"]["Cmd"], json!(["run"]));

        let tar = {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&layer[..]), &mut out)
                .unwrap();
            out
        };
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            Digest::of(&tar).to_string()
        );
        let mut archive = tar::Archive::new(&tar[..]);
        let entries: Vec<(String, u32)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            [
                ("cache".to_string(), 0o1777),
                ("tmp".to_string(), 0o1777),
                ("wasmop".to_string(), 0o755)
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
