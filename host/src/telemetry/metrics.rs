//! The host's Prometheus metrics, in one process-wide registry (as client libraries of every
//! language keep theirs).
//!
//! | metric | labels |
//! |---|---|
//! | `wasmop_reconcile_total` | plugin, result (`success`, `error`) |
//! | `wasmop_reconcile_errors_total` | plugin, reason (the `Ready` condition's reason) |
//! | `wasmop_reconcile_skipped_total` | plugin (the request was the last quiet one again: no call) |
//! | `wasmop_reconcile_duration_seconds` (histogram) | plugin |
//! | `wasmop_plugin_call_duration_seconds` (histogram) | plugin, call (`related`, `reconcile`) |
//! | `wasmop_plugin_loads_total` | configmap, result (`success`, `failure`) |
//! | `wasmop_plugin_swaps_total` | configmap |
//! | `wasmop_plugin_info` (gauge, 1 per loaded plugin) | configmap, plugin, version, digest |
//! | `wasmop_workqueue_depth` (gauge, over every shard held) | plugin |
//! | `wasmop_reconciles_in_flight` (gauge, at most `--concurrency`) | plugin |
//! | `wasmop_cache_objects` (gauge) | kind (`Deployment.apps/v1`), body (`full`, `metadata`) |
//! | `wasmop_cache_bytes` (gauge, the objects' own bytes, not the indexes) | kind, body |

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels naming a plugin.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    /// The manifest name.
    pub plugin: String,
}

/// A plugin and an outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The manifest name.
    pub plugin: String,
    /// `success` or `error`.
    pub result: &'static str,
}

/// A plugin and an error reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The manifest name.
    pub plugin: String,
    /// UpperCamelCase reason.
    pub reason: String,
}

/// A plugin and one of its exports.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The manifest name.
    pub plugin: String,
    /// `related` or `reconcile`.
    pub call: &'static str,
}

/// A plugin ConfigMap and a load outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoadLabels {
    /// The ConfigMap.
    pub configmap: String,
    /// `success` or `failure`.
    pub result: &'static str,
}

/// A plugin ConfigMap.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigMapLabels {
    /// The ConfigMap.
    pub configmap: String,
}

/// What is loaded from one ConfigMap.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InfoLabels {
    /// The ConfigMap.
    pub configmap: String,
    /// The manifest name.
    pub plugin: String,
    /// The manifest version.
    pub version: String,
    /// `sha256:<hex>` of the module.
    pub digest: String,
}

/// Labels of the write counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `sent` (answered), `failed` (no answer) or `refused` by the leader's write fence.
    pub result: &'static str,
    /// The resource written, with its subresource: `deployments`, `memcacheds/status`.
    pub resource: String,
}

/// One shared watch's cache.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `Kind.apiVersion`, e.g. `Deployment.apps/v1`.
    pub kind: String,
    /// `full`, or `metadata` for a metadata-only watch.
    pub body: &'static str,
    /// The shard watched (`2/3`), empty when the host does not shard.
    pub shard: String,
}

/// Every metric of the host.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by outcome.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Failed reconciles by reason.
    pub reconcile_errors: Family<ReasonLabels, Counter>,
    /// Reconciles whose request was the last quiet one again, so nothing was called.
    pub reconciles_skipped: Family<PluginLabels, Counter>,
    /// Time per reconcile, from the queue to the last write.
    pub reconcile_duration: Family<PluginLabels, Histogram>,
    /// Time per call into the sandbox.
    pub plugin_call_duration: Family<CallLabels, Histogram>,
    /// Plugin loads by outcome.
    pub plugin_loads: Family<LoadLabels, Counter>,
    /// Versions swapped in place.
    pub plugin_swaps: Family<ConfigMapLabels, Counter>,
    /// One series per loaded plugin version.
    pub plugin_info: Family<InfoLabels, Gauge>,
    /// Parents waiting in each plugin's queue.
    pub workqueue_depth: Family<PluginLabels, Gauge>,
    /// Reconciles running now, per plugin.
    pub reconciles_in_flight: Family<PluginLabels, Gauge>,
    /// Writes to the API server (not the host's own Leases), sent, failed or refused by the fence.
    pub api_writes: Family<WriteLabels, Counter>,
    /// Objects in each shared watch's cache.
    pub cache_objects: Family<CacheLabels, Gauge>,
    /// Bytes those objects take.
    pub cache_bytes: Family<CacheLabels, Gauge>,
    /// Shards this replica holds (a sharded host).
    pub shards_held: Gauge,
    /// Access reviews asked as a plugin's identity, for what it may read (answers are cached).
    pub access_reviews: Family<PluginLabels, Counter>,
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Self {
        // 1 ms … ~33 s for reconciles, 10 µs … ~0.3 s for plugin calls.
        let reconcile_duration = Family::<PluginLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        let plugin_call_duration = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00001, 2.0, 16))
        });
        let mut m = Metrics {
            registry: Registry::with_prefix("wasmop"),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconciles_skipped: Family::default(),
            reconcile_duration,
            plugin_call_duration,
            plugin_loads: Family::default(),
            plugin_swaps: Family::default(),
            plugin_info: Family::default(),
            workqueue_depth: Family::default(),
            reconciles_in_flight: Family::default(),
            api_writes: Family::default(),
            cache_objects: Family::default(),
            cache_bytes: Family::default(),
            shards_held: Gauge::default(),
            access_reviews: Family::default(),
        };
        let r = &mut m.registry;
        r.register(
            "reconcile",
            "Reconciles, by plugin and result",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles, by plugin and reason",
            m.reconcile_errors.clone(),
        );
        r.register(
            "reconcile_skipped",
            "Reconciles whose request was byte-identical to the last one that changed nothing, so the plugin was not called",
            m.reconciles_skipped.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time per reconcile",
            m.reconcile_duration.clone(),
        );
        r.register(
            "plugin_call_duration_seconds",
            "Time per call into a plugin",
            m.plugin_call_duration.clone(),
        );
        r.register(
            "plugin_loads",
            "Plugin loads, by ConfigMap and result",
            m.plugin_loads.clone(),
        );
        r.register(
            "plugin_swaps",
            "Plugin versions swapped in place",
            m.plugin_swaps.clone(),
        );
        r.register(
            "plugin_info",
            "The plugin versions loaded (value 1)",
            m.plugin_info.clone(),
        );
        r.register(
            "workqueue_depth",
            "Parents waiting to be reconciled",
            m.workqueue_depth.clone(),
        );
        r.register(
            "reconciles_in_flight",
            "Reconciles running now, over every shard held (at most --concurrency per plugin)",
            m.reconciles_in_flight.clone(),
        );
        r.register(
            "api_writes",
            "Writes to the API server, but those of the host's own Leases: sent (answered), failed (no answer), or refused because the leader's or the shard's Lease is not held",
            m.api_writes.clone(),
        );
        r.register(
            "cache_objects",
            "Objects in each shared watch cache",
            m.cache_objects.clone(),
        );
        r.register(
            "cache_bytes",
            "Bytes the objects of each shared watch cache take (text and decoded metadata; not the indexes)",
            m.cache_bytes.clone(),
        );
        r.register(
            "shards_held",
            "Shards this replica holds, on a host run with --shards",
            m.shards_held.clone(),
        );
        r.register(
            "access_reviews",
            "Access reviews asked as a plugin's identity for what it may read; answers are kept for a while, so a steady state asks none",
            m.access_reviews.clone(),
        );
        m
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_up_in_the_text_format() {
        let m = metrics();
        m.reconciles
            .get_or_create(&ResultLabels {
                plugin: "unit".into(),
                result: "success",
            })
            .inc();
        m.plugin_call_duration
            .get_or_create(&CallLabels {
                plugin: "unit".into(),
                call: "reconcile",
            })
            .observe(0.0002);
        m.workqueue_depth
            .get_or_create(&PluginLabels {
                plugin: "unit".into(),
            })
            .set(3);
        let text = m.encode();
        assert!(
            text.contains(r#"wasmop_reconcile_total{plugin="unit",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"wasmop_plugin_call_duration_seconds_count{plugin="unit",call="reconcile"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE wasmop_workqueue_depth gauge"),
            "{text}"
        );
    }
}
