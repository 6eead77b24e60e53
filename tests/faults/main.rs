//! The fault suite: the host with the Memcached plugin over a few hundred parents on the real
//! control plane, one fault injected per test, then everything must converge with nothing
//! lost or duplicated ([`fleet::problems`]).
//!
//! The plane is this binary's own (`testenv::shared`), since the faults restart its parts;
//! the tests take turns ([`serial`]). Each prints `measured:` lines that
//! `docs/reliability.md` tabulates: `cargo test -p wasmop --test faults -- --nocapture`.

#[allow(dead_code)]
mod fleet;

mod control_plane;
mod leader;
mod network;
mod plugins;
mod preview;
mod restart;

use tokio::sync::{Mutex, MutexGuard};

/// One fault at a time: they restart parts of the plane every test shares. (A tokio mutex:
/// each test has its own runtime, and a failed test must not poison the others' turns.)
pub async fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::const_new(());
    SERIAL.lock().await
}

/// The plane of this binary, to break.
pub async fn plane() -> &'static testenv::TestEnv {
    testenv::shared()
        .await
        .expect("control plane")
        .plane()
        .expect("the fault suite needs its own plane, not WASMOP_TEST_USE_EXISTING")
}
