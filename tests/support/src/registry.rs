//! A real OCI registry on loopback for the registry tests: Debian's `docker-registry`
//! (distribution 2.8), unpacked by `tests/setup.sh` into `~/.cache/wasmop/registry/`, or the
//! one on `PATH`, or `WASMOP_TEST_REGISTRY`. Its storage is a directory of its own; dropping
//! the handle kills it and removes that directory. [`TestRegistry::start_with_login`] starts
//! one that asks for a user and password (distribution's htpasswd, a Basic challenge).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A running registry.
pub struct TestRegistry {
    child: Child,
    dir: PathBuf,
    /// The htpasswd file, when it asks for a login.
    htpasswd: Option<PathBuf>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

/// The registry binary.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("WASMOP_TEST_REGISTRY") {
        return path.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME")
        .join("wasmop/registry/usr/bin/docker-registry");
    if cache.exists() {
        return cache;
    }
    PathBuf::from("docker-registry")
}

impl TestRegistry {
    /// Starts one on a free loopback port and waits until it listens.
    pub fn start() -> TestRegistry {
        Self::start_in(None)
    }

    /// Starts one that takes only `user` with `password`, on a free loopback port.
    pub fn start_with_login(user: &str, password: &str) -> TestRegistry {
        // The lowest cost bcrypt takes: the registry checks it on every request.
        let hash = bcrypt::hash(password, 4).expect("bcrypt");
        Self::start_in(Some(format!("{user}:{hash}\n")))
    }

    fn start_in(htpasswd: Option<String>) -> TestRegistry {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wasmop-registry-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("data")).expect("registry directory");
        let htpasswd = htpasswd.map(|lines| {
            let path = dir.join("htpasswd");
            std::fs::write(&path, lines).expect("htpasswd");
            path
        });
        let (child, addr) = spawn(&dir, "127.0.0.1:0", htpasswd.as_deref());
        TestRegistry {
            child,
            dir,
            htpasswd,
            addr,
        }
    }

    /// `oci://ADDR/REPO`.
    pub fn reference(&self, repo: &str) -> String {
        format!("oci://{}/{repo}", self.addr)
    }

    /// Stops it (its storage stays until drop), as a registry that went down.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same address with the same storage, as a registry back up.
    pub fn restart(&mut self) {
        self.stop();
        let (child, addr) = spawn(&self.dir, &self.addr, self.htpasswd.as_deref());
        assert_eq!(addr, self.addr, "the registry came back elsewhere");
        self.child = child;
    }
}

/// A registry serving `dir/data` on `addr`, asking for a login in `htpasswd` if given, and
/// where it listens.
fn spawn(dir: &std::path::Path, addr: &str, htpasswd: Option<&Path>) -> (Child, String) {
    let config = dir.join(format!("config-{}.yml", addr.replace(':', "-")));
    let auth = htpasswd
        .map(|p| {
            format!(
                "auth:\n  htpasswd:\n    realm: wasmop-test\n    path: {}\n",
                p.display()
            )
        })
        .unwrap_or_default();
    std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: wasmop-test\n{auth}",
                dir.join("data").display()
            ),
        )
        .expect("registry config");
    let bin = binary();
    let mut child = Command::new(&bin)
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting the registry {} (tests/setup.sh unpacks Debian's docker-registry): {e}",
                bin.display()
            )
        });
    // It logs `listening on 127.0.0.1:PORT` once the socket is bound.
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && let Some(rest) = line.split("listening on ").nth(1) {
                let addr: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                let _ = tx.send(addr);
                sent = true;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = rx
        .recv_timeout(deadline - Instant::now())
        .expect("the registry to say where it listens within 30 s");
    (child, addr)
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
