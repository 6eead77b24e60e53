//! The install path, end to end: `kubectl apply --server-side -k deploy/` on the shared plane,
//! then the host as a real process with a token of the ServiceAccount `wasmop`, so it has
//! exactly the RBAC `deploy/` grants, and Memcached's writes made as its own ServiceAccount
//! `wasmop-plugin-memcached`. A plugin no one granted an identity is refused at load with a
//! message naming what is missing, loads once `wasmop rbac` for it is applied, and Memcached
//! keeps reconciling throughout.
//!
//! The only test that uses the namespace `wasmop-system`: its plugin ConfigMaps are loaded by
//! any host started with `--namespace wasmop-system`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Event, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use support::{Env, Host, TIMEOUT};

const SYSTEM: &str = "wasmop-system";

#[tokio::test(flavor = "multi_thread")]
async fn kustomize_install_runs_memcached_with_least_privilege() {
    let env = Env::new("e2e-deploy").await;
    let kubectl_bin = testenv::binaries::ensure().await.expect("kubectl").kubectl;
    let kubectl = |args: &[&str]| {
        run(Command::new(&kubectl_bin)
            .args(args)
            .env("KUBECONFIG", &env.kubeconfig))
    };
    let root = test_artifacts::workspace_root();

    // `deploy/rbac/memcached.yaml` is what `wasmop rbac` prints for the built module.
    let memcached_wasm = test_artifacts::MEMCACHED;
    let printed = run(Command::new(env!("CARGO_BIN_EXE_wasmop"))
        .arg("rbac")
        .arg(memcached_wasm));
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        std::fs::read_to_string(root.join("deploy/rbac/memcached.yaml")).unwrap(),
        "deploy/rbac/memcached.yaml is stale: regenerate it with `wasmop rbac`"
    );

    // 1. The kustomization, with the module where `make deploy-plugin` puts it. A copy of the
    //    tree, so the test never overwrites a module someone built into deploy/plugins/.
    let tree = root
        .join("target/e2e-deploy")
        .join(format!("{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tree);
    copy_tree(&root.join("deploy"), &tree);
    std::fs::copy(memcached_wasm, tree.join("plugins/memcached.wasm")).unwrap();
    // A leftover of an earlier run against the same cluster would be loaded at once.
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), SYSTEM);
    let _ = configmaps.delete("probe", &DeleteParams::default()).await;

    let started = Instant::now();
    let applied = kubectl(&["apply", "--server-side", "-k", tree.to_str().unwrap()]);
    print!("{}", String::from_utf8_lossy(&applied.stdout));
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), SYSTEM);
    testenv::wait_until(
        "Deployment wasmop-system/wasmop to be Available",
        TIMEOUT,
        || async { deployments.get_opt("wasmop").await },
        |d| {
            d.as_ref()
                .and_then(|d| d.status.as_ref()?.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_.as_deref() == Some("Available")
                            && c.status.as_deref() == Some("True")
                    })
                })
        },
    )
    .await
    .expect("the host's Deployment becomes Available");
    println!(
        "measured: kubectl apply --server-side -k deploy/ → Deployment Available in {:?}",
        started.elapsed()
    );
    let plugin = configmaps.get("memcached").await.unwrap();
    assert!(
        plugin
            .binary_data
            .as_ref()
            .is_some_and(|b| b.contains_key("memcached.wasm")),
        "kustomize put the module in binaryData"
    );
    assert!(
        plugin
            .metadata
            .labels
            .unwrap()
            .contains_key("wasmop.io/plugin")
    );

    // 2. The host as the ServiceAccount: a token from the TokenRequest API, as
    //    `kubectl create token` gets one.
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), SYSTEM);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request("wasmop", &PostParams::default(), &request)
        .await
        .expect("a token for wasmop-system/wasmop")
        .status
        .expect("token status")
        .token
        .expect("a token");
    let kubeconfig = tree.join("wasmop.kubeconfig");
    write_token_kubeconfig(&env.kubeconfig, &token, &kubeconfig);
    // Its plugins in wasmop-system, reconciling only in this test's namespace; with
    // `--leader-elect` as deployed, since the Lease is part of what the Role grants.
    let host = Host::build(&kubeconfig, SYSTEM)
        .watch(env.name())
        .args(&["--leader-elect"])
        .start();

    // 3. Memcached reconciles with the granted RBAC only.
    env.put_memcached("cache", 2).await;
    env.wait_replicas("cache", 2).await;
    env.wait_nodes("cache", 2).await;
    let loaded = wait_event(&env, "memcached", "Loaded").await;
    assert_eq!(loaded.type_.as_deref(), Some("Normal"));

    // 4. A plugin whose kinds were not granted, packaged as a user would.
    let packaged = run(Command::new(env!("CARGO_BIN_EXE_wasmop"))
        .arg("package")
        .arg(test_artifacts::ADVERSARIAL)
        .args(["--name", "probe"]));
    let file = tree.join("probe.yaml");
    std::fs::write(&file, &packaged.stdout).unwrap();
    kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()]);
    let refused = wait_event(&env, "probe", "Forbidden").await;
    let message = refused.message.clone().unwrap_or_default();
    println!("Forbidden: {message}");
    assert_eq!(refused.type_.as_deref(), Some("Warning"));
    // No one granted the host its identity: refused before anything runs.
    for missing in [
        "the host (system:serviceaccount:wasmop-system:wasmop)",
        "in namespace wasmop-system",
        "impersonate serviceaccounts/wasmop-plugin-probe",
        "wasmop rbac",
    ] {
        assert!(message.contains(missing), "{missing:?} in {message}");
    }

    // 5. The flow the message names: `wasmop rbac` for this ConfigMap and namespace, applied.
    let printed = run(Command::new(env!("CARGO_BIN_EXE_wasmop"))
        .arg("rbac")
        .arg(test_artifacts::ADVERSARIAL)
        .args(["--configmap", "probe", "--watch-namespace", env.name()]));
    let file = tree.join("probe-rbac.yaml");
    std::fs::write(&file, &printed.stdout).unwrap();
    kubectl(&["apply", "--server-side", "-f", file.to_str().unwrap()]);
    let loaded = wait_event(&env, "probe", "Loaded").await;
    assert_eq!(loaded.type_.as_deref(), Some("Normal"));

    // 6. Memcached keeps reconciling.
    env.put_memcached("cache", 3).await;
    env.wait_replicas("cache", 3).await;
    env.wait_nodes("cache", 3).await;
    let logs = host.logs();
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "the granted RBAC is enough for everything the host did:\n{logs}"
    );

    configmaps
        .delete("probe", &DeleteParams::default())
        .await
        .unwrap();
    let _ = kubectl(&["delete", "--ignore-not-found", "-f", file.to_str().unwrap()]);

    // 7. The sharded variant (deploy/sharded/, turned on as its comment says): three replicas
    //    with `--shards`, and the Lease rights a replica needs, which are enough for one.
    let kustomization = tree.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization).unwrap();
    let on = text.replace("# components:\n#   - sharded", "components:\n  - sharded");
    assert_ne!(
        on, text,
        "deploy/kustomization.yaml names the sharded component"
    );
    std::fs::write(&kustomization, on).unwrap();
    kubectl(&["apply", "--server-side", "-k", tree.to_str().unwrap()]);
    let deployed = deployments.get("wasmop").await.unwrap();
    let spec = deployed.spec;
    assert_eq!(spec.replicas, Some(3));
    let args = spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(args, ["run", "--shards", "12"]);
    assert!(host.terminate().success());
    let sharded = Host::build(&kubeconfig, SYSTEM)
        .watch(env.name())
        .args(&["--shards", "12"])
        .start();
    env.put_memcached("cache", 1).await;
    env.wait_replicas("cache", 1).await;
    env.wait_nodes("cache", 1).await;
    let logs = sharded.logs();
    assert!(logs.contains("took the shard"), "{logs}");
    assert!(!logs.to_lowercase().contains("forbidden"), "{logs}");

    // 8. The README's uninstall, in its order, while the host runs: nothing is left. (The
    //    CRDs stay: the other tests on this plane use them.)
    kubectl(&[
        "-n",
        SYSTEM,
        "delete",
        "configmap",
        "-l",
        "wasmop.io/plugin",
    ]);
    testenv::wait_until(
        "wasmop-finalizers to name no plugin",
        TIMEOUT,
        || configmaps.get_opt("wasmop-finalizers"),
        |cm| {
            cm.as_ref()
                .and_then(|cm| cm.data.as_ref())
                .is_none_or(|d| d.is_empty())
        },
    )
    .await
    .unwrap();
    let plugin_rbac = "serviceaccount,role,rolebinding,clusterrole,clusterrolebinding";
    let selector = format!("wasmop.io/host={SYSTEM}");
    kubectl(&["delete", plugin_rbac, "-A", "-l", &selector]);
    let host_base = tree.join("host");
    let base = std::fs::read_to_string(host_base.join("kustomization.yaml")).unwrap();
    let without_crd = base.replace("  - wasmopplugins.yaml\n", "");
    assert_ne!(
        without_crd, base,
        "deploy/host/ installs the WasmopPlugin CRD"
    );
    std::fs::write(host_base.join("kustomization.yaml"), without_crd).unwrap();
    kubectl(&["delete", "--wait=true", "-k", host_base.to_str().unwrap()]);
    // By label, and by name: a cluster-wide object the labels missed would still be found.
    // (Other tests grant Roles of the same name in their own namespaces.)
    let left = kubectl(&["get", "clusterrole,clusterrolebinding", "-o", "name"]);
    let left: Vec<String> = String::from_utf8_lossy(&left.stdout)
        .lines()
        .filter(|l| l.contains("wasmop-plugin-memcached"))
        .map(str::to_owned)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let labelled = kubectl(&["get", plugin_rbac, "-A", "-l", &selector, "-o", "name"]);
    assert!(
        labelled.stdout.is_empty(),
        "left behind: {}",
        String::from_utf8_lossy(&labelled.stdout)
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    testenv::wait_until(
        "namespace wasmop-system to be gone",
        TIMEOUT,
        || namespaces.get_opt(SYSTEM),
        Option::is_none,
    )
    .await
    .unwrap();
    let _ = sharded.terminate();
}

/// Runs a command to completion; panics with its output when it fails.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("running a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A kubeconfig for the admin kubeconfig's cluster (server and CA) that authenticates with
/// `token`.
fn write_token_kubeconfig(admin: &Path, token: &str, to: &Path) {
    let admin: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    let current = admin["current-context"].as_str().unwrap_or_default();
    let context = admin["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == current || current.is_empty())
        .expect("current context");
    let cluster_name = context["context"]["cluster"].clone();
    let mut cluster = admin["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == cluster_name)
        .expect("the context's cluster")["cluster"]
        .clone();
    // A CA given as a file path would be relative to the admin kubeconfig: inline it.
    if let Some(path) = cluster["certificate-authority"].as_str() {
        use base64::Engine;
        let pem = std::fs::read(path).unwrap();
        cluster["certificate-authority-data"] =
            json!(base64::engine::general_purpose::STANDARD.encode(pem));
        cluster
            .as_object_mut()
            .unwrap()
            .remove("certificate-authority");
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "plane", "cluster": cluster}],
        "users": [{"name": "wasmop", "user": {"token": token}}],
        "contexts": [{"name": "wasmop", "context": {"cluster": "plane", "user": "wasmop"}}],
        "current-context": "wasmop",
    });
    std::fs::write(to, serde_yaml::to_string(&config).unwrap()).unwrap();
}

/// The newest Event with `reason` on the plugin ConfigMap `configmap` in wasmop-system.
async fn wait_event(env: &Env, configmap: &str, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(env.client.clone(), SYSTEM);
    let matching = testenv::wait_until(
        &format!("an Event {reason} on ConfigMap {SYSTEM}/{configmap}"),
        TIMEOUT,
        || async {
            events.list(&ListParams::default()).await.map(|l| {
                l.items
                    .into_iter()
                    .filter(|e| {
                        e.involved_object.kind.as_deref() == Some("ConfigMap")
                            && e.involved_object.name.as_deref() == Some(configmap)
                            && e.reason.as_deref() == Some(reason)
                    })
                    .collect::<Vec<_>>()
            })
        },
        |found| !found.is_empty(),
    )
    .await
    .expect("event");
    matching.into_iter().last().expect("one at least")
}
