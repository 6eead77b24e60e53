//! How the host's allocator hands memory back to the system.
//!
//! glibc keeps what the host frees unless told otherwise. Three rules make the difference
//! between an RSS that follows the work and one that stays at its peak: few arenas and fixed
//! thresholds, set once by [`tune_allocator`] before any thread starts (`wasmop run` does; a
//! program that embeds [`crate::Host`] can too), and [`give_back_freed_memory`] after a burst
//! of allocation such as a plugin load.
//!
//! ```
//! wasmop::memory::tune_allocator();
//! # #[cfg(all(target_os = "linux", target_env = "gnu"))]
//! # {
//! // SAFETY: mallinfo2 only reads the allocator's counters.
//! let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
//! // glibc alone would raise its threshold to 2 MiB here and serve the next 1 MiB from its heap.
//! drop(std::hint::black_box(vec![1u8; 2 << 20]));
//! let before = mapped();
//! let block = std::hint::black_box(vec![1u8; 1 << 20]);
//! assert!(mapped() >= before + (1 << 20), "a 1 MiB block has its own mapping");
//! drop(block);
//! assert!(mapped() < before + (1 << 20), "and it went back to the system when freed");
//! # }
//! wasmop::memory::give_back_freed_memory();
//! ```

/// Sets glibc's arenas unless the operator did (`MALLOC_ARENA_MAX`), and both thresholds unless
/// the operator set either (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`): setting one
/// already stops glibc moving both. `GLIBC_TUNABLES` counts for each. Call it before starting
/// threads.
pub fn tune_allocator() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let set =
        |name: &str, tunable: &str| std::env::var_os(name).is_some() || tunables.contains(tunable);
    if !set("MALLOC_ARENA_MAX", "glibc.malloc.arena_max") {
        few_arenas();
    }
    if !set("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold")
        && !set("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold")
    {
        return_large_blocks();
    }
}

/// glibc gives threads arenas of their own, up to eight per core, and memory freed in one is
/// not reused by the others: for the host's many short-lived allocations (watch events,
/// requests, answers) that fragmentation cost 5.6 MiB of 57 with twelve plugins. Two arenas
/// keep it down; the host's threads mostly wait.
#[allow(unsafe_code)]
fn few_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's settings; called before any thread of ours
    // starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Keeps blocks of 128 KiB and more in their own mappings, returned to the system when freed,
/// and trims the heap past 128 KiB of free space at its top.
///
/// glibc starts there, but raises both each time such a block is freed, up to 32 MiB and
/// 64 MiB: after the first large list response or component, large buffers come from the heap
/// and the heap is never trimmed. Fixing the values measured 6–13 MiB less with 10 to 100
/// plugins and about 1.5 MiB less with 1000 parents (`docs/benchmarks.md`).
#[allow(unsafe_code)]
fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's settings; it has no preconditions.
    unsafe {
        // glibc's own starting value for both.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

/// Returns what a burst freed (a compile's working memory, the module's and the artifact's
/// buffers): glibc keeps it otherwise, fragmented over its arenas, and the host's RSS would
/// stay at the peak for good.
#[allow(unsafe_code)]
pub fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
