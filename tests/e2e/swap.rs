//! Hot-swap: a new plugin version in the ConfigMap takes over with no restart.

use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;

use crate::common::{Env, TIMEOUT, guests};

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
    let v1 = std::fs::read(guests::memcached()).unwrap();
    let v2 = std::fs::read(guests::memcached_v2()).unwrap();
    env.put_plugin("memcached", &v1, None).await;
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
    env.put_plugin("memcached", &v2, None).await;
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
    env.put_plugin("memcached", &v1, None).await;
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
    env.put_plugin("memcached", &v1, Some("image: memcached:1.6.38\n"))
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
}
