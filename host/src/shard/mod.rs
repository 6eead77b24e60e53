//! Sharding parents across host replicas by namespace.
//!
//! The 64-bit hash space is cut into `count` equal [`Shard`]s; an object belongs to the shard
//! whose range holds the FNV-1a hash of its namespace (the empty string for a cluster-scoped
//! object, so every cluster-scoped parent lands on one shard). A parent, its children and its
//! related objects share a namespace, so a parent's whole world is on one shard.
//!
//! The API server's own sharded lists and watches (the `ShardedListAndWatch` feature gate,
//! query parameter `shardSelector`) hash the same way, so a watch can ask it for one shard's
//! objects only ([`Shard::selector`]); the host also checks every object it is sent
//! ([`Shard::holds`]), which keeps it right on a server that ignores the parameter.
//! [`keeper`] holds shards through Leases, one per shard.
//!
//! ```
//! use wasmop::shard::Shard;
//!
//! let shards = Shard::all(3);
//! let holders: Vec<_> = shards.iter().filter(|s| s.holds("team-a")).collect();
//! assert_eq!(holders.len(), 1, "each namespace is in exactly one shard");
//! assert!(shards[0].selector().starts_with("shardRange(object.metadata.namespace,'0x0000000000000000',"));
//! ```

pub mod keeper;

use std::fmt;

/// The API server's field the selector hashes.
pub const FIELD: &str = "object.metadata.namespace";

/// The query parameter of a sharded list or watch.
pub const QUERY_PARAM: &str = "shardSelector";

/// Most shards a host splits parents into; each is a Lease and a set of watches.
pub const MAX_SHARDS: u32 = 256;

pub use wasmop_contract::hash::fnv1a64;

/// One of `count` equal slices of the hash space, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// Shard `index` of `count`, if `index < count <= MAX_SHARDS`.
    pub fn new(index: u32, count: u32) -> Option<Shard> {
        (count > 0 && count <= MAX_SHARDS && index < count).then_some(Shard { index, count })
    }

    /// Every shard of `count` (clamped to `1..=MAX_SHARDS`), in order.
    pub fn all(count: u32) -> Vec<Shard> {
        let count = count.clamp(1, MAX_SHARDS);
        (0..count).map(|index| Shard { index, count }).collect()
    }

    /// Its number, from 0.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many shards there are.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The hash range, `[start, end)`; the last shard ends at 2^64.
    pub fn range(&self) -> (u128, u128) {
        let bound = |i: u32| (u128::from(i) << 64) / u128::from(self.count);
        (bound(self.index), bound(self.index + 1))
    }

    /// Whether objects in `namespace` (`""` when cluster-scoped) belong here.
    pub fn holds(&self, namespace: &str) -> bool {
        let hash = u128::from(fnv1a64(namespace.as_bytes()));
        let (start, end) = self.range();
        start <= hash && hash < end
    }

    /// The `shardSelector` that asks the API server for this shard's objects only.
    pub fn selector(&self) -> String {
        let (start, end) = self.range();
        format!("shardRange({FIELD},'{}','{}')", hex(start), hex(end))
    }

    /// [`Shard::selector`] as a query parameter, `shardSelector=…`, percent-encoded.
    pub fn query(&self) -> String {
        format!("{QUERY_PARAM}={}", percent_encode(&self.selector()))
    }

    /// The name of the Lease that holds it: `<prefix>-<index>-of-<count>`, so that hosts run
    /// with different counts never share a Lease.
    pub fn lease_name(&self, prefix: &str) -> String {
        format!("{prefix}-{}-of-{}", self.index, self.count)
    }

    /// The shard a Lease named by [`Shard::lease_name`] with `prefix` holds; `None` for any
    /// other name, `…-01-of-2` included (it would shadow the real `…-1-of-2`).
    pub fn from_lease_name(prefix: &str, name: &str) -> Option<Shard> {
        let (index, count) = name
            .strip_prefix(prefix)?
            .strip_prefix('-')?
            .split_once("-of-")?;
        Shard::new(index.parse().ok()?, count.parse().ok()?)
            .filter(|shard| shard.lease_name(prefix) == name)
    }
}

/// Every byte but the URI's unreserved ones as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A bound as the API server wants it: `0x` and 16 lowercase hex digits, or `0x1` and 16
/// zeros for 2^64.
fn hex(bound: u128) -> String {
    format!("0x{bound:016x}")
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_hash_space_once() {
        for count in [1, 2, 3, 7, 16, MAX_SHARDS] {
            let shards = Shard::all(count);
            assert_eq!(shards[0].range().0, 0);
            assert_eq!(shards.last().unwrap().range().1, 1u128 << 64);
            for pair in shards.windows(2) {
                assert_eq!(pair[0].range().1, pair[1].range().0, "{count}");
            }
            for ns in ["", "default", "team-a", "kube-system", "ns-0042"] {
                let n = shards.iter().filter(|s| s.holds(ns)).count();
                assert_eq!(n, 1, "{ns:?} in {n} of {count} shards");
            }
        }
    }

    #[test]
    fn varied_names_spread_and_sequential_suffixes_cluster() {
        let count = |names: &[String]| {
            let shards = Shard::all(3);
            let mut counts = [0usize; 3];
            for ns in names {
                counts[shards.iter().position(|s| s.holds(ns)).unwrap()] += 1;
            }
            counts
        };
        // Names that differ in more than their last two characters spread.
        let varied: Vec<String> = (0..3000u64)
            .map(|i| format!("team-{:06x}", fnv1a64(&i.to_le_bytes()) >> 40))
            .collect();
        let counts = count(&varied);
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
        // FNV-1a moves only bits 40-50 for a change in the last two bytes: `tenant-00` to
        // `tenant-29` share one shard (docs/scaling.md says so).
        let sequential: Vec<String> = (0..30).map(|i| format!("tenant-{i:02}")).collect();
        assert!(count(&sequential).contains(&30));
    }

    #[test]
    fn selectors_and_names() {
        let all = Shard::all(2);
        assert_eq!(
            all[0].selector(),
            "shardRange(object.metadata.namespace,'0x0000000000000000','0x8000000000000000')"
        );
        assert_eq!(
            all[1].selector(),
            "shardRange(object.metadata.namespace,'0x8000000000000000','0x10000000000000000')"
        );
        assert_eq!(all[1].lease_name("wasmop-shard"), "wasmop-shard-1-of-2");
        assert_eq!(
            Shard::from_lease_name("wasmop-shard", "wasmop-shard-1-of-2"),
            Some(all[1])
        );
        for other in [
            "wasmop-shard-2-of-2",
            "other-1-of-2",
            "wasmop-shard-member-a",
            "wasmop-shard-1",
            "wasmop-shard-01-of-2",
            "wasmop-shard-1-of-02",
            "wasmop-shard-+1-of-2",
        ] {
            assert_eq!(
                Shard::from_lease_name("wasmop-shard", other),
                None,
                "{other}"
            );
        }
        assert_eq!(
            Shard::new(0, 2).unwrap().query(),
            "shardSelector=shardRange%28object.metadata.namespace%2C%270x0000000000000000%27%2C%270x8000000000000000%27%29"
        );
        assert_eq!(all[1].to_string(), "1/2");
        assert_eq!(Shard::new(2, 2), None);
        assert_eq!(Shard::new(0, MAX_SHARDS + 1), None);
        assert_eq!(Shard::all(0).len(), 1);
    }
}
