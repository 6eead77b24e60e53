//! Building and caching the Go binaries: `controlplane` (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler in one multi-call binary, from `go/` beside this
//! crate) and `kwok`.
//!
//! A cold build takes about 10 minutes on 2 cores, so the binaries are cached outside the
//! repository, in `${XDG_CACHE_HOME:-~/.cache}/wasmop/testenv/<key>/`, where the key holds the
//! pinned versions and a hash of the Go sources and build flags: editing `go.mod` or
//! `main.go` builds anew, everything else reuses. `WASMOP_TESTENV_BIN_DIR` replaces that
//! directory (CI can point it at a cached folder; it is built into if incomplete).
//!
//! Builds are safe to interrupt and to race: a file lock lets one process build while others
//! wait, and the result is built in a temporary directory and renamed into place, so the
//! cache directory either holds both complete binaries or does not exist.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::process::{self, TAIL_LINES};

/// The Kubernetes release the control plane is built from (`go/go.mod` pins the same).
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The kwok release that fakes nodes and pods.
pub const KWOK_VERSION: &str = "v0.7.0";
/// The environment variable that names the binary directory, replacing the cache.
pub const BIN_DIR_ENV: &str = "WASMOP_TESTENV_BIN_DIR";

/// `-ldflags` of the control-plane build: `/version` must report the release, not
/// `v0.0.0-master`, and stripping symbols saves 60 MB.
fn controlplane_ldflags() -> String {
    let mut numbers = KUBERNETES_VERSION.trim_start_matches('v').split('.');
    let (major, minor) = (numbers.next().unwrap_or("1"), numbers.next().unwrap_or("0"));
    let var = "k8s.io/component-base/version";
    format!(
        "-s -w -X {var}.gitVersion={KUBERNETES_VERSION} -X {var}.gitMajor={major} -X {var}.gitMinor={minor}"
    )
}

/// The Go sources, embedded so the cache key is known without reading the repository (and
/// so editing them rebuilds this crate, which then computes a new key).
const GO_SOURCES: [(&str, &[u8]); 3] = [
    ("go.mod", include_bytes!("../go/go.mod")),
    ("go.sum", include_bytes!("../go/go.sum")),
    (
        "cmd/controlplane/main.go",
        include_bytes!("../go/cmd/controlplane/main.go"),
    ),
];

/// How often a running build reports that it is still going.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// Paths of the binaries, all present and complete.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The multi-call binary: `controlplane etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl`.
    pub controlplane: PathBuf,
    /// The kwok binary.
    pub kwok: PathBuf,
    /// A `kubectl` of the same Kubernetes version: a symlink to `controlplane`, which runs
    /// kubectl when called by that name.
    pub kubectl: PathBuf,
}

impl Binaries {
    fn in_dir(dir: &Path) -> Self {
        Binaries {
            controlplane: dir.join("controlplane"),
            kwok: dir.join("kwok"),
            kubectl: dir.join("kubectl"),
        }
    }

    // The symlink is cheap to make and not part of the atomic install.
    fn link_kubectl(self) -> Result<Self> {
        if !self.kubectl.exists() {
            let _ = std::fs::remove_file(&self.kubectl);
            std::os::unix::fs::symlink("controlplane", &self.kubectl)
                .map_err(|e| Error::io(format!("linking {}", self.kubectl.display()), e))?;
        }
        Ok(self)
    }

    fn complete(&self) -> bool {
        self.controlplane.is_file() && self.kwok.is_file()
    }
}

/// The cache key: pinned versions plus a hash of the Go sources and build flags.
pub fn cache_key() -> String {
    let mut hash = Sha256::new();
    for part in [
        KUBERNETES_VERSION,
        KWOK_VERSION,
        &controlplane_ldflags(),
        "CGO_ENABLED=0 -trimpath",
    ] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    for (name, bytes) in GO_SOURCES {
        hash.update(name.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    }
    let digest = hash.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("k8s-{KUBERNETES_VERSION}-kwok-{KWOK_VERSION}-{hex}")
}

/// The directory holding (or to hold) the binaries: `WASMOP_TESTENV_BIN_DIR`, or the cache.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return absolute(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::home_dir().map(|h| h.join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    absolute(cache)
        .join("wasmop")
        .join("testenv")
        .join(cache_key())
}

fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// Returns the binaries, building them first if this machine has none yet. Blocks, for up
/// to ~10 minutes on a cold machine; call [`ensure`] from async code.
pub fn ensure_blocking() -> Result<Binaries> {
    let dir = bin_dir();
    let bins = Binaries::in_dir(&dir);
    if bins.complete() {
        return bins.link_kubectl();
    }

    let parent = dir.parent().unwrap_or(Path::new("/")).to_owned();
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    fs::create_dir_all(&parent)
        .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    let lock_path = parent.join(format!(".{name}.lock"));
    let lock = File::create(&lock_path)
        .map_err(|e| Error::io(format!("creating {}", lock_path.display()), e))?;
    if lock.try_lock().is_err() {
        progress(format_args!(
            "waiting for another process building into {}",
            dir.display()
        ));
        lock.lock()
            .map_err(|e| Error::io(format!("locking {}", lock_path.display()), e))?;
    }
    // The other process may have finished while this one waited.
    if bins.complete() {
        return bins.link_kubectl();
    }

    // Holding the lock, any leftover temporary directory is from an interrupted build.
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    remove_stale_tmp_dirs(&parent, &name);
    fs::create_dir_all(&tmp).map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;

    let go = find_go().ok_or_else(|| Error::GoNotFound { dir: dir.clone() })?;
    progress(format_args!(
        "building the control plane (Kubernetes {KUBERNETES_VERSION}, kwok {KWOK_VERSION}) into {}; \
         the first build on a machine takes about 10 minutes",
        dir.display()
    ));
    let started = Instant::now();
    let built = Binaries::in_dir(&tmp);

    let go_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("go");
    let mut cmd = go_command(&go);
    cmd.current_dir(&go_dir).args([
        "build",
        "-v",
        "-trimpath",
        "-buildvcs=false",
        "-ldflags",
        &controlplane_ldflags(),
        "-o",
    ]);
    cmd.arg(&built.controlplane).arg("./cmd/controlplane");
    run_build("controlplane", cmd, &tmp.join("build-controlplane.log"))?;

    let mut cmd = go_command(&go);
    cmd.current_dir(&tmp).env("GOBIN", &tmp).args([
        "install",
        "-v",
        &format!("sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"),
    ]);
    run_build("kwok", cmd, &tmp.join("build-kwok.log"))?;

    install(&tmp, &dir)?;
    progress(format_args!(
        "built the control plane in {} s",
        started.elapsed().as_secs()
    ));
    drop(lock);
    bins.link_kubectl()
}

/// Async wrapper of [`ensure_blocking`], run on tokio's blocking pool.
pub async fn ensure() -> Result<Binaries> {
    tokio::task::spawn_blocking(ensure_blocking)
        .await
        .map_err(|e| {
            Error::io(
                "building the control-plane binaries",
                std::io::Error::other(e),
            )
        })?
}

fn go_command(go: &Path) -> Command {
    let mut cmd = Command::new(go);
    // Static binaries; never download a different Go toolchain behind the user's back.
    cmd.env("CGO_ENABLED", "0").env("GOTOOLCHAIN", "local");
    cmd
}

fn find_go() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("go"))
        .chain([PathBuf::from("/usr/local/go/bin/go")])
        .find(|candidate| candidate.is_file())
}

/// Runs one `go` build, logging its output to `log` and printing a progress line every
/// [`PROGRESS_EVERY`] (a build is silent for minutes otherwise).
fn run_build(what: &'static str, mut cmd: Command, log: &Path) -> Result<()> {
    let mut log_file =
        File::create(log).map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        process::spawn(cmd).map_err(|e| Error::io(format!("running go to build {what}"), e))?;

    // `go -v` prints one line per package it compiles: count them as progress.
    let mut packages = 0usize;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    for stream in [
        stdout.map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        stderr.map(|s| Box::new(s) as _),
    ]
    .into_iter()
    .flatten()
    {
        let lines_tx = lines_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(|l| l.ok()) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(lines_tx);

    let started = Instant::now();
    let mut next_report = started + PROGRESS_EVERY;
    let status = loop {
        while let Ok(line) = lines_rx.try_recv() {
            let _ = writeln!(log_file, "{line}");
            packages += 1;
        }
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io(format!("waiting for the {what} build"), e))?
        {
            break status;
        }
        if Instant::now() >= next_report {
            progress(format_args!(
                "still building {what}… {} s, {} packages compiled",
                started.elapsed().as_secs(),
                packages
            ));
            next_report += PROGRESS_EVERY;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Collect what the readers still hold (they end when the pipes close).
    for line in lines_rx.iter() {
        let _ = writeln!(log_file, "{line}");
    }
    if !status.success() {
        return Err(Error::Build {
            what,
            status,
            log: log.to_owned(),
            tail: process::tail(log, TAIL_LINES),
        });
    }
    progress(format_args!(
        "built {what} in {} s",
        started.elapsed().as_secs()
    ));
    Ok(())
}

/// Moves the built binaries from `tmp` to `dir`: one rename of the whole directory when
/// `dir` does not exist yet, else one rename per binary, `kwok` last (readers check both).
fn install(tmp: &Path, dir: &Path) -> Result<()> {
    let rename = |from: &Path, to: &Path| {
        fs::rename(from, to)
            .map_err(|e| Error::io(format!("moving {} to {}", from.display(), to.display()), e))
    };
    if !dir.exists() {
        return rename(tmp, dir);
    }
    let built = Binaries::in_dir(tmp);
    let target = Binaries::in_dir(dir);
    rename(&built.controlplane, &target.controlplane)?;
    rename(&built.kwok, &target.kwok)?;
    let _ = fs::remove_dir_all(tmp);
    Ok(())
}

fn remove_stale_tmp_dirs(parent: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Prints a progress line straight to the stderr file descriptor: `eprintln!` inside a test
/// is captured by the test harness, and a ten-minute silent build looks like a hang.
fn progress(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "testenv: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_names_the_versions() {
        let key = cache_key();
        assert!(key.starts_with("k8s-v1.37.2-kwok-v0.7.0-"), "{key}");
        assert_eq!(key, cache_key());
    }

    #[test]
    fn go_mod_pins_the_same_release() {
        let go_mod = std::str::from_utf8(GO_SOURCES[0].1).unwrap();
        assert!(go_mod.contains(&format!("k8s.io/kubernetes {KUBERNETES_VERSION}")));
        assert_eq!(
            controlplane_ldflags(),
            "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 \
             -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
        );
    }
}
