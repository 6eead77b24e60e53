//! A plugin reads only what its own identity may read, and the host's namespace is out of its
//! reach: a host serving every namespace, as `deploy/` installs it, runs the `snoop` plugin,
//! whose cluster-scoped parent selects every Secret and ConfigMap in the cluster and asks for
//! children wherever its spec says. The host itself may read everything.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use support::{Env, TIMEOUT, http_get, test_crd, test_resource};

/// What `wasmop rbac` prints for the plugin in ConfigMap `name` of the test's namespace,
/// cluster-wide, with `withheld` resources taken out of the plugin's rules.
async fn grant_everywhere(env: &Env, name: &str, wasm: &[u8], withheld: &[&str]) {
    // Cluster-wide names: unique to this test's namespace.
    let roles = format!("{}-{name}", env.name());
    support::grant_everywhere(&env.client, wasm, name, env.name(), &roles, withheld).await;
}

/// The value of the first sample of `name` in a `/metrics` text, summed over its series.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some(s.as_str()?.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_reads_only_what_its_account_may_and_never_the_hosts_namespace() {
    // The host's namespace, with its plugin ConfigMap, and a tenant's namespace beside it.
    let env = Env::new("e2e-reads").await;
    let tenant = testenv::namespace(&env.client, "e2e-reads-tenant")
        .await
        .expect("namespace");
    testenv::apply_objects(&env.client, vec![test_crd("Snoop", "Cluster")], "e2e")
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "password"},
        "stringData": {"password": "hunter2"},
    }))
    .unwrap();
    tenant
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let note: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "note"}, "data": {"a": "b"}})).unwrap();
    tenant
        .api::<ConfigMap>()
        .create(&PostParams::default(), &note)
        .await
        .unwrap();
    // A record planted before the host starts, as a plugin would have written it: the host
    // must not trust it, and replaces it on its first write.
    let planted = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "wasmop-child-kinds"},
        "data": {"snoop": "v1 Secret\n"},
    });
    let configmaps = env.ns.api::<ConfigMap>();
    configmaps
        .patch(
            "wasmop-child-kinds",
            &PatchParams::apply("wasmop/evil"),
            &Patch::Apply(&planted),
        )
        .await
        .unwrap();
    let planted_uid = configmaps
        .get("wasmop-child-kinds")
        .await
        .unwrap()
        .metadata
        .uid;

    // Its account may read ConfigMaps everywhere, but no Secret.
    let snoop = test_artifacts::read(test_artifacts::SNOOP);
    grant_everywhere(&env, "snoop", &snoop, &["secrets"]).await;
    env.put_plugin_only("snoop", &snoop, None).await;
    let host = env
        .host()
        .everywhere()
        .pod("reads")
        .args(&["--resync-seconds", "3"])
        .start();
    let snoops: Api<DynamicObject> = Api::all_with(env.client.clone(), &test_resource("Snoop"));
    let parent = |name: &str, children: Value| {
        json!({"apiVersion": "test.wasmop.io/v1", "kind": "Snoop",
               "metadata": {"name": name}, "spec": {"children": children}})
    };
    let s1 = format!("{}-look", env.name());
    snoops
        .patch(
            &s1,
            &PatchParams::apply("e2e"),
            &Patch::Apply(parent(
                &s1,
                json!([{"namespace": tenant.name(), "name": "out"}]),
            )),
        )
        .await
        .unwrap();

    let status = testenv::wait_until(
        "the snoop to report what it was shown",
        TIMEOUT,
        || async { snoops.get(&s1).await.map(|o| o.data["status"].clone()) },
        |s| s["configmaps"].is_array(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    let shown = strings(&status["configmaps"]);
    let in_tenant = format!("{}/note", tenant.name());
    assert!(shown.contains(&in_tenant), "{shown:?}");
    let host_ns = format!("{}/", env.name());
    assert!(
        !shown.iter().any(|k| k.starts_with(&host_ns)),
        "nothing of the host's namespace, not even its own ConfigMap: {shown:?}"
    );
    assert_eq!(
        strings(&status["secrets"]),
        Vec::<String>::new(),
        "no Secret"
    );
    // Its child in the tenant's namespace is written.
    testenv::wait_until(
        "the snoop's child in the tenant's namespace",
        TIMEOUT,
        || async { tenant.api::<ConfigMap>().get_opt("out").await },
        Option::is_some,
    )
    .await
    .unwrap();

    // The planted record was replaced whole by the host's own.
    let record = testenv::wait_until(
        "the host's own child-kind record",
        TIMEOUT,
        || async { configmaps.get("wasmop-child-kinds").await },
        |cm| cm.metadata.uid != planted_uid,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    let data = record.data.unwrap_or_default();
    assert_eq!(
        data.get("snoop").map(String::as_str),
        Some("v1 ConfigMap\n")
    );
    assert_eq!(
        record
            .metadata
            .labels
            .unwrap_or_default()
            .get("wasmop.io/record")
            .map(String::as_str),
        Some("host")
    );

    // At rest, reconciles every 3 s ask no review: the answers are kept.
    let addr = host.http_addr().await;
    let sample = || async {
        let (_, text) = http_get(&addr, "/metrics").await;
        (
            metric(&text, "wasmop_access_reviews_total"),
            metric(&text, "wasmop_reconcile_total"),
        )
    };
    let (reviews0, reconciles0) = sample().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (reviews1, reconciles1) = sample().await;
    println!(
        "at rest over 10 s: {} reconciles, {} access reviews",
        reconciles1 - reconciles0,
        reviews1 - reviews0
    );
    assert!(reconciles1 - reconciles0 >= 2.0, "the resync ran");
    assert!(
        reviews1 - reviews0 < reconciles1 - reconciles0,
        "fewer reviews than reconciles: {} against {}",
        reviews1 - reviews0,
        reconciles1 - reconciles0
    );

    // Granted, the Secret is shown within the answers' lifetime, with nothing restarted.
    grant_everywhere(&env, "snoop", &snoop, &[]).await;
    let granted = Instant::now();
    let secret_key = format!("{}/password", tenant.name());
    testenv::wait_until(
        "the snoop to be shown the Secret once its account may read it",
        wasmop::config::READ_REVIEW_TTL + Duration::from_secs(30),
        || async { snoops.get(&s1).await.map(|o| o.data["status"].clone()) },
        |s| strings(&s["secrets"]).contains(&secret_key),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    println!("the granted read took effect after {:?}", granted.elapsed());

    // A child in the host's namespace is refused whole, whatever its name.
    for (i, name) in ["planted", "wasmop-finalizers"].into_iter().enumerate() {
        let s = format!("{}-write-{i}", env.name());
        snoops
            .patch(
                &s,
                &PatchParams::apply("e2e"),
                &Patch::Apply(parent(&s, json!([{"namespace": env.name(), "name": name}]))),
            )
            .await
            .unwrap();
        let ready = testenv::wait_until(
            "the snoop writing into the host's namespace to be refused",
            TIMEOUT,
            || async { snoops.get(&s).await.map(|o| o.data["status"].clone()) },
            |s| {
                s["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "False")
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
        let condition = ready["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()
            .clone();
        assert_eq!(condition["reason"], "InvalidPluginOutput", "{condition}");
        assert!(
            condition["message"]
                .as_str()
                .unwrap()
                .contains("host's namespace"),
            "{condition}"
        );
    }
    assert!(configmaps.get_opt("planted").await.unwrap().is_none());
    let finalizers = configmaps.get_opt("wasmop-finalizers").await.unwrap();
    assert!(
        finalizers.is_none_or(|cm| cm
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("wasmop.io/record")),
        "no plugin-written wasmop-finalizers"
    );

    for s in [
        s1,
        format!("{}-write-0", env.name()),
        format!("{}-write-1", env.name()),
    ] {
        let _ = snoops.delete(&s, &Default::default()).await;
    }
}

/// The create path of `apply`: a child the cache said was free is only created, never taken
/// over if an object of that name appeared in between.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_never_takes_over_an_object_that_appeared_since_the_cache_was_read() {
    let env = Env::new("e2e-create-only").await;
    let kind = wasmop::kinds::resolve_one(
        &env.client,
        &wasmop_contract::KindRef::new("v1", "ConfigMap"),
    )
    .await
    .unwrap()
    .expect("ConfigMaps are served");
    let child = |value: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "taken", "namespace": env.name()},
               "data": {"v": value}})
    };
    let apply = |value: &'static str, create: bool| {
        let (client, kind, obj, ns) = (
            env.client.clone(),
            kind.clone(),
            child(value),
            env.name().to_string(),
        );
        async move {
            wasmop::apply::ssa::apply(
                &client,
                &kind,
                Some(&ns),
                "taken",
                &obj,
                "wasmop/test",
                create,
            )
            .await
        }
    };
    // Free: created.
    apply("first", true).await.expect("created");
    // Someone else's object of that name now: refused with a conflict, left as it is.
    let configmaps = env.ns.api::<ConfigMap>();
    configmaps
        .delete("taken", &Default::default())
        .await
        .unwrap();
    let theirs: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "taken"}, "data": {"v": "theirs"}}))
            .unwrap();
    configmaps
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let err = apply("mine", true).await.expect_err("a conflict");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409),
        "{err:?}"
    );
    let now = configmaps.get("taken").await.unwrap();
    assert_eq!(now.data.unwrap()["v"], "theirs");
    assert!(
        now.metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .all(|f| f.manager.as_deref() != Some("wasmop/test"))
    );
    // An ordinary apply, as for a child the cache knows, still updates.
    apply("updated", false).await.expect("applied");
    assert_eq!(
        configmaps.get("taken").await.unwrap().data.unwrap()["v"],
        "updated"
    );
}
