//! The WASI a plugin sees: deterministic, and with nothing that blocks.
//!
//! A plugin must be a pure function of its request: the same request gives the same response,
//! byte for byte, which is what lets the host skip work at rest and replay a call exactly. And
//! a call must end within its deadline, but the epoch deadline fires only in wasm code, never
//! while the guest waits in a host function. So, over WASI p2 with no capabilities granted
//! (no preopens, environment, arguments or network):
//! - `wasi:clocks/wall-clock` reads a fixed time ([`FIXED_WALL_CLOCK`], 2000-01-01T00:00:00Z);
//! - `wasi:clocks/monotonic-clock` reads 0 forever, and every wait on it is over at once: a
//!   guest's `std::thread::sleep` returns immediately, and a loop waiting for time to pass
//!   spins until its deadline;
//! - `wasi:random/*` returns a fixed byte sequence ([`SEED`]), the same in every call.
//!
//! The standard library still finds every import it links against, so ordinary Rust guests
//! load unchanged.

use std::time::Duration;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock::{self, Duration as Nanos, Instant};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{Deterministic, HostWallClock, WasiCtxBuilder, WasiView};

/// What `wasi:clocks/wall-clock` always reads: 2000-01-01T00:00:00Z.
pub const FIXED_WALL_CLOCK: Duration = Duration::from_secs(946_684_800);

/// The bytes every call's randomness cycles through.
pub const SEED: [u8; 16] = *b"wasmop-no-random";

/// Links WASI p2 for `T`, with the monotonic clock replaced by [`Frozen`]. Pair it with a
/// context from [`ctx_builder`].
pub(crate) fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    // The one interface whose waits would otherwise block in real time.
    linker.allow_shadowing(true);
    monotonic_clock::add_to_linker::<T, Frozen>(linker, |state| FrozenClock {
        table: state.ctx().table,
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A WASI context with the fixed wall clock and the fixed randomness; the caller adds output.
pub(crate) fn ctx_builder() -> WasiCtxBuilder {
    let mut builder = WasiCtxBuilder::new();
    builder
        .wall_clock(FixedWallClock)
        .secure_random(Deterministic::new(SEED.to_vec()))
        .insecure_random(Deterministic::new(SEED.to_vec()))
        .insecure_random_seed(u128::from_le_bytes(SEED));
    builder
}

struct FixedWallClock;

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        FIXED_WALL_CLOCK
    }
}

/// The [`HasData`] of the frozen monotonic clock.
struct Frozen;

impl HasData for Frozen {
    type Data<'a> = FrozenClock<'a>;
}

/// A monotonic clock that never moves and whose every deadline has passed.
struct FrozenClock<'a> {
    table: &'a mut ResourceTable,
}

impl monotonic_clock::Host for FrozenClock<'_> {
    fn now(&mut self) -> wasmtime::Result<Instant> {
        Ok(0)
    }

    fn resolution(&mut self) -> wasmtime::Result<Instant> {
        Ok(1)
    }

    fn subscribe_instant(&mut self, _when: Instant) -> wasmtime::Result<Resource<DynPollable>> {
        elapsed(self.table)
    }

    fn subscribe_duration(&mut self, _duration: Nanos) -> wasmtime::Result<Resource<DynPollable>> {
        elapsed(self.table)
    }
}

/// A pollable that is ready at once.
struct Elapsed;

#[wasmtime_wasi::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

fn elapsed(table: &mut ResourceTable) -> wasmtime::Result<Resource<DynPollable>> {
    let resource = table.push(Elapsed)?;
    subscribe(table, resource)
}
