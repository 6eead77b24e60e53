//! How the host hands memory back to the system.
//!
//! glibc keeps what the host frees unless told otherwise. Three rules make the difference
//! between an RSS that follows the work and one that stays at its peak: few arenas and fixed
//! thresholds, set once by [`tune_allocator`] before any thread starts (`wasmop run` does; a
//! program that embeds [`crate::Host`] can too), and [`give_back_freed_memory`] after a burst
//! of allocation such as a plugin load.
//!
//! The binary's own code is the other half of an idle host's RSS: every page of it the host
//! ran once (start-up, the first list, a plugin load) stays mapped for good, 64 KiB around
//! each. [`release_code_pages`] unmaps them; the few the host keeps running come back.
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

/// Unmaps the pages of this program's binary that no write has touched (its code and
/// read-only data, never the relocated data), and returns how many bytes were resident in
/// them. Each page comes back from the page cache on its next use, so what stays resident is
/// the code the program runs, not all it ever ran: `wasmop run` calls this once it is ready
/// and every [`crate::config::CODE_PAGES_RELEASE`] (docs/benchmarks.md has what it saves).
/// Where the mappings cannot be read (not Linux), it does nothing and returns 0.
///
/// ```
/// let released = wasmop::memory::release_code_pages();
/// // The program runs on, and what it runs is resident again: this call's own code, for one.
/// let again = wasmop::memory::release_code_pages();
/// # #[cfg(target_os = "linux")]
/// assert!(released > 0 && again > 0);
/// # let _ = (released, again);
/// ```
pub fn release_code_pages() -> u64 {
    let (Ok(exe), Ok(smaps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::File::open("/proc/self/smaps"),
    ) else {
        return 0;
    };
    let exe = exe.to_string_lossy();
    // Read afresh each time, not once: a debugger or a uprobe gives a code page a private
    // copy, and that mapping must then be left alone. Streamed, not read whole: a host's
    // smaps runs to megabytes (thousands of mappings), and reading it all would raise the
    // peak RSS by as much on every release, at the moment the most code is resident.
    mappings(std::io::BufReader::new(smaps), |path| path == exe)
        .into_iter()
        .filter(|m| m.is_clean())
        .filter(|m| unmap(m.start, m.end))
        .map(|m| m.resident)
        .sum()
}

/// One mapping of `/proc/<pid>/smaps`, with the fields read here.
#[derive(Default)]
struct Mapping {
    start: usize,
    end: usize,
    perms: String,
    resident: u64,
    /// Bytes of pages of its own (written, so no longer the file's) in memory; `None` if not
    /// listed.
    anonymous: Option<u64>,
    /// Bytes of pages of its own swapped out, which `Anonymous:` leaves out; `None` if not
    /// listed.
    swapped: Option<u64>,
}

impl Mapping {
    /// Private, not writable and holding no page of its own, in memory or in swap: what the
    /// kernel maps back from the file is what it holds. The relocated data (RELRO) is
    /// read-only too, but written once at start-up, so it never qualifies, even with every
    /// written page swapped out.
    fn is_clean(&self) -> bool {
        let private = self.perms.ends_with('p');
        let own = (self.anonymous, self.swapped);
        self.perms.starts_with('r')
            && !self.perms.contains('w')
            && private
            && own == (Some(0), Some(0))
    }
}

/// The mappings listed in `smaps` whose path `keep` accepts, in their order, read a line at
/// a time; a read error ends the list.
fn mappings(mut smaps: impl std::io::BufRead, keep: impl Fn(&str) -> bool) -> Vec<Mapping> {
    let mut found: Vec<Mapping> = Vec::new();
    // Whether the last header read was kept: its field lines belong to `found.last()`.
    let mut keeping = false;
    let mut line = String::new();
    loop {
        line.clear();
        match smaps.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = line.trim_end();
        if let Some((range, rest)) = line.split_once(' ')
            && let Some((start, end)) = range.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            let mut fields = rest.split_whitespace();
            let perms = fields.next().unwrap_or("");
            let path = fields.nth(3).unwrap_or("");
            keeping = keep(path);
            if keeping {
                found.push(Mapping {
                    start,
                    end,
                    perms: perms.to_owned(),
                    ..Mapping::default()
                });
            }
            continue;
        }
        let Some(current) = found.last_mut().filter(|_| keeping) else {
            continue;
        };
        let bytes = |value: &str| {
            let kib = value.trim().trim_end_matches("kB").trim().parse::<u64>();
            kib.ok().map(|k| k * 1024)
        };
        if let Some(value) = line.strip_prefix("Rss:") {
            current.resident = bytes(value).unwrap_or(0);
        } else if let Some(value) = line.strip_prefix("Anonymous:") {
            current.anonymous = bytes(value);
        } else if let Some(value) = line.strip_prefix("Swap:") {
            current.swapped = bytes(value);
        }
    }
    found
}

/// Drops the pages of `[start, end)`, a clean private file mapping.
#[allow(unsafe_code)]
fn unmap(start: usize, end: usize) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: the range is one mapping of the binary that holds no page of its own and cannot
    // be written (read-only, no private copy): the kernel maps the same bytes back from the
    // file at the next access, so nothing is lost and no reference into it dangles.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (start, end);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
5625-5626 r--p 00000000 fe:00 11 /opt/wasmop
Rss:                2288 kB
Anonymous:             0 kB
Swap:                  0 kB
5626-5628 r-xp 00523000 fe:00 11 /opt/wasmop
Size:              21336 kB
Rss:                3052 kB
Anonymous:             0 kB
Swap:                  0 kB
5628-5629 r--p 019f8000 fe:00 11 /opt/wasmop
Rss:                 552 kB
Anonymous:           552 kB
Swap:                  0 kB
5629-562a rw-p 01a81000 fe:00 11 /opt/wasmop
Rss:                  24 kB
Anonymous:            24 kB
Swap:                  0 kB
562a-562b r--p 01a82000 fe:00 11 /opt/wasmop
Rss:                   8 kB
562b-562c r--p 01a83000 fe:00 11 /opt/wasmop
Rss:                   0 kB
Anonymous:             0 kB
Swap:                 16 kB
562c-562d r--s 00000000 fe:00 12 /opt/wasmop
Rss:                   4 kB
Anonymous:             0 kB
Swap:                  0 kB
7f01-7f02 rw-p 00000000 00:00 0
Rss:                 100 kB
Anonymous:           100 kB
Swap:                  0 kB
";

    #[test]
    fn only_read_only_mappings_without_pages_of_their_own_are_clean() {
        let clean: Vec<(usize, u64)> = mappings(SMAPS.as_bytes(), |_| true)
            .iter()
            .filter(|m| m.is_clean())
            .map(|m| (m.start, m.resident))
            .collect();
        // Not the relocated data (in memory or swapped out), the writable data, a shared
        // mapping, anonymous memory, nor a mapping whose `Anonymous:` line is missing.
        assert_eq!(clean, vec![(0x5625, 2288 * 1024), (0x5626, 3052 * 1024)]);
        let all = mappings(SMAPS.as_bytes(), |_| true);
        assert_eq!(all.len(), 8);
        assert_eq!((all[1].start, &*all[1].perms), (0x5626, "r-xp"));
        assert_eq!((all[5].start, all[5].swapped), (0x562b, Some(16 * 1024)));
        assert_eq!((all[7].start, all[7].anonymous), (0x7f01, Some(100 * 1024)));
    }

    #[test]
    fn mappings_not_kept_lend_their_fields_to_none() {
        // The anonymous mapping's `Rss:` must not land on the binary's mapping before it.
        let ours = mappings(SMAPS.as_bytes(), |path| path == "/opt/wasmop");
        assert_eq!(ours.len(), 7);
        assert_eq!(
            (ours[4].start, ours[4].resident, ours[4].anonymous),
            (0x562a, 8 * 1024, None)
        );
        assert!(mappings(SMAPS.as_bytes(), |_| false).is_empty());
    }

    /// This test binary's resident bytes in clean mappings, and its relocated data's own
    /// pages.
    #[cfg(target_os = "linux")]
    fn resident() -> (u64, u64) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let smaps = std::fs::File::open("/proc/self/smaps").unwrap();
        let exe = exe.to_string_lossy();
        let ours = mappings(std::io::BufReader::new(smaps), |path| path == exe);
        let clean = ours.iter().filter(|m| m.is_clean()).map(|m| m.resident);
        let relocated = ours
            .iter()
            .filter(|m| !m.perms.contains('w') && !m.is_clean())
            .map(|m| m.anonymous.unwrap_or(0));
        (clean.sum(), relocated.sum())
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_release_drops_resident_code_and_keeps_the_relocations() {
        let (clean, relocated) = resident();
        assert!(clean > 0, "the test binary runs from its own file");
        assert!(release_code_pages() > 0, "some of it was resident");
        let (after, relocated_after) = resident();
        assert!(
            after < clean,
            "resident code after the release ({after} bytes) is below before ({clean})"
        );
        assert_eq!(
            relocated_after, relocated,
            "the pages written at start-up (relocations) are all still there"
        );
    }
}
