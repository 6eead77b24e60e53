//! The wasmtime [`Engine`] every plugin of one [`Sandbox`](super::Sandbox) shares: the
//! component model, a pooling instance allocator sized for `max_instances` concurrent calls,
//! and epoch interruption driven by one ticker thread.
//!
//! Each call gets a fresh instance, but not fresh pages: when a call ends, wasmtime resets
//! the pages it touched back to the module's initial image in place (up to [`KEEP_RESIDENT`];
//! the rest are unmapped), so the next call on the slot starts from the same bytes without
//! faulting them in again. Slots are reused by the same plugin first.
//!
//! The ticker holds only a weak reference, so dropping the last `Sandbox` stops it.
//!
//! Every pool slot reserves address space for a whole 32-bit memory plus guard pages
//! (about 4 GiB each): the 64 slots for calls and 16 for script instances waiting between
//! calls take about 330 GiB of virtual address space. Resident, a
//! freed slot holds what its last call touched up to [`KEEP_RESIDENT`], and the slots ever
//! used are about the most calls at once plus a few. Containers with a virtual-memory ulimit
//! need a smaller pool.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::error::SandboxError;
use super::functions::FunctionCache;
use super::limits::MEMORY_CEILING;

/// How often the epoch advances: the granularity of every deadline.
pub(crate) const EPOCH_PERIOD: Duration = Duration::from_millis(10);

/// Core instances one component may create (a Rust wasip2 guest uses 3).
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
/// Memories and tables one component may define (a Rust guest has one memory and one table).
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 4;

/// Bytes a freed memory or table slot may keep resident, reset in place for the next call:
/// a Memcached call with 3 pods touches 44 KiB, one with 100 more than this. Idle slots of
/// one-memory guests (Rust's) in the default pool of 64 instances hold about 17 MiB at most.
pub const KEEP_RESIDENT: usize = 256 << 10;
/// Freed slots left warm for other plugins before the least recently used is taken over.
const UNUSED_WARM_SLOTS: u32 = 4;

/// Builds the engine and starts its epoch ticker; it compiles through `functions` when given.
pub(crate) fn new_engine(
    max_instances: u32,
    functions: Option<Arc<FunctionCache>>,
) -> Result<Engine, SandboxError> {
    // Script instances waiting between calls hold slots of their own.
    let max_instances = max_instances
        .max(1)
        .saturating_add(u32::try_from(crate::config::WARM_SCRIPTS).unwrap_or(u32::MAX));
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(max_instances)
        // Pool totals are shared by all plugins; per-component maxima are checked at compile
        // time, so a component that could never fit is refused when it loads.
        .total_core_instances(max_instances.saturating_mul(4))
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_memories(max_instances.saturating_mul(MEMORIES_PER_COMPONENT))
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .total_tables(max_instances.saturating_mul(TABLES_PER_COMPONENT))
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size(usize::try_from(MEMORY_CEILING).unwrap_or(usize::MAX))
        // A freed slot is reset in place (only its dirty pages, found with PAGEMAP_SCAN where
        // the kernel has it) instead of unmapped, so the next call takes no page faults there.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        .pagemap_scan(Enabled::Auto)
        // What stays resident is bounded by the slots ever used: the calls at once plus these.
        .max_unused_warm_slots(UNUSED_WARM_SLOTS);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    if let Some(functions) = functions {
        config
            .enable_incremental_compilation(functions)
            .map_err(|e| SandboxError::Engine(e.into()))?;
    }
    let engine = Engine::new(&config).map_err(|e| SandboxError::Engine(e.into()))?;
    start_ticker(&engine)?;
    Ok(engine)
}

fn start_ticker(engine: &Engine) -> Result<(), SandboxError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasmop-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_PERIOD);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .map_err(SandboxError::Ticker)?;
    Ok(())
}
