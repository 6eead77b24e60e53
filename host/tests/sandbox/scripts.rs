//! Script plugins in the sandbox: the Starlark Memcached against the Rust one on the same
//! requests, and a hostile script's every way of failing at load and per call.

use std::time::Duration;

use serde_json::{Value, json};
use wasmop::sandbox::{
    Call, Compiler, Language, Limits, Plugin, PluginError, PluginErrorKind, Sandbox, SandboxConfig,
    TestFile, TestOutcome,
};
use wasmop_contract::wire::WireRequest;

use super::{LIMITS, sandbox};

/// `plugins/memcached-star/plugin.star`.
const MEMCACHED_STAR: &str = include_str!("../../../plugins/memcached-star/plugin.star");

fn script(source: &str) -> Result<Plugin, PluginError> {
    script_with(source, LIMITS)
}

fn script_with(source: &str, limits: Limits) -> Result<Plugin, PluginError> {
    sandbox().load_script_blocking(Language::Starlark, "plugin.star", source.as_bytes(), limits)
}

fn load_failure(source: &str) -> PluginErrorKind {
    script(source).expect_err("the script should not load").kind
}

/// A script that loads, with its `reconcile` body `body` (indented by the caller).
fn with_reconcile(body: &str) -> String {
    format!(
        "MANIFEST = {{\"name\": \"s\", \"version\": \"0.1.0\", \
         \"parent\": {{\"apiVersion\": \"test.wasmop.io/v1\", \"kind\": \"Probe\"}}}}\n\
         def reconcile(req):\n{body}\n"
    )
}

fn probe_request() -> WireRequest {
    WireRequest {
        parent: json!({"apiVersion": "test.wasmop.io/v1", "kind": "Probe",
            "metadata": {"name": "p", "namespace": "ns"}, "spec": {}}),
        ..WireRequest::default()
    }
}

/// Memcached requests that differ in everything the plugin reads: sizes 0–5, no Deployment
/// or one at, above or below the size with some or all replicas available, pods none, some,
/// all, more and terminating, with or without a generation and an image setting, and a parent
/// being deleted.
fn corpus() -> Vec<WireRequest> {
    let mut out = Vec::new();
    let mut n = 0u64;
    for size in 0..=5i64 {
        for deployment in 0..5 {
            for pods in [0, size, size + 1, 0, size, size + 1] {
                n += 1;
                let name = format!("m{n}");
                let mut parent = json!({
                    "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                    "metadata": {"name": name, "namespace": "ns", "uid": format!("u{n}")},
                    "spec": {"size": size},
                });
                if n.is_multiple_of(2) {
                    parent["metadata"]["generation"] = json!(n);
                }
                let finalizing = n.is_multiple_of(7);
                if finalizing {
                    parent["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                }
                let replicas = match deployment {
                    1 | 2 => Some(size),
                    3 => Some(size + 2),
                    _ => None,
                };
                let available = match deployment {
                    1 => size,
                    2 => size / 2,
                    _ => 0,
                };
                let mut children = serde_json::Map::new();
                if deployment > 0 {
                    let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": name, "namespace": "ns"},
                        "spec": {}, "status": {"availableReplicas": available}});
                    if let Some(r) = replicas {
                        d["spec"]["replicas"] = json!(r);
                    }
                    if deployment == 4 {
                        d["status"] = json!({});
                    }
                    children.insert(name.clone(), d);
                }
                let mut related = serde_json::Map::new();
                for i in 0..pods {
                    let pod = format!("{name}-{i:02}");
                    let mut meta = json!({"name": pod, "namespace": "ns",
                        "labels": {"app": "memcached", "memcached_cr": name}});
                    if i == 0 && n.is_multiple_of(3) {
                        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    }
                    related.insert(
                        pod,
                        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta}),
                    );
                }
                let settings = if n % 4 == 1 {
                    json!({"image": "memcached:1.6.38"})
                } else {
                    Value::Null
                };
                out.push(WireRequest {
                    parent,
                    children: [(
                        "Deployment.apps/v1".to_owned(),
                        children.into_iter().collect(),
                    )]
                    .into(),
                    related: [("Pod.v1".to_owned(), related.into_iter().collect())].into(),
                    finalizing,
                    settings,
                    now: None,
                });
            }
        }
    }
    out
}

#[test]
fn the_starlark_memcached_answers_as_the_rust_one_does() {
    let rust = sandbox()
        .load_blocking(&test_artifacts::read(test_artifacts::MEMCACHED), LIMITS)
        .expect("the Rust plugin loads");
    let star = script(MEMCACHED_STAR).expect("the Starlark plugin loads");
    assert_eq!(star.manifest().name, rust.manifest().name);
    assert_eq!(star.manifest().parent, rust.manifest().parent);
    assert_eq!(star.manifest().children, rust.manifest().children);
    assert_eq!(star.manifest().related, rust.manifest().related);
    assert!(star.digest().starts_with("sha256:"));
    assert_eq!(
        star.digest(),
        wasmop::sandbox::digest_of(MEMCACHED_STAR.as_bytes()),
        "a script plugin is known by its script's digest"
    );

    let requests = corpus();
    assert!(requests.len() >= 100, "{} requests", requests.len());
    for req in &requests {
        let name = req.parent["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            star.related_blocking(&req.parent)
                .expect("Starlark related"),
            rust.related_blocking(&req.parent).expect("Rust related"),
            "related for {name}"
        );
        let canonical = |p: &Plugin| {
            let response = p
                .reconcile_blocking(req)
                .unwrap_or_else(|e| panic!("reconcile of {name}: {e}"));
            serde_json::to_string(&response).unwrap()
        };
        assert_eq!(canonical(&star), canonical(&rust), "response for {name}");
    }

    // Both refuse a negative size, the script naming its line.
    let mut bad = requests[0].clone();
    bad.parent["spec"]["size"] = json!(-1);
    let rust_err = rust.reconcile_blocking(&bad).expect_err("Rust refuses");
    let star_err = star.reconcile_blocking(&bad).expect_err("Starlark refuses");
    assert_eq!(rust_err.reason(), "PluginFailed");
    match star_err.kind {
        PluginErrorKind::PluginFailed { call, message } => {
            assert_eq!(call, Call::Reconcile);
            assert!(message.starts_with("plugin.star:"), "{message}");
            assert!(
                message.contains("spec.size must be ≥ 0, got -1"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_syntax_error_names_the_file_line_and_column() {
    let kind = load_failure("MANIFEST = {\n\"name\": \"x\",\n  def\n}\n");
    match kind {
        PluginErrorKind::PluginFailed { call, message } => {
            assert_eq!(call, Call::Init);
            assert!(message.starts_with("plugin.star:3:"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_script_without_what_a_plugin_defines_is_refused_with_what_is_missing() {
    let message = |kind: PluginErrorKind| match kind {
        PluginErrorKind::PluginFailed { message, .. } => message,
        other => panic!("{other:?}"),
    };
    assert!(message(load_failure("x = 1\n")).contains("must define MANIFEST"));
    let no_reconcile = "MANIFEST = {\"name\": \"s\", \"version\": \"1\", \
        \"parent\": {\"apiVersion\": \"v1\", \"kind\": \"Probe\"}}\n";
    assert!(message(load_failure(no_reconcile)).contains("must define reconcile(request)"));
    let typo = "MANIFEST = {\"nam\": \"s\"}\ndef reconcile(req):\n    return {}\n";
    assert!(message(load_failure(typo)).contains("MANIFEST: unknown field `nam`"));
    // A manifest the contract refuses is refused as a compiled plugin's would be.
    let bad_name = with_reconcile("    return {}").replace("\"s\"", "\"Not A Name\"");
    assert!(matches!(
        load_failure(&bad_name),
        PluginErrorKind::InvalidManifest(_)
    ));
}

#[test]
fn a_top_level_that_never_ends_runs_into_the_deadline() {
    // Starlark's range takes 32-bit bounds: two of them nested never end in time.
    let source = "for i in range(1 << 30):\n    for j in range(1 << 30):\n        pass\n";
    let kind = load_failure(source);
    assert!(
        matches!(
            kind,
            PluginErrorKind::DeadlineExceeded {
                call: Call::Init,
                ..
            }
        ),
        "{kind:?}"
    );
}

#[test]
fn a_top_level_that_allocates_without_bound_hits_the_memory_cap() {
    let source = "chunk = \"x\" * (1 << 20)\nkept = []\nfor i in range(1 << 20):\n    kept.append(chunk + str(i))\n";
    assert!(matches!(
        load_failure(source),
        PluginErrorKind::MemoryCap {
            call: Call::Init,
            ..
        }
    ));
}

#[test]
fn a_failing_or_endless_reconcile_fails_that_call_only() {
    let plugin = script(&with_reconcile(
        "    mode = req[\"settings\"]\n\
         \x20   if mode == \"fail\":\n\
         \x20       fail(\"asked to\")\n\
         \x20   if mode == \"loop\":\n\
         \x20       for i in range(1 << 30):\n\
         \x20           for j in range(1 << 30):\n\
         \x20               pass\n\
         \x20   if mode == \"recurse\":\n\
         \x20       return reconcile(req)\n\
         \x20   if mode == \"list\":\n\
         \x20       return []\n\
         \x20   if mode == \"shape\":\n\
         \x20       return {\"events\": [{\"type\": \"Normal\", \"reason\": 3}]}\n\
         \x20   return {\"status\": {\"ok\": True}}",
    ))
    .expect("loads");
    let call = |mode: &str| {
        let mut req = probe_request();
        req.settings = json!(mode);
        plugin.reconcile_blocking(&req)
    };
    match call("fail").expect_err("fails").kind {
        PluginErrorKind::PluginFailed { call, message } => {
            assert_eq!(call, Call::Reconcile);
            assert!(message.starts_with("plugin.star:5:"), "{message}");
            assert!(message.contains("asked to"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let kind = call("loop").expect_err("times out").kind;
    assert!(
        matches!(kind, PluginErrorKind::DeadlineExceeded { .. }),
        "{kind:?}"
    );
    match call("recurse").expect_err("too deep").kind {
        PluginErrorKind::PluginFailed { message, .. } => {
            assert!(message.contains("plugin.star:"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    match call("list").expect_err("not a dict").kind {
        PluginErrorKind::PluginFailed { message, .. } => {
            assert!(message.contains("returned a list"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    match call("shape").expect_err("a number for a reason").kind {
        PluginErrorKind::InvalidJson { detail, .. } => {
            assert!(
                detail.starts_with("events[0].reason: invalid type: integer `3`"),
                "{detail}"
            )
        }
        other => panic!("{other:?}"),
    }
    let ok = call("anything").expect("a normal call after the failures");
    assert_eq!(ok.status, Some(json!({"ok": true})));
}

#[test]
fn an_instance_serves_call_after_call_and_keeps_nothing_between_them() {
    // One instance serves every call that ends well; globals are frozen, so nothing a call
    // does reaches the next, and a call that traps leaves a new instance for the next.
    let plugin = script(
        &("SEEN = []\nCOUNT = {\"n\": 0}\n".to_owned()
            + &with_reconcile(
                "    mode = req[\"settings\"]\n\
                 \x20   if mode == \"append\":\n\
                 \x20       SEEN.append(1)\n\
                 \x20   if mode == \"count\":\n\
                 \x20       COUNT[\"n\"] += 1\n\
                 \x20   if mode == \"loop\":\n\
                 \x20       for i in range(1 << 30):\n\
                 \x20           pass\n\
                 \x20   if mode == \"grow\":\n\
                 \x20       kept = [\"x\" * (1 << 20) + str(i) for i in range(1 << 20)]\n\
                 \x20   local = []\n\
                 \x20   local.append(len(SEEN))\n\
                 \x20   return {\"status\": {\"seen\": len(SEEN), \"count\": COUNT[\"n\"], \"local\": local}}",
            )),
    )
    .expect("loads");
    let call = |mode: &str| {
        let mut req = probe_request();
        req.settings = json!(mode);
        plugin.reconcile_blocking(&req)
    };
    let fresh = json!({"seen": 0, "count": 0, "local": [0]});
    assert_eq!(call("read").unwrap().status, Some(fresh.clone()));
    for mutation in ["append", "count"] {
        match call(mutation).expect_err("a frozen global").kind {
            PluginErrorKind::PluginFailed { message, .. } => {
                assert!(message.contains("plugin.star:"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            call("read").unwrap().status,
            Some(fresh.clone()),
            "after {mutation}"
        );
    }
    let kind = call("loop").expect_err("times out").kind;
    assert!(
        matches!(kind, PluginErrorKind::DeadlineExceeded { .. }),
        "{kind:?}"
    );
    assert_eq!(call("read").unwrap().status, Some(fresh.clone()));
    let kind = call("grow").expect_err("hits the cap").kind;
    assert!(
        matches!(kind, PluginErrorKind::MemoryCap { .. }),
        "{kind:?}"
    );
    for _ in 0..50 {
        assert_eq!(call("read").unwrap().status, Some(fresh.clone()));
    }
}

/// Runs `tests` (file name, text) against `source` as `wasmop test` does.
fn run_tests(source: &str, tests: &[(&str, &str)]) -> Result<Vec<TestOutcome>, PluginError> {
    let tests: Vec<TestFile> = tests
        .iter()
        .map(|(name, text)| TestFile {
            name: (*name).into(),
            source: (*text).into(),
        })
        .collect();
    let fixtures = json!({"sample.yaml": {"metadata": {"name": "m"}, "spec": {"size": 2}}});
    sandbox().test_script(
        Language::Starlark,
        "plugin.star",
        source,
        &tests,
        &fixtures,
        &LIMITS,
    )
}

fn verdicts(outcomes: &[TestOutcome]) -> Vec<(String, Option<String>)> {
    outcomes
        .iter()
        .map(|o| {
            let test = format!("{}:{}", o.file, o.test.as_deref().unwrap_or("-"));
            (test, o.failure.clone())
        })
        .collect()
}

#[test]
fn a_scripts_tests_run_beside_it_and_fail_alone_with_their_line() {
    let tests = "\
def request(size):
    return {\"parent\": {\"metadata\": {\"name\": \"m\"}, \"spec\": {\"size\": size}},
            \"children\": {\"Deployment.apps/v1\": {}}, \"related\": {}, \"settings\": None}

def test_passes():
    out = reconcile(request(FIXTURES[\"sample.yaml\"][\"spec\"][\"size\"]))
    assert_eq(out[\"children\"][0][\"spec\"][\"replicas\"], 2)

def test_compares():
    assert_eq(reconcile(request(1))[\"children\"][0][\"spec\"][\"replicas\"], 4, \"replicas\")

def test_the_script_fails():
    reconcile(request(-1))

def test_expects_a_failure():
    assert_fails(lambda: reconcile(request(-1)), \"spec.size must be\")
    assert_fails(lambda: reconcile(request(1)), \"spec.size must be\")

def test_loops():
    for i in range(1000000000):
        pass

def test_after_the_loop():
    assert_true(MANIFEST[\"name\"] == \"memcached\")

def helper_is_no_test():
    fail(\"never run\")
";
    let out = run_tests(
        MEMCACHED_STAR,
        &[("a_test.star", tests), ("b_test.star", "def test_x(:\n")],
    )
    .expect("the script loads");
    let got = verdicts(&out);
    let names: Vec<&str> = got.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        names,
        [
            "a_test.star:test_after_the_loop",
            "a_test.star:test_compares",
            "a_test.star:test_expects_a_failure",
            "a_test.star:test_loops",
            "a_test.star:test_passes",
            "a_test.star:test_the_script_fails",
            "b_test.star:-",
        ]
    );
    let failure = |i: usize| got[i].1.clone().unwrap_or_default();
    assert_eq!(
        got[0].1, None,
        "a test after a runaway one runs on a fresh instance"
    );
    assert_eq!(
        failure(1),
        "a_test.star:10:5: replicas: assert_eq: got 1, want 4"
    );
    assert!(
        failure(2).starts_with("a_test.star:17:5: assert_fails: the call returned {"),
        "{}",
        failure(2)
    );
    assert!(failure(3).contains("deadline"), "{}", failure(3));
    assert_eq!(got[4].1, None);
    assert!(
        failure(5).starts_with("plugin.star:") && failure(5).contains("spec.size must be ≥ 0"),
        "{}",
        failure(5)
    );
    assert!(failure(6).starts_with("b_test.star:1:"), "{}", failure(6));
}

#[test]
fn tests_of_a_script_that_does_not_load_do_not_run() {
    let err = run_tests(
        "MANIFEST = {\n",
        &[("a_test.star", "def test_a():\n    pass\n")],
    )
    .expect_err("a broken script fails the run");
    assert!(err.to_string().contains("plugin.star:"), "{err}");
}

#[test]
fn a_kept_instance_holds_its_memory_until_its_plugin_is_dropped() {
    // A sandbox of its own: the shared one's budget moves with the other tests.
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    assert_eq!(sandbox.memory_budget().in_use(), 0);
    let plugin = sandbox
        .load_script_blocking(
            Language::Starlark,
            "plugin.star",
            MEMCACHED_STAR.as_bytes(),
            LIMITS,
        )
        .expect("loads");
    let kept = sandbox.memory_budget().in_use();
    assert!(
        kept > 0,
        "the instance that loaded the script waits for a call"
    );
    for request in corpus().iter().take(10) {
        plugin.reconcile_blocking(request).expect("reconcile");
        assert!(
            sandbox.memory_budget().in_use() > 0,
            "the instance went back to wait for the next call"
        );
    }
    drop(plugin);
    assert_eq!(
        sandbox.memory_budget().in_use(),
        0,
        "a dropped plugin's instances are dropped with it"
    );
}

/// The interpreter is compiled once, but every load runs the script's top level again, under
/// the limits given then.
#[test]
fn every_load_runs_the_top_level_under_its_own_limits() {
    let source = "MANIFEST = {\"name\": \"slow\", \"version\": \"0.1.0\", \
         \"parent\": {\"apiVersion\": \"test.wasmop.io/v1\", \"kind\": \"Probe\"}}\n\
         def spin():\n    for i in range(10000000):\n        pass\n\
         spin()\n\
         def reconcile(req):\n    return {\"children\": []}\n";
    let generous = Limits {
        deadline: Duration::from_secs(30),
        ..LIMITS
    };
    let tight = Limits {
        deadline: Duration::from_millis(20),
        ..LIMITS
    };
    let loaded = script_with(source, generous).expect("loads with time to run its top level");
    assert_eq!(
        loaded.digest(),
        wasmop::sandbox::digest_of(source.as_bytes())
    );
    loaded
        .reconcile_blocking(&probe_request())
        .expect("the instance that ran the top level serves");
    let again = script_with(source, tight).expect_err("the top level runs again, too slow");
    assert!(
        matches!(
            again.kind,
            PluginErrorKind::DeadlineExceeded {
                call: Call::Init,
                ..
            }
        ),
        "{again}"
    );
}

#[test]
fn with_a_child_compiler_a_script_loads_and_fails_as_in_process() {
    let dir = std::env::temp_dir().join(format!("wasmop-script-child-{}", std::process::id()));
    let child = Sandbox::new(SandboxConfig {
        max_instances: 2,
        cache_dir: Some(dir.clone()),
        compiler: Compiler::Subprocess(env!("CARGO_BIN_EXE_wasmop").into()),
        ..SandboxConfig::default()
    })
    .unwrap();
    let load_with = |source: &str, limits| {
        child.load_script_blocking(Language::Starlark, "plugin.star", source.as_bytes(), limits)
    };
    let load = |source: &str| load_with(source, LIMITS);
    let plugin = load(MEMCACHED_STAR).expect("the child compiles the interpreter");
    let here = script(MEMCACHED_STAR).unwrap();
    for request in corpus().iter().take(20) {
        assert_eq!(
            plugin.reconcile_blocking(request).unwrap(),
            here.reconcile_blocking(request).unwrap()
        );
    }

    let fault = |source: &str| load(source).expect_err("the script should not load").kind;
    match fault("MANIFEST = {\n\"name\": \"x\",\n  def\n}\n") {
        PluginErrorKind::PluginFailed { call, message } => {
            assert_eq!(call, Call::Init);
            assert!(message.starts_with("plugin.star:3:"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let endless = fault("for i in range(1 << 30):\n    for j in range(1 << 30):\n        pass\n");
    assert_eq!(
        endless,
        PluginErrorKind::DeadlineExceeded {
            call: Call::Init,
            limit: LIMITS.deadline
        }
    );
    // Time enough that only the cap can stop it, on a busy machine too.
    let patient = Limits {
        deadline: Duration::from_secs(10),
        ..LIMITS
    };
    let hog = load_with(
        "kept = []\nfor i in range(1 << 20):\n    kept.append(\"x\" * (1 << 20))\n",
        patient,
    )
    .expect_err("the script should not load")
    .kind;
    assert_eq!(
        hog,
        PluginErrorKind::MemoryCap {
            call: Call::Init,
            limit: LIMITS.memory_bytes
        }
    );
    let _ = std::fs::remove_dir_all(&dir);
}
