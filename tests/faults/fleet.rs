//! A fleet of Memcached parents and the checks every fault test ends with: each parent has
//! exactly one Deployment, controlled by it alone, wanting its size; no Deployment is left
//! without its parent; `size` of its pods run; `status.nodes` names exactly its pods and its
//! `Available` condition is true for the current generation.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use support::{Env, Host, http_get};

/// Parents per fault test.
pub const PARENTS: usize = 200;

/// Generous: a few hundred pods come and go on two shared cores.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(300);

/// The name of parent `i`.
pub fn name(i: usize) -> String {
    format!("m{i:03}")
}

/// The Memcached plugin's module.
pub fn memcached_wasm() -> Vec<u8> {
    test_artifacts::read(test_artifacts::MEMCACHED)
}

/// A namespace named after `test` with the Memcached plugin granted and loaded, a host on it,
/// and `n` parents converged at size 1.
pub async fn memcached_fleet(test: &str, n: usize) -> (Env, Host) {
    let env = Env::new(test).await;
    env.put_plugin("memcached", &memcached_wasm(), None).await;
    let host = env.start_host();
    scale(&env, n, 1).await;
    converged(&env, n, 1, &host).await;
    (env, host)
}

/// Creates or scales parents `0..n` to `size`, 16 requests at a time.
pub async fn scale(env: &Env, n: usize, size: i64) {
    let api = env.memcacheds();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let obj = json!({
                    "apiVersion": "cache.example.com/v1alpha1",
                    "kind": "Memcached",
                    "metadata": {"name": name(i)},
                    "spec": {"size": size},
                });
                api.patch(&name(i), &PatchParams::apply("faults"), &Patch::Apply(&obj))
                    .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("parents applied");
}

/// What is wrong with the fleet now, if anything (the first few problems).
pub async fn problems(env: &Env, n: usize, size: i64) -> Result<Vec<String>, kube::Error> {
    let parents = env.memcacheds().list(&ListParams::default()).await?.items;
    let deployments = env
        .ns
        .api::<Deployment>()
        .list(&ListParams::default())
        .await?
        .items;
    let pods = env
        .ns
        .api::<Pod>()
        .list(&ListParams::default())
        .await?
        .items;
    let mut problems = Vec::new();
    if parents.len() != n {
        problems.push(format!("{} parents, expected {n}", parents.len()));
    }
    let uids: HashMap<String, String> = parents
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
            )
        })
        .collect();
    // Every pod of a parent, and those of them running and not being deleted. (kwok, which
    // plays the kubelet, can miss a deletion across an etcd restart and leave a pod
    // terminating for good; the plugin then rightly still lists it.)
    let mut pods_of: HashMap<String, HashSet<String>> = HashMap::new();
    let mut live_of: HashMap<String, usize> = HashMap::new();
    for pod in &pods {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let Some(cr) = labels.get("memcached_cr") else {
            continue;
        };
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        pods_of
            .entry(cr.clone())
            .or_default()
            .insert(pod.metadata.name.clone().unwrap_or_default());
        if running && pod.metadata.deletion_timestamp.is_none() {
            *live_of.entry(cr.clone()).or_default() += 1;
        }
    }
    let mut seen = HashSet::new();
    for d in &deployments {
        let dname = d.metadata.name.clone().unwrap_or_default();
        let owners: Vec<_> = d
            .metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.controller == Some(true))
            .collect();
        match (owners.as_slice(), uids.get(&dname)) {
            ([o], Some(uid)) if &o.uid == uid => {}
            _ => problems.push(format!(
                "Deployment {dname} is orphaned or wrongly owned: {owners:?}"
            )),
        }
        if d.spec.replicas != Some(size as i32) {
            problems.push(format!(
                "Deployment {dname} wants {:?} replicas, expected {size}",
                d.spec.replicas
            ));
        }
        seen.insert(dname);
    }
    for p in &parents {
        let pname = p.metadata.name.clone().unwrap_or_default();
        if !seen.contains(&pname) {
            problems.push(format!("Memcached {pname} has no Deployment"));
        }
        let nodes: HashSet<String> = p.data["status"]["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let actual = pods_of.get(&pname).cloned().unwrap_or_default();
        if nodes != actual {
            problems.push(format!(
                "Memcached {pname}: status.nodes {nodes:?}, its pods {actual:?}"
            ));
        }
        // The status is final only once it says so: a host stopped before the Deployment's
        // availability reached it leaves the next one a status to write.
        let available = p.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Available"
                    && c["status"] == "True"
                    && c["observedGeneration"].as_i64() == p.metadata.generation
            });
        if !available {
            problems.push(format!("Memcached {pname}: not Available yet"));
        }
        let live = live_of.get(&pname).copied().unwrap_or_default();
        if live != size as usize {
            problems.push(format!(
                "Memcached {pname}: {live} pods running, expected {size}"
            ));
        }
    }
    problems.truncate(5);
    Ok(problems)
}

/// Waits until the fleet is whole at `size`; returns how long that took.
pub async fn converged(env: &Env, n: usize, size: i64, host: &Host) -> Duration {
    let started = Instant::now();
    let deadline = started + CONVERGE_TIMEOUT;
    loop {
        let last = problems(env, n, size).await;
        if matches!(&last, Ok(p) if p.is_empty()) {
            return started.elapsed();
        }
        if Instant::now() > deadline {
            let log = host.logs();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "the fleet did not converge to size {size} in {CONVERGE_TIMEOUT:?}: {last:?}\nhost log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A counter of the host's `/metrics`, summed over the series that have every label of
/// `labels`.
pub async fn counter(host: &Host, metric: &str, labels: &[(&str, &str)]) -> u64 {
    let (_, text) = http_get(&host.http_addr().await, "/metrics").await;
    testenv::metrics::samples(&text, metric)
        .iter()
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value as u64)
        .sum()
}

/// Writes the host sent and the API server answered, to `resource` (`deployments`,
/// `memcacheds/status`; "" for all).
pub async fn writes(host: &Host, resource: &str) -> u64 {
    let mut labels = vec![("result", "sent")];
    if !resource.is_empty() {
        labels.push(("resource", resource));
    }
    counter(host, "wasmop_api_writes_total", &labels).await
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`, `TERM`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// One line of the reliability table, for `docs/reliability.md`.
pub fn measured(fault: &str, converge: Duration, writes: u64, note: &str) {
    println!(
        "measured: fault={fault:?} converge_s={:.1} writes={writes} {note}",
        converge.as_secs_f64()
    );
}
