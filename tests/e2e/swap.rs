//! Hot-swap: a new plugin version in the ConfigMap takes over with no restart.

use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};

use support::{Env, TIMEOUT};

async fn services(env: &Env) -> Vec<String> {
    let list = env
        .ns
        .api::<Service>()
        .list(&Default::default())
        .await
        .unwrap();
    let mut names: Vec<String> = list
        .items
        .into_iter()
        .map(|s| s.metadata.name.unwrap())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_swap_to_second_build_and_back() {
    let env = Env::new("e2e-swap").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    // Rights for both versions (v2's are v1's and Services): going back to v1 prunes the
    // Services v2 made, which needs `delete` on them.
    env.grant("memcached", &v2, &[]).await;
    env.put_plugin_only("memcached", &v1, None).await;
    let mut host = env.start_host();
    let pid = host.pid();
    for name in ["one", "two"] {
        env.put_memcached(name, 1).await;
    }
    for name in ["one", "two"] {
        env.wait_nodes(name, 1).await;
    }
    assert!(
        services(&env).await.is_empty(),
        "the first build makes no Service"
    );

    // Swap in the second build: each CR gets its headless Service.
    let swapped = Instant::now();
    env.put_plugin_only("memcached", &v2, None).await;
    testenv::wait_until(
        "the second build to give every Memcached a Service",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(services(&env).await) },
        |names| names == &["one", "two"],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    println!(
        "measured: hot-swap (ConfigMap updated → Services of 2 parents exist) in {:?}",
        swapped.elapsed()
    );
    assert!(host.alive() && host.pid() == pid, "same host process");
    let svc = env.ns.api::<Service>().get("one").await.unwrap();
    assert_eq!(
        svc.spec.unwrap().cluster_ip.as_deref(),
        Some("None"),
        "headless"
    );

    // And back: the Services are pruned.
    env.put_plugin_only("memcached", &v1, None).await;
    testenv::wait_until(
        "the first build to prune the Services",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(services(&env).await) },
        |names| names.is_empty(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    assert!(host.alive() && host.pid() == pid, "same host process");

    // New settings with the same module: swapped in place, every parent reconciled again.
    env.put_plugin_only("memcached", &v1, Some("image: memcached:1.6.38\n"))
        .await;
    let deployments = env.ns.api::<Deployment>();
    for name in ["one", "two"] {
        testenv::wait_until(
            &format!("Deployment {name} to run the image from the new settings"),
            TIMEOUT,
            || async { deployments.get(name).await.map(|d| d.spec.template.spec) },
            |spec| {
                spec.as_ref().and_then(|s| s.containers[0].image.as_deref())
                    == Some("memcached:1.6.38")
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    }
    assert!(
        host.logs()
            .contains("plugin swapped; reconciling every parent")
    );
    assert!(host.alive() && host.pid() == pid, "same host process");

    // Each change has its own Event naming the version now running and the one it replaced,
    // in order, as `kubectl describe configmap` shows them (regression: a second `Loaded`
    // used to be folded into the first, keeping its note, 0.1.0).
    let kinds_changed = "its kinds changed";
    let expected: [(&[&str], Option<&str>); 4] = [
        (&["Loaded", "loaded memcached 0.1.0 (sha256:"], None),
        (
            &[
                "Swapped",
                "swapped in memcached 0.2.0 (sha256:",
                "replacing memcached 0.1.0 (sha256:",
                kinds_changed,
            ],
            None,
        ),
        (
            &[
                "Swapped",
                "swapped in memcached 0.1.0 (sha256:",
                "replacing memcached 0.2.0 (sha256:",
                kinds_changed,
            ],
            None,
        ),
        (
            &[
                "Swapped",
                "swapped in memcached 0.1.0 (sha256:",
                "replacing memcached 0.1.0 (sha256:",
            ],
            Some(kinds_changed),
        ),
    ];
    let kubectl = testenv::binaries::ensure().await.unwrap().kubectl;
    testenv::wait_for(
        "kubectl describe configmap to list Loaded, then three Swapped Events",
        TIMEOUT,
        || async {
            let out = std::process::Command::new(&kubectl)
                .args(["-n", env.name(), "describe", "configmap", "memcached"])
                .env("KUBECONFIG", &env.kubeconfig)
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let events: Vec<&str> = text
                .lines()
                .skip_while(|l| !l.starts_with("Events:"))
                .filter(|l| l.contains("Loaded") || l.contains("Swapped"))
                .collect();
            Ok::<_, String>(in_order(&events, &expected).then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
}

/// Whether `lines` match `expected` one for one, in order: each line holds its parts in order
/// and not the forbidden text.
fn in_order(lines: &[&str], expected: &[(&[&str], Option<&str>)]) -> bool {
    let matches = |line: &str, (parts, forbidden): &(&[&str], Option<&str>)| {
        let mut rest = line;
        parts.iter().all(|p| match rest.find(p) {
            Some(i) => {
                rest = &rest[i + p.len()..];
                true
            }
            None => false,
        }) && forbidden.is_none_or(|f| !line.contains(f))
    };
    lines.len() == expected.len() && lines.iter().zip(expected).all(|(l, e)| matches(l, e))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kind_dropped_while_the_host_was_down_is_still_pruned() {
    let env = Env::new("e2e-ledger").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    env.grant("memcached", &v2, &[]).await;
    env.put_plugin_only("memcached", &v2, None).await;
    let host = env.start_host();
    env.put_memcached("one", 1).await;
    testenv::wait_until(
        "the second build to give Memcached one a Service",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(services(&env).await) },
        |names| names == &["one"],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    // The record in the host's namespace names both child kinds.
    let ledger = env
        .ns
        .api::<ConfigMap>()
        .get("wasmop-child-kinds")
        .await
        .unwrap();
    let recorded = ledger.data.unwrap().remove("memcached").unwrap();
    assert_eq!(recorded, "apps/v1 Deployment\nv1 Service\n");

    // The first build goes in while no host runs; the next host never saw the second.
    host.kill();
    env.put_plugin_only("memcached", &v1, None).await;
    let host = env.start_host();
    testenv::wait_until(
        "the restarted host to prune the Service of the dropped kind",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(services(&env).await) },
        |names| names.is_empty(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    env.wait_nodes("one", 1).await;
}
