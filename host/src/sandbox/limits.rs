//! What one plugin call may use: wall-clock time (an epoch deadline), linear memory (a
//! [`ResourceLimiter`] per store) and response size (checked before any JSON is parsed).
//! The host's [`MemoryBudget`] is drawn from by every store's growth and, through a
//! [`Held`], by the parse of every response.
//!
//! The memory limiter refuses growth past the cap the way an allocator expects (`memory.grow`
//! returns -1) and remembers that it did: a Rust guest then prints "memory allocation failed"
//! and aborts with `unreachable`, which looks exactly like a panic unless the store says the cap
//! was hit first.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::ResourceLimiter;

use super::invoke::Warm;
use super::warm::WarmPool;
use crate::config;

/// The most linear memory any plugin may be granted (1 GiB), whatever its [`Limits`] say: a
/// backstop in the pool itself. Larger limits are lowered to it at load, so the limiter (which
/// records the hit) always refuses first.
pub const MEMORY_CEILING: u64 = 1 << 30;

/// Largest table a guest may grow to, in elements (Rust guests use a few hundred).
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Limits of one plugin; every call gets a fresh budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Wall-clock deadline of one call (instantiation included). Default 1 s.
    pub deadline: Duration,
    /// Linear-memory cap of one instance, in bytes. Default 64 MiB; at most [`MEMORY_CEILING`]
    /// (lowered to it when a plugin is loaded).
    pub memory_bytes: u64,
    /// Largest response (`reconcile` JSON, or `related` selectors together), in bytes.
    /// Default 4 MiB.
    pub response_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(
            config::DEADLINE_MS,
            config::MEMORY_MIB,
            config::MAX_RESPONSE_KIB,
        )
    }
}

impl Limits {
    /// Limits in the units the command line and the annotations use.
    pub fn new(deadline_ms: u64, memory_mib: u64, max_response_kib: u64) -> Self {
        Self {
            deadline: Duration::from_millis(deadline_ms),
            memory_bytes: memory_mib.saturating_mul(1 << 20),
            response_bytes: max_response_kib.saturating_mul(1 << 10),
        }
    }
}

impl Limits {
    /// These limits with the memory cap brought within [`MEMORY_CEILING`].
    pub(crate) fn clamped(self) -> Self {
        Self {
            memory_bytes: self.memory_bytes.min(MEMORY_CEILING),
            ..self
        }
    }

    /// Epoch ticks for the deadline: rounded up, plus one because the first tick may come
    /// right after the deadline is set. A call gets at least `deadline`, at most one period more.
    pub(crate) fn deadline_ticks(&self, period: Duration) -> u64 {
        let period = period.as_nanos().max(1);
        let ticks = self.deadline.as_nanos().div_ceil(period);
        u64::try_from(ticks).unwrap_or(u64::MAX - 1) + 1
    }
}

/// What every call of every plugin shares: the instance slots, the memory budget and the
/// script instances waiting for their next call.
pub(crate) struct Shared {
    /// A permit per pool slot; a call holds one while it runs.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// The linear memory all calls may hold together.
    pub budget: Arc<MemoryBudget>,
    /// Script instances between their calls (`warm.rs`).
    pub warm: WarmPool<Warm>,
}

/// The linear memory all calls together may hold, whatever each plugin's cap says: the host's
/// own memory is bounded by it plus its baseline, so no plugin can grow the pod past its limit.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    used: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held by calls running now.
    pub fn in_use(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` if they fit.
    fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Holds `bytes` of the budget outside any store (what parsing a response will allocate on
    /// the host's heap) until the [`Held`] is dropped; `None` when they do not fit now.
    pub(crate) fn hold(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        self.try_take(bytes).then(|| Held {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

/// Bytes of the [`MemoryBudget`] held for host-side work of a call; given back when dropped.
#[derive(Debug)]
#[must_use = "the bytes are given back as soon as this is dropped"]
pub(crate) struct Held {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

/// Caps the linear memory of one store, draws it from the host's [`MemoryBudget`], and
/// records which of the two refused a growth.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    cap: usize,
    hit: bool,
    budget: Arc<MemoryBudget>,
    // Bytes this store holds of the budget; given back when the store is dropped.
    granted: u64,
    budget_hit: bool,
}

impl MemoryLimiter {
    pub(crate) fn new(cap: u64, budget: Arc<MemoryBudget>) -> Self {
        Self {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            hit: false,
            budget,
            granted: 0,
            budget_hit: false,
        }
    }

    /// Whether a growth past the plugin's own cap was refused in this store.
    pub(crate) fn hit(&self) -> bool {
        self.hit
    }

    /// Whether a growth was refused because other calls hold the host's budget.
    pub(crate) fn budget_hit(&self) -> bool {
        self.budget_hit
    }

    /// Bytes of the budget this store holds.
    pub(crate) fn granted(&self) -> u64 {
        self.granted
    }

    /// Forgets the refusals of a call that ended well, for the next call in the same store.
    pub(crate) fn clear_flags(&mut self) {
        self.hit = false;
        self.budget_hit = false;
    }
}

impl Drop for MemoryLimiter {
    fn drop(&mut self) {
        self.budget.give(self.granted);
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.hit = true;
            return Ok(false);
        }
        let more = u64::try_from(desired.saturating_sub(current)).unwrap_or(u64::MAX);
        if !self.budget.try_take(more) {
            self.budget_hit = true;
            return Ok(false);
        }
        self.granted += more;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_ticks_round_up_plus_one() {
        let period = Duration::from_millis(10);
        let limits = |ms| Limits {
            deadline: Duration::from_millis(ms),
            ..Limits::default()
        };
        assert_eq!(limits(1000).deadline_ticks(period), 101);
        assert_eq!(limits(15).deadline_ticks(period), 3);
        assert_eq!(limits(0).deadline_ticks(period), 1);
    }

    #[test]
    fn from_user_units() {
        assert_eq!(
            Limits::new(250, 16, 8),
            Limits {
                deadline: Duration::from_millis(250),
                memory_bytes: 16 << 20,
                response_bytes: 8 << 10,
            }
        );
    }

    #[test]
    fn memory_is_clamped_to_the_ceiling() {
        let big = Limits {
            memory_bytes: 8 << 30,
            ..Limits::default()
        };
        assert_eq!(big.clamped().memory_bytes, MEMORY_CEILING);
        assert_eq!(Limits::default().clamped(), Limits::default());
    }

    #[test]
    fn limiter_flags_the_cap() {
        let budget = Arc::new(MemoryBudget::new(1 << 30));
        let mut limiter = MemoryLimiter::new(1 << 20, budget);
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        assert!(!limiter.hit());
        assert!(!limiter.memory_growing(1 << 20, 2 << 20, None).unwrap());
        assert!(limiter.hit());
        assert!(!limiter.budget_hit());
    }

    #[test]
    fn stores_share_the_budget_and_give_it_back() {
        let budget = Arc::new(MemoryBudget::new(3 << 20));
        let mut one = MemoryLimiter::new(64 << 20, budget.clone());
        let mut two = MemoryLimiter::new(64 << 20, budget.clone());
        assert!(one.memory_growing(0, 2 << 20, None).unwrap());
        assert!(
            !two.memory_growing(0, 2 << 20, None).unwrap(),
            "only 1 MiB left"
        );
        assert!(two.budget_hit() && !two.hit());
        assert!(two.memory_growing(0, 1 << 20, None).unwrap());
        assert_eq!(budget.in_use(), 3 << 20);
        drop(one);
        assert_eq!(budget.in_use(), 1 << 20);
        drop(two);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn a_hold_shares_the_budget_with_stores_and_gives_it_back() {
        let budget = Arc::new(MemoryBudget::new(3 << 20));
        let mut store = MemoryLimiter::new(64 << 20, budget.clone());
        assert!(store.memory_growing(0, 2 << 20, None).unwrap());
        assert!(budget.hold(2 << 20).is_none(), "only 1 MiB left");
        assert_eq!(budget.in_use(), 2 << 20, "a refused hold takes nothing");
        let held = budget.hold(1 << 20).expect("1 MiB fits");
        assert!(
            !store.memory_growing(2 << 20, 3 << 20, None).unwrap(),
            "the hold counts against stores too"
        );
        assert!(store.budget_hit());
        drop(held);
        assert_eq!(budget.in_use(), 2 << 20);
        drop(store);
        assert_eq!(budget.in_use(), 0);
        assert!(
            budget.hold(4 << 20).is_none(),
            "never more than the whole budget"
        );
    }
}
