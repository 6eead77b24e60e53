//! A Starlark plugin installed as the README says (`wasmop rbac plugin.star` and `wasmop
//! package plugin.star`, applied), serving Memcached; the same ConfigMap swapped to the Rust
//! build and back; a syntax error that keeps the last good version; canaries, a preview, undo
//! and a script that fails one parent at a time.

use std::collections::BTreeSet;

use kube::api::{Patch, PatchParams};
use serde_json::Value;

use k8s_openapi::api::core::v1::ConfigMap;
use support::{Env, Host, TIMEOUT};

pub(crate) const SCRIPT: &str = "plugins/memcached-star/plugin.star";

/// The documents `wasmop <args>` prints, applied server-side as `kubectl apply
/// --server-side -f -` would.
pub(crate) async fn apply_output(env: &Env, args: &[&str]) {
    let (ok, out) = env.wasmop(args);
    assert!(ok, "wasmop {args:?}: {out}");
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&out)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .filter(|v: &Value| !v.is_null())
        .collect();
    assert!(!docs.is_empty(), "wasmop {args:?} printed nothing: {out}");
    testenv::apply_objects(&env.client, docs, "e2e")
        .await
        .expect("applied");
}

/// Waits until `Memcached/name` was last reconciled by the module or script whose digest is
/// `digest` (its `Ready` message names it), and is Ready.
async fn served_by(env: &Env, host: &Host, name: &str, digest: &str) {
    let short = &digest[..19];
    let api = env.memcacheds();
    testenv::wait_until(
        &format!("Memcached {name} to be reconciled by {short}"),
        TIMEOUT,
        || async {
            api.get(name)
                .await
                .map(|o| o.data["status"]["conditions"].clone())
        },
        |conditions| {
            conditions.as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["type"] == "Ready"
                        && c["status"] == "True"
                        && c["message"].as_str().is_some_and(|m| m.contains(short))
                })
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_starlark_plugin_serves_swaps_with_the_rust_build_and_keeps_its_last_good_version() {
    let env = Env::new("e2e-scripts").await;
    let root = test_artifacts::workspace_root();
    let script = root.join(SCRIPT);
    let script_arg = script.to_str().unwrap();
    let source = std::fs::read(&script).unwrap();
    let script_digest = wasmop::sandbox::digest_of(&source);
    let host_ns = env.name().to_owned();

    apply_output(&env, &["rbac", script_arg, "--watch-namespace", &host_ns]).await;
    apply_output(&env, &["package", script_arg]).await;
    let mut host = env.start_host();
    let nodes = env.memcached_ready("one", 2).await;
    assert_eq!(nodes.len(), 2);
    served_by(&env, &host, "one", &script_digest).await;
    let deployment = env.wait_replicas("one", 2).await;
    let image = deployment.spec.template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("memcached:1.4.36-alpine"));

    // The same ConfigMap, now the Rust build, applied by the same manager: the script's key
    // goes, the module's comes, and the parent is served by the module.
    let rust = test_artifacts::read(test_artifacts::MEMCACHED);
    env.put_plugin_only("memcached", &rust, None).await;
    served_by(&env, &host, "one", &wasmop::sandbox::digest_of(&rust)).await;
    env.memcached_ready("one", 3).await;

    // And back to the script.
    apply_output(&env, &["package", script_arg]).await;
    served_by(&env, &host, "one", &script_digest).await;

    // A syntax error: LoadFailed names the key, line and column; the script before it goes on.
    let broken =
        String::from_utf8(source)
            .unwrap()
            .replacen("def labels(name):", "def labels(name)", 1);
    let configmaps: kube::Api<ConfigMap> = env.ns.api();
    let mut cm = configmaps.get("memcached").await.unwrap();
    cm.metadata.managed_fields = None;
    cm.metadata.resource_version = None;
    cm.data
        .get_or_insert_with(Default::default)
        .insert("plugin.star".into(), broken.clone());
    configmaps
        .patch(
            "memcached",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cm),
        )
        .await
        .unwrap();
    let failed = support::wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let note = failed.message.unwrap_or_default();
    assert!(note.contains("plugin.star:12:"), "{note}");
    env.memcached_ready("one", 1).await;
    served_by(&env, &host, "one", &script_digest).await;
    assert!(host.alive(), "the host runs on");
}

/// A platform engineer's path with `wasmop` and `kubectl` only: `wasmop new --lang starlark`,
/// then the scaffold's README, applied as written, to a `Ready` object and its Deployment.
#[tokio::test(flavor = "multi_thread")]
async fn a_starlark_scaffold_installs_as_its_readme_says_and_reconciles() {
    let env = Env::new("e2e-star-new").await;
    let dir = tempfile_dir("star-new");
    // Its own kind: the plane is shared, and CRDs are cluster-wide.
    let new = std::process::Command::new(support::wasmop_bin())
        .args([
            "new",
            "star-app",
            "--lang",
            "starlark",
            "--kind",
            "StarApp",
            "--group",
            "e2e.wasmop.io",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        new.status.success(),
        "{}",
        String::from_utf8_lossy(&new.stderr)
    );
    let file = |name: &str| dir.join(name).to_str().unwrap().to_owned();

    let crd_text = std::fs::read_to_string(file("crd.yaml")).unwrap();
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml::from_str(&crd_text).unwrap();
    testenv::apply_crd(&env.client, &crd, "e2e", TIMEOUT)
        .await
        .expect("the scaffold's CRD is accepted");
    let host_ns = env.name().to_owned();
    apply_output(
        &env,
        &["rbac", &file("plugin.star"), "--watch-namespace", &host_ns],
    )
    .await;
    apply_output(&env, &["package", &file("plugin.star")]).await;
    let host = env.start_host();

    let mut sample: Value =
        serde_yaml::from_str(&std::fs::read_to_string(file("sample.yaml")).unwrap()).unwrap();
    sample["metadata"]["namespace"] = host_ns.clone().into();
    testenv::apply_objects(&env.client, vec![sample], "e2e")
        .await
        .expect("the sample");
    let deployments = env.ns.api::<k8s_openapi::api::apps::v1::Deployment>();
    let deployment = testenv::wait_until(
        "Deployment starapp-sample",
        TIMEOUT,
        || async { deployments.get_opt("starapp-sample").await },
        |d| d.as_ref().is_some_and(|d| d.spec.replicas == Some(2)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()))
    .expect("present");
    let container = &deployment.spec.template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx:1.27"));
    assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        env.client.clone(),
        &host_ns,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("e2e.wasmop.io", "v1alpha1", "StarApp"),
            "starapps",
        ),
    );
    testenv::wait_until(
        "StarApp starapp-sample to be Ready",
        TIMEOUT,
        || async {
            api.get("starapp-sample")
                .await
                .map(|o| o.data["status"].clone())
        },
        |status| {
            status["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh directory path under the system's temporary directory (not created).
fn tempfile_dir(what: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("wasmop-{what}-{}-{nanos}", std::process::id()))
}

/// The plugin ConfigMap `memcached` for a module or, when `file` is given, a script, with
/// `annotations`; applied by one manager, so a key the last one had and this lacks goes.
async fn put(env: &Env, file: Option<&str>, bytes: &[u8], annotations: &[(&str, &str)]) {
    let packaged = match file {
        Some(file) => wasmop::plugin::package::package_script(
            file,
            std::str::from_utf8(bytes).unwrap(),
            "memcached",
            env.name(),
            None,
        ),
        None => wasmop::plugin::package::package(bytes, "memcached", env.name(), None),
    };
    let mut cm = packaged.expect("a plugin ConfigMap").configmap;
    let ann = cm.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in annotations {
        ann.insert(k.to_string(), v.to_string());
    }
    let api: kube::Api<ConfigMap> = env.ns.api();
    api.patch(
        "memcached",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("apply the plugin ConfigMap");
}

/// Waits until every parent in `names` was last reconciled by the digest `digest` as revision
/// `number`, and is Ready.
async fn all_on(env: &Env, host: &Host, names: &[&str], digest: &str, number: i64) {
    let (short, suffix) = (&digest[..19], format!(", revision {number}"));
    let api = env.memcacheds();
    for name in names {
        testenv::wait_until(
            &format!("Memcached {name} Ready on {short} as revision {number}"),
            TIMEOUT,
            || async { api.get(name).await.map(|o| ready_condition(&o.data)) },
            |(status, message)| {
                status == "True" && message.contains(short) && message.ends_with(&suffix)
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    }
}

/// Waits until revision `number` of `memcached` is live: a canary that served every parent
/// is promoted only after its last step.
async fn live(env: &Env, host: &Host, number: i64) {
    use wasmop::plugin::revision::{Phase, Revisions};
    let revisions = Revisions::new(env.client.clone(), env.name());
    testenv::wait_until(
        &format!("revision {number} to be live"),
        TIMEOUT,
        || async { revisions.list("memcached").await },
        |list| {
            list.iter()
                .any(|r| r.number == number && r.phase == Phase::Live)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
}

/// A parent's `Ready` condition: (status, message).
fn ready_condition(data: &Value) -> (String, String) {
    let c = data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (text(&c["status"]), text(&c["message"]))
}

/// The Memcached script, changed: Rust → Starlark → Rust through canaries, a script change
/// previewed with its diff and discarded, `wasmop rollout undo` back to the script, and a
/// script whose reconcile loops, allocates or fails for one parent each: only those parents
/// fail, each saying why, the others are served.
#[tokio::test(flavor = "multi_thread")]
async fn a_script_rolls_out_by_canary_is_previewed_undone_and_fails_one_parent_at_a_time() {
    use wasmop::plugin::rollout::{STEP_SECONDS_ANNOTATION, STEPS_ANNOTATION, STRATEGY_ANNOTATION};
    let env = Env::new("e2e-star-rollout").await;
    let rust = test_artifacts::read(test_artifacts::MEMCACHED);
    let rust_digest = wasmop::sandbox::digest_of(&rust);
    let script = std::fs::read(test_artifacts::workspace_root().join(SCRIPT)).unwrap();
    let script_digest = wasmop::sandbox::digest_of(&script);
    let canary = [
        (STRATEGY_ANNOTATION, "canary"),
        (STEPS_ANNOTATION, "25,100"),
        (STEP_SECONDS_ANNOTATION, "2"),
    ];
    env.grant("memcached", &rust, &[]).await;
    put(&env, None, &rust, &[]).await;
    let mut host = env.start_host();
    let parents = ["mc-0", "mc-1", "mc-2", "mc-3"];
    for name in parents {
        env.put_memcached(name, 1).await;
    }
    all_on(&env, &host, &parents, &rust_digest, 1).await;

    // Rust → Starlark, by canary.
    put(&env, Some("plugin.star"), &script, &canary).await;
    all_on(&env, &host, &parents, &script_digest, 2).await;
    live(&env, &host, 2).await;

    // A script change, previewed: nothing written, the diff shows the new image.
    let text = String::from_utf8(script.clone()).unwrap();
    let changed = text.replace("memcached:1.4.36-alpine", "memcached:1.6.38-alpine");
    assert_ne!(changed, text);
    put(
        &env,
        Some("plugin.star"),
        changed.as_bytes(),
        &[(STRATEGY_ANNOTATION, "preview")],
    )
    .await;
    support::wait_event(&env, "ConfigMap", "memcached", "Previewed").await;
    let (ok, diff) = env.wasmop(&["rollout", "diff", "memcached"]);
    assert!(ok, "{diff}");
    assert!(
        diff.contains("memcached:1.4.36-alpine") && diff.contains("memcached:1.6.38-alpine"),
        "{diff}"
    );
    let (ok, out) = env.wasmop(&["rollout", "abort", "memcached"]);
    assert!(ok, "{out}");
    let image = env
        .wait_replicas("mc-0", 1)
        .await
        .spec
        .template
        .spec
        .unwrap()
        .containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("memcached:1.4.36-alpine"));

    // Starlark → Rust, by canary; then undo, back to the script as the next revision.
    put(&env, None, &rust, &canary).await;
    all_on(&env, &host, &parents, &rust_digest, 4).await;
    live(&env, &host, 4).await;
    let (ok, out) = env.wasmop(&["rollout", "undo", "memcached"]);
    assert!(ok && out.contains("holds revision 2 again"), "{out}");
    all_on(&env, &host, &parents, &script_digest, 5).await;

    // A script that loops for mc-1, allocates without bound for mc-2 and fails for mc-3.
    let hostile = text.replacen(
        "def reconcile(req):\n",
        "def reconcile(req):\n\
         \x20   who = req[\"parent\"][\"metadata\"][\"name\"]\n\
         \x20   if who == \"mc-1\":\n\
         \x20       for i in range(1 << 30):\n\
         \x20           pass\n\
         \x20   if who == \"mc-2\":\n\
         \x20       hog = []\n\
         \x20       for i in range(1 << 30):\n\
         \x20           hog.append(\"x\" * 4096)\n\
         \x20   if who == \"mc-3\":\n\
         \x20       fail(\"mc-3 is told to fail\")\n",
        1,
    );
    assert_ne!(hostile, text);
    let hostile_digest = wasmop::sandbox::digest_of(hostile.as_bytes());
    put(&env, Some("plugin.star"), hostile.as_bytes(), &[]).await;
    all_on(&env, &host, &["mc-0"], &hostile_digest, 6).await;
    let line = 1 + hostile
        .lines()
        .position(|l| l.contains("fail(\"mc-3"))
        .unwrap();
    let at_line = format!("plugin.star:{line}:");
    let api = env.memcacheds();
    for (name, needle) in [
        ("mc-1", "deadline"),
        ("mc-2", "memory"),
        ("mc-3", at_line.as_str()),
    ] {
        let (_, message) = testenv::wait_until(
            &format!("Memcached {name} to fail with {needle:?}"),
            TIMEOUT,
            || async { api.get(name).await.map(|o| ready_condition(&o.data)) },
            |(status, message)| status == "False" && message.contains(needle),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
        let warned = support::events_for(&env, "Memcached", name)
            .await
            .into_iter()
            .any(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().is_some_and(|m| m.contains(needle))
            });
        assert!(
            warned,
            "no Warning Event on {name} naming {needle:?}: {message}"
        );
    }
    assert!(host.alive(), "the host runs on");
}

/// Pods of `Memcached/name`.
async fn pods_of(env: &Env, name: &str) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = env.ns.api();
    api.list(&kube::api::ListParams::default().labels(&format!("memcached_cr={name}")))
        .await
        .expect("list pods")
        .items
}

/// Gives the object a finalizer of the test's (or takes it away), so that deleting it leaves
/// it terminating (kwok takes pods' away: this holds parents).
async fn hold<K>(api: &kube::Api<K>, name: &str, on: bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let finalizers: Vec<&str> = if on { vec![HOLD] } else { vec![] };
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"metadata": {"finalizers": finalizers}})),
    )
    .await
    .unwrap_or_else(|e| panic!("finalizers of {name}: {e}"));
}

const HOLD: &str = "e2e.wasmop.io/hold";

/// A captured request's size, pods, whether a pod is terminating, whether the parent is being
/// deleted, and whether it has its Deployment.
type Shape = (i64, usize, bool, bool, bool);

/// The differential test on requests captured from the plane rather than made up: 36 parents
/// of sizes 0–5 served by the Rust build, captured settled, in the middle of a change (scaled,
/// a pod deleted, the parent itself being deleted) and after; every request answered by
/// the Starlark script byte for byte as by the Rust module. Then `wasmop replay` with the
/// script on a capture of the Rust build, as a user would check a port.
#[tokio::test(flavor = "multi_thread")]
async fn the_starlark_memcached_answers_captured_requests_as_the_rust_one_byte_for_byte() {
    let env = Env::new("e2e-star-corpus").await;
    let rust_wasm = env.put_memcached_plugin().await;
    let host = env.start_host();
    let parents: Vec<(String, i64)> = (0..36).map(|i| (format!("c{i}"), i % 6)).collect();
    for (name, size) in &parents {
        env.put_memcached(name, *size).await;
    }
    for (name, size) in &parents {
        env.wait_nodes(name, *size as usize).await;
    }
    let ns = env.name().to_owned();
    let dir = |n: u32| {
        test_artifacts::workspace_root()
            .join("target/e2e-logs")
            .join(format!("corpus-{ns}-{n}"))
    };
    let capture = |n: u32| {
        let out = dir(n);
        let _ = std::fs::remove_dir_all(&out);
        let (ok, text) = env.wasmop(&[
            "capture",
            "memcached",
            "--out",
            out.to_str().unwrap(),
            "--watch-namespace",
            &ns,
        ]);
        assert!(ok, "{text}\nhost log:\n{}", host.logs());
    };
    capture(1);

    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = env.ns.api();
    let memcacheds = env.memcacheds();
    let mut held_parents = Vec::new();
    for (i, (name, size)) in parents.iter().enumerate() {
        match i % 4 {
            0 => env.put_memcached(name, (size + 2) % 6).await,
            1 if *size > 0 => {
                let pod = pods_of(&env, name).await[0].metadata.name.clone().unwrap();
                pods.delete(&pod, &Default::default()).await.unwrap();
            }
            2 => {
                hold(&memcacheds, name, true).await;
                memcacheds.delete(name, &Default::default()).await.unwrap();
                held_parents.push(name.clone());
            }
            _ => {}
        }
    }
    capture(2);
    for (i, (name, size)) in parents.iter().enumerate() {
        if i % 4 == 0 {
            env.wait_nodes(name, ((size + 2) % 6) as usize).await;
        }
    }
    capture(3);

    let root = test_artifacts::workspace_root();
    let dirs: Vec<_> = (1..=3).map(dir).collect();
    // Blocking calls, off the runtime's threads.
    let (requests, seen) = tokio::task::spawn_blocking(move || differ(&rust_wasm, &dirs))
        .await
        .unwrap();
    assert!(requests >= 100, "{requests} requests captured");
    let sizes: BTreeSet<i64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(sizes.len(), 6, "sizes 0–5: {seen:?}");
    // kwok drops a deleted pod's finalizers and replaces pods within the capture's time, so
    // terminating pods and counts off the size are what the sandbox suite's made-up corpus
    // covers; the plane gives parents being deleted.
    assert!(seen.iter().any(|s| s.3), "a parent being deleted: {seen:?}");
    println!(
        "{requests} captured requests, {} shapes (size, pods, terminating, deleting, deployment)",
        seen.len()
    );

    let replay = std::process::Command::new(support::wasmop_bin())
        .args(["replay", "--plugin"])
        .arg(root.join(SCRIPT))
        .arg(dir(2))
        .output()
        .expect("run wasmop replay");
    let replayed = String::from_utf8_lossy(&replay.stdout).to_string()
        + &String::from_utf8_lossy(&replay.stderr);
    assert!(
        replay.status.success() && replayed.contains("parents answered as revision 1"),
        "{replayed}"
    );

    for name in &held_parents {
        hold(&memcacheds, name, false).await;
    }
}

/// Answers every request captured in `dirs` with the Rust module `rust_wasm` and the Starlark
/// script, requires the same bytes, and says how many requests there were and which shapes
/// (size, pods, a pod terminating, the parent being deleted, a Deployment) they had.
fn differ(rust_wasm: &[u8], dirs: &[std::path::PathBuf]) -> (usize, BTreeSet<Shape>) {
    let root = test_artifacts::workspace_root();
    let source = std::fs::read(root.join(SCRIPT)).unwrap();
    let sandbox = wasmop::sandbox::Sandbox::new(Default::default()).unwrap();
    let limits = wasmop::sandbox::Limits::default();
    let rust = sandbox.load_blocking(rust_wasm, limits).unwrap();
    let star = sandbox
        .load_script_blocking(
            wasmop::sandbox::Language::Starlark,
            "plugin.star",
            &source,
            limits,
        )
        .unwrap();
    let mut requests = 0;
    let mut seen = BTreeSet::new();
    for dir in dirs {
        for file in std::fs::read_dir(dir).unwrap() {
            let path = file.unwrap().path();
            if path.file_name().is_some_and(|f| f == "capture.json") {
                continue;
            }
            let record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let req: wasmop_contract::wire::WireRequest =
                serde_json::from_value(record["request"].clone()).unwrap();
            let answer = |p: &wasmop::sandbox::Plugin| {
                let response = p
                    .reconcile_blocking(&req)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                serde_json::to_string(&response).unwrap()
            };
            assert_eq!(answer(&star), answer(&rust), "{}", path.display());
            requests += 1;
            let pods = req.related.get("Pod.v1").map_or(0, |p| p.len());
            let terminating = req.related.get("Pod.v1").is_some_and(|p| {
                p.values()
                    .any(|p| p["metadata"].get("deletionTimestamp").is_some())
            });
            let deleting = req.parent["metadata"].get("deletionTimestamp").is_some();
            let deployment = req
                .children
                .get("Deployment.apps/v1")
                .is_some_and(|d| !d.is_empty());
            seen.insert((
                req.parent["spec"]["size"].as_i64().unwrap(),
                pods,
                terminating,
                deleting,
                deployment,
            ));
        }
    }
    (requests, seen)
}
