//! The plane's own cost of the writes the operators make, with no operator running: the Go
//! operator creates each Deployment with a POST and writes status with a PUT; wasmop and the
//! native controller use server-side apply for both. On a fresh plane, `n` of each at the
//! run's concurrency: the wall time and the CPU of kube-apiserver and etcd. What separates
//! the first apply of a child from a create is the plane's, not the operator's.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::{Part, TestEnv};
use tokio::time::Instant;

use crate::cluster;
use crate::kinds::Kind;
use crate::process::Usage;

/// One kind of write, `n` times.
#[derive(Debug, Clone)]
pub struct Floor {
    /// What was written, and how.
    pub what: &'static str,
    /// How many.
    pub n: usize,
    /// Wall time for all of them.
    pub took: Duration,
    /// CPU of kube-apiserver and etcd meanwhile, in seconds.
    pub plane_cpu: f64,
}

/// Measures each write `n` times on a fresh plane, `concurrency` at a time.
pub async fn measure(n: usize, concurrency: usize) -> Result<Vec<Floor>> {
    let env = TestEnv::start()
        .await
        .context("starting the control plane")?;
    let result = run(&env, n, concurrency).await;
    if let Err(e) = env.stop().await {
        note!("[floor] stopping the control plane: {e}");
    }
    result
}

/// Where the POSTs and PUTs go, and where the applies go.
const POST_NS: &str = "floor-post";
const APPLY_NS: &str = "floor-apply";

async fn run(env: &TestEnv, n: usize, concurrency: usize) -> Result<Vec<Floor>> {
    let client = env.client().await?;
    let kind = Kind::memcached();
    cluster::install_crds(&client, std::slice::from_ref(&kind)).await?;
    cluster::create_namespaces(&client, &[POST_NS.to_owned(), APPLY_NS.to_owned()]).await?;
    let deployments =
        |ns: &str| Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), ns);
    let parents = |ns: &str| -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), ns, &kind.api_resource())
    };
    // The parents whose status is written, made before anything is measured.
    for ns in [POST_NS, APPLY_NS] {
        let api = parents(ns);
        each(n, concurrency, |i| {
            let api = api.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                    "metadata": {"name": format!("mc-{i}")}, "spec": {"size": 1},
                }))?;
                api.create(&PostParams::default(), &obj).await?;
                Ok(())
            }
        })
        .await?;
    }
    let mut out = Vec::new();

    let api = deployments(POST_NS);
    out.push(
        timed(env, n, concurrency, "Deployment, POST (Go)", |i| {
            let api = api.clone();
            async move {
                let d = serde_json::from_value(deployment(i, POST_NS))?;
                api.create(&PostParams::default(), &d).await?;
                Ok(())
            }
        })
        .await?,
    );
    let api = deployments(APPLY_NS);
    out.push(
        timed(
            env,
            n,
            concurrency,
            "Deployment, server-side apply (wasmop, kube-rs)",
            |i| {
                let api = api.clone();
                async move {
                    let d = deployment(i, APPLY_NS);
                    let pp = PatchParams::apply("wasmop/memcached").force();
                    api.patch(&format!("mc-{i}"), &pp, &Patch::Apply(&d))
                        .await?;
                    Ok(())
                }
            },
        )
        .await?,
    );
    let api = parents(POST_NS);
    // The Go operator PUTs the object its cache holds: read once, before the clock.
    let mut listed: Vec<DynamicObject> = api.list(&Default::default()).await?.items;
    listed.sort_by_key(|o| {
        let name = o.metadata.name.as_deref().unwrap_or_default();
        name.trim_start_matches("mc-")
            .parse::<usize>()
            .unwrap_or(usize::MAX)
    });
    anyhow::ensure!(
        listed.len() == n,
        "{} parents listed, not {n}",
        listed.len()
    );
    let listed = &listed;
    out.push(
        timed(env, n, concurrency, "status, PUT (Go)", |i| {
            let api = api.clone();
            let mut obj = listed[i].clone();
            async move {
                let name = format!("mc-{i}");
                obj.data["status"] = status(i);
                api.replace_status(&name, &PostParams::default(), &obj)
                    .await?;
                Ok(())
            }
        })
        .await?,
    );
    let api = parents(APPLY_NS);
    out.push(
        timed(
            env,
            n,
            concurrency,
            "status, server-side apply (wasmop, kube-rs)",
            |i| {
                let api = api.clone();
                async move {
                    let patch = json!({
                        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                        "status": status(i),
                    });
                    let pp = PatchParams::apply("wasmop/memcached").force();
                    api.patch_status(&format!("mc-{i}"), &pp, &Patch::Apply(&patch))
                        .await?;
                    Ok(())
                }
            },
        )
        .await?,
    );
    Ok(out)
}

/// The Memcached plugin's Deployment for parent `mc-<i>`, size 1.
fn deployment(i: usize, ns: &str) -> Value {
    let name = format!("mc-{i}");
    let labels = json!({"app": "memcached", "memcached_cr": name});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "memcached", "image": "memcached:1.4.36-alpine",
                "command": ["memcached", "-m=64", "-o", "modern", "-v"],
                "ports": [{"name": "memcached", "containerPort": 11211}]}]},
        }},
    })
}

fn status(i: usize) -> Value {
    json!({"nodes": [format!("mc-{i}-pod")]})
}

/// Runs `f(0..n)`, `concurrency` at a time.
async fn each<F, Fut>(n: usize, concurrency: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut all = futures::stream::iter(0..n)
        .map(f)
        .buffer_unordered(concurrency.max(1));
    while let Some(done) = all.next().await {
        done?;
    }
    Ok(())
}

/// The apiserver's and etcd's CPU per second below which the plane counts as at rest.
const QUIET_CPU: f64 = 0.15;
/// The longest wait for the plane to come to rest before a measurement.
const SETTLE_AT_MOST: Duration = Duration::from_secs(120);

/// Times `f(0..n)`, `concurrency` at a time, and the apiserver's and etcd's CPU meanwhile,
/// once the plane is at rest.
async fn timed<F, Fut>(
    env: &TestEnv,
    n: usize,
    concurrency: usize,
    what: &'static str,
    f: F,
) -> Result<Floor>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let cpu = || -> f64 {
        env.processes()
            .iter()
            .filter(|(name, _)| [Part::Apiserver.name(), Part::Etcd.name()].contains(name))
            .filter_map(|(_, pid)| Usage::of(*pid).ok())
            .map(|u| u.cpu_secs)
            .sum()
    };
    // The plane first finishes what the writes before caused (ReplicaSets, pods), so each
    // kind of write is charged only with its own.
    let mut quiet_for = 0;
    let settling = Instant::now();
    while quiet_for < 3 && settling.elapsed() < SETTLE_AT_MOST {
        let before = cpu();
        tokio::time::sleep(Duration::from_secs(1)).await;
        quiet_for = if cpu() - before < QUIET_CPU {
            quiet_for + 1
        } else {
            0
        };
    }
    let (cpu0, start) = (cpu(), Instant::now());
    each(n, concurrency, f)
        .await
        .with_context(|| format!("writing: {what}"))?;
    Ok(Floor {
        what,
        n,
        took: start.elapsed(),
        plane_cpu: cpu() - cpu0,
    })
}
