//! Sharding across host replicas (`wasmop run --shards`): for R = 1, 2 and 3 replicas, each
//! run with `--shards 12`, N parents of size 1 over 30 namespaces on a fresh plane whose API
//! server shards lists and watches (`ShardedListAndWatch`), so each replica lists, watches and
//! caches only its shards' objects. Per replica: the shards it holds, the parents it caches,
//! its peak RSS and CPU; for all: the time to converge and the writes per parent. With three,
//! one replica is SIGKILLed: how long until its shard Leases are held by the others, and until
//! a change to one of its parents is reconciled. wasmop only: the Go operator and the native
//! controller have no sharding.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use testenv::TestEnv;
use tokio::time::Instant;
use wasmop::shard::Shard;
use wasmop::shard::keeper;

use crate::artifacts::Artifacts;
use crate::cluster::{self, Convergence, Cr, Tracker};
use crate::contestants::{self, PLUGIN_NAMESPACE, Settings};
use crate::kinds::Kind;
use crate::process::{Proc, Usage};

/// Shards the hash space is cut into (`--shards`).
pub const SHARDS: u32 = 12;
/// Namespaces the parents are spread over.
pub const NAMESPACES: usize = 30;
/// `--lease-duration-seconds`: how long a dead replica's shards stay with it.
pub const LEASE_SECONDS: u64 = 15;
/// The replica counts measured.
pub const REPLICAS: [usize; 3] = [1, 2, 3];
/// Parents of the killed replica changed during the failover.
pub const FAILOVER_PARENTS: usize = 10;
/// After convergence, late writes land before anything is read.
const SETTLE: Duration = Duration::from_secs(5);
/// The longest wait for the replicas to share the shards, or for a failover.
const SHARING_TIMEOUT: Duration = Duration::from_secs(180);

/// One replica, at convergence + [`SETTLE`].
#[derive(Debug, Clone)]
pub struct Replica {
    /// Its `POD_NAME`.
    pub pod: String,
    /// Shard Leases it held when the parents were created.
    pub shards: usize,
    /// Memcached objects in its cache (`wasmop_cache_objects`).
    pub cached: usize,
    /// Objects of every kind in its cache.
    pub cached_all: usize,
    /// Those objects' own bytes (`wasmop_cache_bytes`), not the indexes.
    pub cache_bytes: f64,
    /// Just before the first create.
    pub at_start: Usage,
    /// At convergence + [`SETTLE`].
    pub at_converged: Usage,
    /// Writes it sent from the first create on (`wasmop_api_writes_total{result="sent"}`),
    /// by resource (`deployments`, `memcacheds/status`, `events` …).
    pub writes: BTreeMap<String, f64>,
}

impl Replica {
    /// Every write it sent from the first create on.
    pub fn all_writes(&self) -> f64 {
        self.writes.values().sum()
    }
}

/// A replica SIGKILLed, and its shards taken over.
#[derive(Debug, Clone)]
pub struct Failover {
    /// The replica killed.
    pub pod: String,
    /// Its shards.
    pub shards: usize,
    /// SIGKILL → every one of its shard Leases held by another replica.
    pub leases_moved: Duration,
    /// Parents in its shards whose `spec.size` was patched right after the SIGKILL.
    pub patched: usize,
    /// SIGKILL → every patched parent's status written for its new generation.
    pub reconciled: Duration,
}

/// One replica count.
#[derive(Debug, Clone)]
pub struct ShardRun {
    /// Replicas.
    pub replicas: Vec<Replica>,
    /// Parents.
    pub parents: usize,
    /// From the first create.
    pub convergence: Convergence,
    /// The last replica started → the shards shared evenly.
    pub shared_after: Duration,
    /// With three replicas.
    pub failover: Option<Failover>,
}

/// The sharding part: the parents, and each replica count's run (or why it failed).
#[derive(Debug, Clone)]
pub struct Sharding {
    /// Parents.
    pub parents: usize,
    /// Each replica's `--concurrency`.
    pub concurrency: usize,
    /// Per replica count, in [`REPLICAS`] order.
    pub runs: Vec<(usize, Result<ShardRun, String>)>,
}

/// Runs `replicas` replicas, each reconciling `concurrency` parents at once, over `parents`
/// parents on a fresh plane, stopped afterwards.
pub async fn measure(
    art: &Artifacts,
    parents: usize,
    replicas: usize,
    concurrency: usize,
) -> Result<ShardRun> {
    let tag = format!("shards{replicas}");
    note!("[{tag}] {replicas} replica(s): starting a control plane with sharded watches");
    let env = TestEnv::start_with_feature_gates(&["ShardedListAndWatch=true"])
        .await
        .context("starting the control plane with ShardedListAndWatch")?;
    let result = run(art, &env, parents, replicas, concurrency, &tag).await;
    if let Err(e) = env.stop().await {
        note!("[{tag}] stopping the control plane: {e}");
    }
    result
}

async fn run(
    art: &Artifacts,
    env: &TestEnv,
    n: usize,
    replicas: usize,
    concurrency: usize,
    tag: &str,
) -> Result<ShardRun> {
    let client = env.client().await?;
    let kind = Kind::memcached();
    cluster::install_crds(&client, std::slice::from_ref(&kind)).await?;
    let by_shard = namespaces();
    let flat: Vec<String> = by_shard.iter().flatten().cloned().collect();
    cluster::create_namespaces(&client, &flat).await?;
    cluster::create_namespaces(&client, &[PLUGIN_NAMESPACE.to_owned()]).await?;
    // The first create of a kind is slow on a fresh apiserver; not the replicas' doing.
    cluster::warm_up(&client, std::slice::from_ref(&kind), &flat[0]).await?;
    // Cluster-wide rights, as `wasmop rbac` prints them without --watch-namespace.
    contestants::grant_plugin(&client, "memcached", &art.memcached).await?;
    contestants::put_plugin(&client, "memcached", &art.memcached).await?;

    let settings = Settings {
        concurrency,
        resync: Duration::from_secs(10),
        limits: None,
    };
    let args = [
        "--shards".to_owned(),
        SHARDS.to_string(),
        "--lease-duration-seconds".to_owned(),
        LEASE_SECONDS.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let pods: Vec<String> = (0..replicas).map(|i| format!("wasmop-{i}")).collect();
    let mut procs = Vec::new();
    let mut metrics = Vec::new();
    for pod in &pods {
        let (mut p, addr) =
            contestants::spawn_replica(art, env, &settings, tag, pod, &args).await?;
        contestants::wait_loaded(&mut p, &["memcached".to_owned()]).await?;
        procs.push(p);
        metrics.push(addr);
    }
    let started = Instant::now();
    let holders = wait_shared(&client, &pods, &mut procs).await?;
    let shared_after = started.elapsed();
    note!(
        "[{tag}] {replicas} replica(s) share the {SHARDS} shards after {:.1} s",
        shared_after.as_secs_f64()
    );

    let crs = plan(&by_shard, n);
    let tracker = Tracker::start(&client, std::slice::from_ref(&kind)).await?;
    // One client per namespace, connected before the clock starts.
    let clients = futures::future::try_join_all(flat.iter().map(|_| env.client())).await?;
    let mut at_start = Vec::new();
    let mut writes_before = Vec::new();
    for (p, addr) in procs.iter().zip(&metrics) {
        at_start.push(p.usage()?);
        writes_before.push(writes_sent(addr).await?);
    }
    note!(
        "[{tag}] {replicas} replica(s): creating {n} parents in {} namespaces",
        flat.len()
    );
    let start = Instant::now();
    cluster::create_all(&clients, std::slice::from_ref(&kind), &crs).await?;
    let timeout = Duration::from_secs(180) + Duration::from_millis(200) * n as u32;
    let convergence = tracker.wait(&crs, start, timeout, &mut procs).await?;
    note!(
        "[{tag}] {replicas} replica(s): converged in {:.1} s",
        convergence.converged.as_secs_f64()
    );
    tokio::time::sleep(SETTLE).await;
    let mut measured = Vec::new();
    for (i, (p, addr)) in procs.iter_mut().zip(&metrics).enumerate() {
        p.check_alive()?;
        let stats = contestants::cache_stats(addr).await?;
        let cached = stats
            .iter()
            .filter(|(k, _, _)| k.starts_with("Memcached."))
            .map(|(_, objects, _)| objects)
            .sum();
        measured.push(Replica {
            pod: pods[i].clone(),
            shards: holders.values().filter(|h| **h == pods[i]).count(),
            cached,
            cached_all: stats.iter().map(|(_, objects, _)| objects).sum(),
            cache_bytes: stats.iter().map(|(_, _, bytes)| bytes).sum(),
            at_start: at_start[i],
            at_converged: p.usage()?,
            writes: writes_sent(addr)
                .await?
                .into_iter()
                .map(|(resource, n)| {
                    let before = writes_before[i].get(&resource).copied().unwrap_or(0.0);
                    (resource, n - before)
                })
                .collect(),
        });
    }
    let failover = if replicas == 3 {
        Some(failover(&client, &crs, &holders, &pods, &mut procs, tag).await?)
    } else {
        None
    };
    Ok(ShardRun {
        replicas: measured,
        parents: n,
        convergence,
        shared_after,
        failover,
    })
}

/// SIGKILLs the first replica, changes [`FAILOVER_PARENTS`] of its parents at once, and
/// times its shards' move and the change's reconcile.
async fn failover(
    client: &Client,
    crs: &[Cr],
    holders: &BTreeMap<u32, String>,
    pods: &[String],
    procs: &mut Vec<Proc>,
    tag: &str,
) -> Result<Failover> {
    let victim = pods[0].clone();
    let dead: Vec<Shard> = holders
        .iter()
        .filter(|(_, h)| **h == victim)
        .filter_map(|(i, _)| Shard::new(*i, SHARDS))
        .collect();
    let orphans: Vec<&Cr> = crs
        .iter()
        .filter(|cr| dead.iter().any(|s| s.holds(&cr.namespace)))
        .take(FAILOVER_PARENTS)
        .collect();
    if orphans.is_empty() {
        bail!("{victim} held no parents to change");
    }
    note!(
        "[{tag}] SIGKILL {victim} ({} shards); changing {} of its parents",
        dead.len(),
        orphans.len()
    );
    let ar = Kind::memcached().api_resource();
    let killed = Instant::now();
    // A Proc's drop is a SIGKILL, then a wait: no shutdown, no Lease given back.
    drop(procs.remove(0));
    // Changed at once: the change waits for whoever takes the shard over.
    for cr in &orphans {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &cr.namespace, &ar);
        api.patch(
            &cr.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .with_context(|| format!("changing {}/{}", cr.namespace, cr.name))?;
    }
    let (mut leases_moved, mut reconciled) = (None, None);
    loop {
        if leases_moved.is_none() {
            let now = shard_holders(client).await?;
            if dead
                .iter()
                .all(|s| now.get(&s.index()).is_some_and(|h| *h != victim))
            {
                leases_moved = Some(killed.elapsed());
            }
        }
        if reconciled.is_none() {
            let mut all = true;
            for cr in &orphans {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &cr.namespace, &ar);
                all &= status_current(&api.get(&cr.name).await?);
            }
            if all {
                reconciled = Some(killed.elapsed());
            }
        }
        if let (Some(leases_moved), Some(reconciled)) = (leases_moved, reconciled) {
            note!(
                "[{tag}] failover: Leases moved after {:.1} s, parents reconciled after {:.1} s",
                leases_moved.as_secs_f64(),
                reconciled.as_secs_f64()
            );
            return Ok(Failover {
                pod: victim,
                shards: dead.len(),
                leases_moved,
                patched: orphans.len(),
                reconciled,
            });
        }
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        if killed.elapsed() > SHARING_TIMEOUT {
            bail!(
                "failover: after {SHARING_TIMEOUT:?}, Leases moved: {}, parents reconciled: {}",
                leases_moved.is_some(),
                reconciled.is_some()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a parent's last status was written for its current spec.
fn status_current(obj: &DynamicObject) -> bool {
    let generation = obj.metadata.generation.unwrap_or(-1);
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["observedGeneration"] == generation))
}

/// Waits until `pods` hold every shard, as evenly as can be, and nobody else holds one.
async fn wait_shared(
    client: &Client,
    pods: &[String],
    procs: &mut [Proc],
) -> Result<BTreeMap<u32, String>> {
    let start = Instant::now();
    loop {
        let holders = shard_holders(client).await?;
        let held = |p: &String| holders.values().filter(|h| *h == p).count();
        let (most, least) = (pods.iter().map(held).max(), pods.iter().map(held).min());
        let even = most.zip(least).is_some_and(|(m, l)| l > 0 && m - l <= 1);
        let only = holders.values().all(|h| pods.contains(h));
        if holders.len() == SHARDS as usize && even && only {
            return Ok(holders);
        }
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        if start.elapsed() > SHARING_TIMEOUT {
            bail!("the replicas did not share the shards within {SHARING_TIMEOUT:?}: {holders:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The holder of each shard Lease in the host namespace: index → `POD_NAME`.
async fn shard_holders(client: &Client) -> Result<BTreeMap<u32, String>> {
    let prefix = wasmop::config::SHARD_LEASE_PREFIX;
    Ok(keeper::holders(client, PLUGIN_NAMESPACE, prefix)
        .await
        .context("listing the shard Leases")?
        .into_iter()
        .filter(|(shard, _)| shard.count() == SHARDS)
        .map(|(shard, holder)| (shard.index(), holder))
        .collect())
}

/// The writes the host at `addr` has sent (`wasmop_api_writes_total{result="sent"}`), by
/// resource.
async fn writes_sent(addr: &str) -> Result<BTreeMap<String, f64>> {
    let text = contestants::metric_text(addr).await?;
    let mut by = BTreeMap::new();
    for line in text.lines() {
        if !line.starts_with("wasmop_api_writes_total{") || !line.contains("result=\"sent\"") {
            continue;
        }
        let resource = line
            .split("resource=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("other");
        let n = contestants::counter_sum(line, "wasmop_api_writes_total{");
        *by.entry(resource.to_owned()).or_insert(0.0) += n;
    }
    Ok(by)
}

/// [`NAMESPACES`] names by shard, 2 or 3 in each of the [`SHARDS`]. FNV-1a barely moves its
/// top bits when only a name's last character or two differ (`ns-0`..`ns-29` land in one
/// shard), so each name ends in eight hex digits of a mixed counter, and one is kept only
/// while its shard is short of its share.
pub fn namespaces() -> Vec<Vec<String>> {
    let shards = Shard::all(SHARDS);
    let count = SHARDS as usize;
    let share = |s: usize| NAMESPACES / count + usize::from(s < NAMESPACES % count);
    let mut by_shard = vec![Vec::new(); count];
    let mut k: u64 = 0;
    while by_shard.iter().map(Vec::len).sum::<usize>() < NAMESPACES {
        k += 1;
        let mixed = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32;
        let name = format!("bench-{mixed:08x}");
        let Some(s) = shards.iter().position(|s| s.holds(&name)) else {
            continue;
        };
        if by_shard[s].len() < share(s) {
            by_shard[s].push(name);
        }
    }
    by_shard
}

/// `n` parents of size 1, dealt evenly over the shards (so each replica's share of parents
/// follows its share of shards) and within a shard over its namespaces.
fn plan(by_shard: &[Vec<String>], n: usize) -> Vec<Cr> {
    let mut first = 0;
    let offsets: Vec<usize> = by_shard
        .iter()
        .map(|names| {
            let at = first;
            first += names.len();
            at
        })
        .collect();
    (0..n)
        .map(|i| {
            let s = i % by_shard.len();
            let j = (i / by_shard.len()) % by_shard[s].len();
            Cr {
                kind: 0,
                ns_index: offsets[s] + j,
                namespace: by_shard[s][j].clone(),
                name: format!("mc-{i}"),
                size: 1,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_spread_over_every_shard() {
        let by_shard = namespaces();
        assert_eq!(by_shard.iter().map(Vec::len).sum::<usize>(), NAMESPACES);
        for (i, names) in by_shard.iter().enumerate() {
            assert!((2..=3).contains(&names.len()), "shard {i}: {names:?}");
            let shard = Shard::new(i as u32, SHARDS).unwrap();
            assert!(names.iter().all(|n| shard.holds(n)), "shard {i}: {names:?}");
        }
    }

    #[test]
    fn parents_are_dealt_evenly_over_the_shards() {
        let by_shard = namespaces();
        let crs = plan(&by_shard, 3000);
        for shard in Shard::all(SHARDS) {
            let n = crs.iter().filter(|c| shard.holds(&c.namespace)).count();
            assert_eq!(n, 250, "shard {shard}");
        }
        let flat: Vec<&String> = by_shard.iter().flatten().collect();
        assert!(crs.iter().all(|c| *flat[c.ns_index] == c.namespace));
    }
}
