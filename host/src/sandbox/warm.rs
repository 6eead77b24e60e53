//! Script instances kept between calls: a bounded pool, least recently used out first.
//!
//! A script plugin's instance holds the script parsed and frozen (`script.rs`); making one
//! again costs a parse, so the instance a call used goes back here for the next call of the
//! same plugin. The pool holds at most `max` instances over all plugins, `max_memory` bytes
//! of linear memory in all, so idle instances hold a bounded share of the memory budget and of
//! the instance pool; a plugin whose instance was pushed out pays the parse on its next call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Idle instances, each under the id of the plugin it serves.
pub(crate) struct WarmPool<T> {
    idle: Mutex<Idle<T>>,
    max: usize,
    max_memory: u64,
    next_id: AtomicU64,
}

/// The instances, oldest first, each with its plugin's id and its memory; and their memory.
struct Idle<T> {
    queue: VecDeque<(u64, T, u64)>,
    memory: u64,
}

impl<T> Idle<T> {
    fn remove(&mut self, at: usize) -> Option<T> {
        let (_, item, memory) = self.queue.remove(at)?;
        self.memory -= memory;
        Some(item)
    }
}

impl<T> WarmPool<T> {
    /// A pool of at most `max` instances holding at most `max_memory` bytes together.
    pub(crate) fn new(max: usize, max_memory: u64) -> Self {
        Self {
            idle: Mutex::new(Idle {
                queue: VecDeque::new(),
                memory: 0,
            }),
            max,
            max_memory,
            next_id: AtomicU64::new(1),
        }
    }

    /// An id for a plugin that never had one.
    pub(crate) fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// An idle instance of plugin `id`, the most recently used one.
    pub(crate) fn take(&self, id: u64) -> Option<T> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let at = idle.queue.iter().rposition(|(owner, ..)| *owner == id)?;
        idle.remove(at)
    }

    /// Keeps `item`, an instance of plugin `id` holding `memory` bytes, for a later call,
    /// dropping the least recently used past the bounds; drops `item` itself when it alone
    /// is past them.
    pub(crate) fn put(&self, id: u64, item: T, memory: u64) {
        if memory > self.max_memory || self.max == 0 {
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.queue.push_back((id, item, memory));
            idle.memory += memory;
            while idle.queue.len() > self.max || idle.memory > self.max_memory {
                evicted.extend(idle.remove(0));
            }
        }
        // Dropped outside the lock: a store's drop gives its pool slot back.
        drop(evicted);
    }

    /// Drops the idle instances of plugin `id`, which nothing will call again.
    pub(crate) fn forget(&self, id: u64) {
        let mut gone = Vec::new();
        {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(at) = idle.queue.iter().position(|(owner, ..)| *owner == id) {
                gone.extend(idle.remove(at));
            }
        }
        drop(gone);
    }

    /// Idle instances now, and the memory they hold.
    pub(crate) fn held(&self) -> (usize, u64) {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        (idle.queue.len(), idle.memory)
    }
}

impl<T> std::fmt::Debug for WarmPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (instances, memory) = self.held();
        f.debug_struct("WarmPool")
            .field("instances", &instances)
            .field("memory", &memory)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_takes_back_its_own_most_recent_instance() {
        let pool = WarmPool::new(4, 100);
        let (a, b) = (pool.id(), pool.id());
        assert_ne!(a, b);
        pool.put(a, "a1", 1);
        pool.put(b, "b1", 1);
        pool.put(a, "a2", 1);
        assert_eq!(pool.take(a), Some("a2"));
        assert_eq!(pool.take(a), Some("a1"));
        assert_eq!(pool.take(a), None);
        assert_eq!(pool.take(b), Some("b1"));
    }

    #[test]
    fn the_least_recently_used_goes_first_past_the_bound() {
        let pool = WarmPool::new(2, 100);
        pool.put(1, "one", 1);
        pool.put(2, "two", 1);
        pool.put(3, "three", 1);
        assert_eq!(pool.held(), (2, 2));
        assert_eq!(pool.take(1), None, "the oldest was dropped");
        assert_eq!(pool.take(3), Some("three"));
    }

    #[test]
    fn idle_instances_hold_no_more_memory_than_the_bound() {
        let pool = WarmPool::new(8, 100);
        pool.put(1, "one", 40);
        pool.put(2, "two", 40);
        pool.put(3, "three", 40);
        assert_eq!(pool.held(), (2, 80), "the oldest made room");
        assert_eq!(pool.take(1), None);
        assert_eq!(pool.take(2), Some("two"));
        assert_eq!(
            pool.held(),
            (1, 40),
            "a taken instance takes its memory along"
        );
    }

    #[test]
    fn an_instance_larger_than_the_bound_is_not_kept() {
        let pool = WarmPool::new(2, 100);
        pool.put(1, "big", 101);
        assert_eq!(pool.take(1), None);
        pool.put(1, "small", 100);
        assert_eq!(pool.take(1), Some("small"));
        let none = WarmPool::new(0, 100);
        none.put(1, "any", 1);
        assert_eq!(none.held(), (0, 0), "a pool of none keeps none");
    }

    #[test]
    fn a_forgotten_plugin_leaves_nothing_behind() {
        let pool = WarmPool::new(4, 100);
        pool.put(1, "a", 1);
        pool.put(2, "b", 1);
        pool.put(1, "c", 1);
        pool.forget(1);
        assert_eq!(pool.held(), (1, 1));
        assert_eq!(pool.take(2), Some("b"));
    }
}
