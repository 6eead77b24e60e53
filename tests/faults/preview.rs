//! A preview over a fleet: the new revision runs for every parent against live state and writes
//! nothing, counted by the API server itself (`apiserver_request_total`, which needs this
//! binary's quiet plane); its diff names the right fields; promoting it converges.
//!
//! `WASMOP_PREVIEW_PARENTS` sets the fleet's size (default 100) for the numbers in
//! `docs/benchmarks.md`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use wasmop::plugin::revision::{Phase, Revisions};
use wasmop::plugin::rollout::STRATEGY_ANNOTATION;

use crate::fleet::{self, CONVERGE_TIMEOUT, memcached_fleet};
use crate::serial;
use support::{TIMEOUT, wait_event};

const IMAGE: &str = "memcached:1.6.38";

/// Writes the API server served (not dry runs) to the objects the plugin touches: parents, their
/// status, Deployments (not their status, the Deployment controller's) and Services.
fn real_writes(metrics: &str) -> f64 {
    count(metrics, "")
}

/// Dry-run writes to Deployments.
fn dry_runs(metrics: &str) -> f64 {
    count(metrics, "All")
}

fn count(metrics: &str, dry_run: &str) -> f64 {
    testenv::metrics::samples(metrics, "apiserver_request_total")
        .iter()
        .filter(|s| {
            let l = |k: &str| s.labels.get(k).map(String::as_str).unwrap_or_default();
            matches!(l("verb"), "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE")
                && l("dry_run") == dry_run
                && match l("resource") {
                    "memcacheds" | "services" => true,
                    "deployments" => l("subresource").is_empty(),
                    _ => false,
                }
        })
        .map(|s| s.value)
        .sum()
}

/// User and system CPU of process `pid` so far, from `/proc` (at 100 ticks a second).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command, which is in parentheses and may hold spaces: the state
    // first, then utime and stime as the 12th and 13th after it.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((tick(11) + tick(12)) * 10)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preview_writes_nothing_shows_each_diff_and_promotes() {
    let _turn = serial().await;
    let n: usize = std::env::var("WASMOP_PREVIEW_PARENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (env, host) = memcached_fleet("preview", n).await;
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    env.grant("memcached", &v2, &[]).await;
    // Let the fleet's last status writes land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = testenv::metrics::metrics_text(&env.client).await.unwrap();
    let cpu_before = cpu(host.pid());

    // The second build, with new settings, previewed.
    let mut cm: ConfigMap = wasmop::plugin::package::package(
        &v2,
        "memcached",
        env.name(),
        Some(format!("image: {IMAGE}\n")),
    )
    .expect("a plugin ConfigMap")
    .configmap;
    cm.metadata.annotations = Some(BTreeMap::from([(
        STRATEGY_ANNOTATION.to_owned(),
        "preview".to_owned(),
    )]));
    let started = Instant::now();
    let configmaps: Api<ConfigMap> = env.ns.api();
    configmaps
        .patch(
            "memcached",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cm),
        )
        .await
        .unwrap();
    let event = wait_event(&env, "ConfigMap", "memcached", "Previewed").await;
    let complete = started.elapsed();
    let cpu_used = cpu(host.pid()).saturating_sub(cpu_before);
    let note = event.message.unwrap_or_default();
    assert!(
        note.contains(&format!(
            "{n} of {n} parents previewed: {n} would change (children: {n} created, {n} changed, 0 deleted, 0 refused;"
        )),
        "{note}"
    );
    let after = testenv::metrics::metrics_text(&env.client).await.unwrap();
    let (writes, dry) = (
        real_writes(&after) - real_writes(&before),
        dry_runs(&after) - dry_runs(&before),
    );
    println!(
        "measured: preview of {n} parents complete {complete:?} after the ConfigMap update, host CPU {cpu_used:?}, {writes} writes, {dry} dry runs"
    );
    assert_eq!(writes, 0.0, "a preview writes no parent and no child");
    assert!(
        dry >= 2.0 * n as f64,
        "each Deployment and Service dry-run: {dry}"
    );

    // The diff names each parent's changes.
    let (ok, diff) = env.wasmop(&["rollout", "diff", "memcached"]);
    assert!(ok, "{diff}");
    let ns = env.name();
    let first = fleet::name(0);
    let expected = format!(
        "Memcached {ns}/{first}:\n  Deployment {ns}/{first} would change:\n    spec.template.spec.containers[0].image: \"memcached:1.4.36-alpine\" → \"{IMAGE}\"\n  Service {ns}/{first} would be created\n"
    );
    assert!(diff.contains(&expected), "expected\n{expected}\nin\n{diff}");
    // A big fleet's diff is cut to what a revision's annotations can hold, and says so.
    let left_out: usize = diff
        .split_once("… and ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert_eq!(
        diff.matches(" would be created\n").count() + left_out,
        n,
        "{diff}"
    );

    // It stays current: a parent deleted leaves the preview.
    env.memcacheds()
        .delete(&fleet::name(n - 1), &Default::default())
        .await
        .unwrap();
    let client = Revisions::new(env.client.clone(), env.name());
    let m = n - 1;
    testenv::wait_until(
        "the preview to drop the deleted parent",
        TIMEOUT,
        || async { client.list("memcached").await.map_err(|e| e.to_string()) },
        |all| {
            all.iter().any(|r| {
                r.preview
                    .as_ref()
                    .is_some_and(|(s, _)| s.starts_with(&format!("{m} of {m} parents")))
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));

    // Promoted, it converges.
    let (ok, out) = env.wasmop(&["rollout", "promote", "memcached"]);
    assert!(ok, "{out}");
    let promoted = Instant::now();
    let deployments = env.ns.api::<Deployment>();
    let services = env.ns.api::<Service>();
    testenv::wait_until(
        "every parent on the promoted revision",
        CONVERGE_TIMEOUT,
        || async {
            let d = deployments.list(&ListParams::default()).await?.items;
            let s = services.list(&ListParams::default()).await?.items;
            Ok::<_, kube::Error>((
                d.iter()
                    .filter(|d| {
                        d.spec
                            .template
                            .spec
                            .as_ref()
                            .and_then(|s| s.containers[0].image.as_deref())
                            == Some(IMAGE)
                    })
                    .count(),
                s.len(),
            ))
        },
        |(d, s)| *d == m && *s == m,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    println!(
        "measured: promoted preview converged {m} parents in {:?}",
        promoted.elapsed()
    );
    testenv::wait_until(
        "revision 2 live and revision 1 retired",
        TIMEOUT,
        || async { client.list("memcached").await.map_err(|e| e.to_string()) },
        |all| {
            all.iter().map(|r| (r.number, r.phase)).collect::<Vec<_>>()
                == [(1, Phase::Retired), (2, Phase::Live)]
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
}
