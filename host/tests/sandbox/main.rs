//! The sandbox against real components: adversarial guests built from `tests/guests/` and the
//! Memcached plugin. Every failure must come out as its own error kind, and the plugin must
//! serve a normal call right after.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop::gather::{self, ObjectList};
use wasmop::kinds::Scope;
use wasmop::sandbox::{
    Call, Compiler, KEEP_RESIDENT, Limits, Plugin, PluginError, PluginErrorKind, Sandbox,
    SandboxConfig,
};
use wasmop::validate::{self, Target, ValidationError};
use wasmop_contract::KindRef;
use wasmop_contract::wire::WireRequest;

mod scripts;

/// Test limits: short enough to keep the suite fast.
const LIMITS: Limits = Limits {
    deadline: Duration::from_millis(300),
    memory_bytes: 32 << 20,
    response_bytes: 1 << 20,
};

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        Sandbox::new(SandboxConfig {
            max_instances: 8,
            cache_dir: None,
            // Room for every test's calls at once; the budget has a test of its own.
            memory_budget: 1 << 30,
            ..SandboxConfig::default()
        })
        .expect("sandbox")
    })
}

/// A sandbox of its own with `max_instances` slots, no disk cache, defaults otherwise.
fn pool_of(max_instances: u32) -> Sandbox {
    Sandbox::new(SandboxConfig {
        max_instances,
        cache_dir: None,
        ..SandboxConfig::default()
    })
    .expect("sandbox")
}

fn adversarial() -> Plugin {
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    sandbox()
        .load_blocking(&wasm, LIMITS)
        .expect("adversarial loads")
}

fn parent(mode: &str) -> Value {
    json!({
        "apiVersion": "test.wasmop.io/v1", "kind": "Probe",
        "metadata": {"name": "probe", "namespace": "ns", "uid": "u-1"},
        "spec": {"mode": mode}
    })
}

fn request(mode: &str) -> WireRequest {
    WireRequest {
        parent: parent("normal"),
        settings: json!({"mode": mode}),
        ..WireRequest::default()
    }
}

fn reconcile_err(plugin: &Plugin, mode: &str) -> PluginError {
    let err = plugin
        .reconcile_blocking(&request(mode))
        .expect_err("the call should fail");
    assert_eq!(err.plugin, "adversarial");
    assert_eq!(err.digest, plugin.digest());
    err
}

/// The plugin still answers a normal call.
fn assert_still_works(plugin: &Plugin) {
    let resp = plugin
        .reconcile_blocking(&request("normal"))
        .expect("a normal call after a failure");
    assert_eq!(resp.children.len(), 1);
    assert_eq!(resp.status.unwrap()["mode"], "normal");
}

#[test]
fn loads_and_answers() {
    let plugin = adversarial();
    let m = plugin.manifest();
    assert_eq!(m.name, "adversarial");
    assert_eq!(m.parent, KindRef::new("test.wasmop.io/v1", "Probe"));
    assert!(plugin.digest().starts_with("sha256:") && plugin.digest().len() == 71);
    assert_eq!(
        plugin.size(),
        test_artifacts::read(test_artifacts::ADVERSARIAL).len()
    );
    assert_eq!(plugin.limits(), &LIMITS);

    let selectors = plugin.related_blocking(&parent("normal")).unwrap();
    assert_eq!(selectors.len(), 1);
    assert_eq!(selectors[0].kind, KindRef::new("v1", "Pod"));
    assert_eq!(
        selectors[0].label_selector.match_labels.as_ref().unwrap()["app"],
        "probe"
    );
    assert_still_works(&plugin);
}

#[test]
fn infinite_loop_hits_the_deadline() {
    let plugin = adversarial();
    let start = Instant::now();
    let err = reconcile_err(&plugin, "loop");
    let took = start.elapsed();
    assert_eq!(
        err.kind,
        PluginErrorKind::DeadlineExceeded {
            call: Call::Reconcile,
            limit: LIMITS.deadline
        }
    );
    assert_eq!(err.reason(), "DeadlineExceeded");
    assert!(took >= LIMITS.deadline, "interrupted after {took:?}");
    assert!(took < Duration::from_secs(10), "interrupted after {took:?}");
    assert!(
        err.to_string().starts_with("plugin adversarial (sha256:"),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("deadline of 300ms exceeded in reconcile"),
        "{err}"
    );
    assert_still_works(&plugin);
}

#[test]
fn loop_in_related_hits_the_deadline() {
    let plugin = adversarial();
    let err = plugin.related_blocking(&parent("loop")).unwrap_err();
    assert!(
        matches!(
            err.kind,
            PluginErrorKind::DeadlineExceeded {
                call: Call::Related,
                ..
            }
        ),
        "{err}"
    );
    assert_still_works(&plugin);
}

#[test]
fn memory_bomb_hits_the_cap() {
    let plugin = adversarial();
    let err = reconcile_err(&plugin, "memory");
    assert_eq!(
        err.kind,
        PluginErrorKind::MemoryCap {
            call: Call::Reconcile,
            limit: LIMITS.memory_bytes
        },
        "{err}"
    );
    assert_eq!(err.reason(), "MemoryLimitExceeded");
    assert!(
        err.to_string().contains("memory limit of 32 MiB exceeded"),
        "{err}"
    );
    assert_still_works(&plugin);
}

#[test]
fn panic_is_a_trap_with_the_guest_message() {
    let plugin = adversarial();
    let err = reconcile_err(&plugin, "panic");
    let PluginErrorKind::Trap {
        call,
        guest_message,
        ..
    } = &err.kind
    else {
        panic!("expected a trap, got {err}");
    };
    assert_eq!(*call, Call::Reconcile);
    let guest = guest_message.as_deref().unwrap_or_default();
    assert!(
        guest.starts_with("the guest panicked on purpose at "),
        "{guest}"
    );
    assert!(guest.contains("src/lib.rs:"), "{guest}");
    assert_eq!(err.reason(), "PluginTrapped");
    assert_still_works(&plugin);
}

#[test]
fn abort_keeps_the_stderr_tail() {
    let plugin = adversarial();
    let err = reconcile_err(&plugin, "abort");
    let PluginErrorKind::Trap { guest_message, .. } = &err.kind else {
        panic!("expected a trap, got {err}");
    };
    assert_eq!(
        guest_message.as_deref(),
        Some("about to abort without a panic message")
    );
    assert_still_works(&plugin);
}

#[test]
fn stack_overflow_is_a_trap() {
    let plugin = adversarial();
    let err = reconcile_err(&plugin, "stack");
    // Rust's shadow stack lives in linear memory: running off it is an out-of-bounds access
    // (or a wasm stack overflow, depending on frame sizes). A trap either way.
    assert!(matches!(err.kind, PluginErrorKind::Trap { .. }), "{err}");
    assert_still_works(&plugin);
}

#[test]
fn huge_response_is_refused_before_parsing() {
    let plugin = adversarial();
    let mut req = request("huge");
    req.settings["bytes"] = json!(2 << 20);
    let err = plugin.reconcile_blocking(&req).unwrap_err();
    let PluginErrorKind::ResponseTooLarge { call, size, limit } = err.kind else {
        panic!("expected ResponseTooLarge, got {err}");
    };
    assert_eq!((call, limit), (Call::Reconcile, LIMITS.response_bytes));
    assert!(size > 2 << 20, "{size}");
    assert_eq!(err.reason(), "ResponseTooLarge");
    assert_still_works(&plugin);
}

#[test]
fn invalid_json_is_reported() {
    let plugin = adversarial();
    let err = reconcile_err(&plugin, "invalid-json");
    assert!(
        matches!(
            err.kind,
            PluginErrorKind::InvalidJson {
                call: Call::Reconcile,
                ..
            }
        ),
        "{err}"
    );
    let err = plugin
        .related_blocking(&parent("invalid-json"))
        .unwrap_err();
    assert!(
        matches!(
            err.kind,
            PluginErrorKind::InvalidJson {
                call: Call::Related,
                ..
            }
        ),
        "{err}"
    );
    assert_still_works(&plugin);
}

#[test]
fn guest_errors_are_plugin_failures() {
    let plugin = adversarial();
    let err = reconcile_err(&plugin, "fail");
    assert_eq!(
        err.kind,
        PluginErrorKind::PluginFailed {
            call: Call::Reconcile,
            message: "the guest says no".into()
        }
    );
    assert_eq!(err.reason(), "PluginFailed");
    let err = plugin.related_blocking(&parent("fail")).unwrap_err();
    assert!(matches!(
        err.kind,
        PluginErrorKind::PluginFailed {
            call: Call::Related,
            ..
        }
    ));
    assert_still_works(&plugin);
}

#[test]
fn selector_for_an_undeclared_kind_is_refused() {
    let plugin = adversarial();
    let err = plugin.related_blocking(&parent("undeclared")).unwrap_err();
    let PluginErrorKind::InvalidOutput { call, detail } = &err.kind else {
        panic!("expected InvalidOutput, got {err}");
    };
    assert_eq!(*call, Call::Related);
    assert!(detail.contains("v1 Secret"), "{detail}");
    assert_still_works(&plugin);
}

#[test]
fn a_flood_of_selectors_is_refused() {
    let plugin = adversarial();
    let err = plugin.related_blocking(&parent("flood")).unwrap_err();
    let PluginErrorKind::InvalidOutput { call, detail } = &err.kind else {
        panic!("expected InvalidOutput, got {err}");
    };
    assert_eq!(*call, Call::Related);
    assert_eq!(detail, "100 selectors; at most 32 per parent");
    assert_still_works(&plugin);
}

#[test]
fn a_flood_of_children_is_refused_whole() {
    let err = validation_error("flood");
    assert_eq!(err.violations.len(), 1, "{err}");
    assert_eq!(err.violations[0].subject, "children");
    assert_eq!(
        err.violations[0].rule,
        "10000 children; at most 500 per response"
    );
}

#[test]
fn a_sleep_returns_at_once_and_the_clock_does_not_move() {
    let plugin = adversarial();
    let started = Instant::now();
    let resp = plugin.reconcile_blocking(&request("sleep")).unwrap();
    // The guest asked for a minute; the call ends long before (a real wait would block here,
    // out of the deadline's reach).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(resp.children[0]["data"]["sleptNanos"], "0");
    assert_still_works(&plugin);
}

#[test]
fn clocks_and_randomness_are_deterministic() {
    let plugin = adversarial();
    let req = request("impure");
    let first = serde_json::to_string(&plugin.reconcile_blocking(&req).unwrap()).unwrap();
    let second = serde_json::to_string(&plugin.reconcile_blocking(&req).unwrap()).unwrap();
    assert_eq!(first, second, "same input, same output, byte for byte");
    let resp: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(
        resp["children"][0]["data"]["wallSeconds"], "946684800",
        "2000-01-01"
    );
}

#[test]
fn nothing_a_call_leaves_in_memory_reaches_the_next() {
    // Freed slots keep their pages resident and are reset in place, and memory a call grew is
    // unmapped; the next call on the same slot (the same plugin takes it first) must still
    // see the module's initial memory.
    let plugin = adversarial();
    let req = request("remember");
    for call in 1..=20 {
        let resp = plugin.reconcile_blocking(&req).expect("remember");
        let data = &resp.children[0]["data"];
        assert_eq!(
            data["calls"], "1",
            "call {call} saw an earlier call's static"
        );
        assert_eq!(
            data["staleBytes"], "0",
            "call {call} saw an earlier call's heap or stack"
        );
    }
}

#[test]
fn a_freed_slot_keeps_its_touched_pages_up_to_the_bound() {
    // A pool of one: every call takes the same slot.
    let sandbox = pool_of(1);
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    let plugin = sandbox.load_blocking(&wasm, LIMITS).expect("loads");
    plugin
        .reconcile_blocking(&request("normal"))
        .expect("normal");
    let small = sandbox.pool_resident_bytes();
    assert!(small > 0, "a small call's pages are kept for the next");
    // This call also touches a 384 KiB stack buffer, inside the memory the module starts
    // with: exactly KEEP_RESIDENT of the memory stays (the guest's table adds a few KiB).
    plugin
        .reconcile_blocking(&request("remember"))
        .expect("remember");
    let big = sandbox.pool_resident_bytes();
    assert!(
        (KEEP_RESIDENT..=KEEP_RESIDENT + (64 << 10)).contains(&big),
        "kept {big} bytes after a call that touched more than {KEEP_RESIDENT} \
         ({small} after a small one)"
    );
}

/// A sandbox of two instances whose calls may hold `bytes` of memory together.
fn budgeted(bytes: u64) -> Sandbox {
    Sandbox::new(SandboxConfig {
        max_instances: 2,
        cache_dir: None,
        memory_budget: bytes,
        ..SandboxConfig::default()
    })
    .unwrap()
}

#[test]
fn the_hosts_memory_budget_bounds_a_plugin_whatever_its_cap() {
    // A plugin allowed 64 MiB in a host whose calls may hold 24 MiB together.
    let sandbox = budgeted(24 << 20);
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    let limits = Limits {
        memory_bytes: 64 << 20,
        ..LIMITS
    };
    let plugin = sandbox.load_blocking(&wasm, limits).unwrap();
    let err = plugin.reconcile_blocking(&request("memory")).unwrap_err();
    let PluginErrorKind::Internal(detail) = &err.kind else {
        panic!("expected the host's budget, got {err}");
    };
    assert_eq!(
        detail,
        "the host's sandbox memory budget (24 MiB) was taken by other calls"
    );
    assert_eq!(
        sandbox.memory_budget().in_use(),
        0,
        "given back when the call ends"
    );
    plugin.reconcile_blocking(&request("normal")).unwrap();
    assert_eq!(sandbox.memory_budget().in_use(), 0);
}

/// A `many` request: `count` copies of `element` as the response's children.
fn many(element: &str, count: u64) -> WireRequest {
    let mut req = request("many");
    req.settings["element"] = json!(element);
    req.settings["count"] = json!(count);
    req
}

/// Set in the process [`a_million_values_are_refused_before_parsing_within_the_budget`]
/// starts to measure itself alone.
const MEASURE_ALONE: &str = "WASMOP_TEST_MEASURE_ALONE";

/// A `/proc/self/status` field in KiB, as bytes.
fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: u64 = line
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("a size in kB");
    kib << 10
}

#[test]
fn a_million_values_are_refused_before_parsing_within_the_budget() {
    if std::env::var_os(MEASURE_ALONE).is_none() {
        // The other tests of this binary run in threads beside this one and would move the
        // process's peak: run this one again, alone, in a process of its own.
        let name = "a_million_values_are_refused_before_parsing_within_the_budget";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(MEASURE_ALONE, "1")
            .output()
            .expect("running this test alone");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "alone, it failed:\n{text}");
        assert!(text.contains("1 passed"), "it did not run alone:\n{text}");
        return;
    }
    const BUDGET: u64 = 48 << 20;
    let sandbox = budgeted(BUDGET);
    // The default response cap: a million `[0]` are 4,000,000 bytes, within it.
    let limits = Limits {
        response_bytes: Limits::default().response_bytes,
        ..LIMITS
    };
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    let plugin = sandbox.load_blocking(&wasm, limits).unwrap();
    // Warm every path first, so the peak below is the big call's alone.
    let small = plugin.reconcile_blocking(&many("[0]", 1000)).unwrap();
    assert_eq!(small.children.len(), 1000);
    drop(small);

    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak RSS");
    let before = proc_status_bytes("VmRSS");
    let result = plugin.reconcile_blocking(&many("[0]", 1_000_000));
    let growth = proc_status_bytes("VmHWM").saturating_sub(before);
    eprintln!("peak RSS grew by {} KiB during the call", growth >> 10);

    // What the call may add: the guest's linear memory, which the budget bounds, and the
    // host's copy of the response (at most the 4 MiB cap), with 12 MiB to spare for the
    // allocator and the call's thread. Parsing these 4 MB into values would take about
    // 190 MiB on its own (186 bytes per `[0]`, measured).
    let bound = BUDGET + limits.response_bytes + (12 << 20);
    assert!(
        growth < bound,
        "peak RSS grew by {} MiB, more than {} MiB",
        growth >> 20,
        bound >> 20
    );
    let err = result.expect_err("a million values are refused");
    assert_eq!(
        err.kind,
        PluginErrorKind::InvalidJson {
            call: Call::Reconcile,
            detail: "2000003 JSON values (object keys included); the host parses at most \
                     250000 per response, so it was not parsed"
                .into(),
        },
        "{err}"
    );
    assert_eq!(err.reason(), "InvalidPluginJson");
    assert!(
        err.to_string().starts_with("plugin adversarial (sha256:"),
        "{err}"
    );
    assert_eq!(sandbox.memory_budget().in_use(), 0, "all given back");
}

#[test]
fn a_response_nested_past_the_bound_is_refused_before_parsing() {
    let plugin = adversarial();
    // Inside `{"children":[…]}`: two levels more.
    let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
    let err = plugin.reconcile_blocking(&many(&deep, 1)).unwrap_err();
    assert_eq!(
        err.kind,
        PluginErrorKind::InvalidJson {
            call: Call::Reconcile,
            detail: "nested 72 deep (past 64 at byte 75); the host parses at most 64 levels, \
                     so it was not parsed"
                .into(),
        },
        "{err}"
    );
    let at_bound = format!("{}{}", "[".repeat(62), "]".repeat(62));
    let resp = plugin.reconcile_blocking(&many(&at_bound, 1)).unwrap();
    assert_eq!(resp.children.len(), 1);
    assert_still_works(&plugin);
}

#[test]
fn parsing_a_response_draws_from_the_hosts_memory_budget() {
    let sandbox = budgeted(24 << 20);
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    let plugin = sandbox.load_blocking(&wasm, LIMITS).unwrap();
    // 200,003 values, within the bound, but about 33 MiB to parse: more than the whole budget.
    let err = plugin
        .reconcile_blocking(&many("[0]", 100_000))
        .unwrap_err();
    let PluginErrorKind::Internal(detail) = &err.kind else {
        panic!("expected the host's budget, got {err}");
    };
    assert!(
        detail.starts_with("parsing the response from reconcile (200003 values) takes about "),
        "{detail}"
    );
    assert!(
        detail.ends_with(", more than the host's whole sandbox memory budget (24 MiB)"),
        "{detail}"
    );
    assert_eq!(sandbox.memory_budget().in_use(), 0);
    // Half as many fit, and the budget is whole again once the response is handed over.
    let resp = plugin.reconcile_blocking(&many("[0]", 50_000)).unwrap();
    assert_eq!(resp.children.len(), 50_000);
    assert_eq!(sandbox.memory_budget().in_use(), 0);
    // A host with more budget parses the bigger one.
    let resp = adversarial()
        .reconcile_blocking(&many("[0]", 100_000))
        .unwrap();
    assert_eq!(resp.children.len(), 100_000);
}

#[test]
fn log_flood_is_bounded_and_the_call_succeeds() {
    let plugin = adversarial();
    let resp = plugin.reconcile_blocking(&request("log-flood")).unwrap();
    assert_eq!(resp.status.unwrap()["mode"], "log-flood");
}

/// Children the host must refuse, through the same `validate` the controller uses.
fn validation_error(mode: &str) -> ValidationError {
    let plugin = adversarial();
    let parent = parent("normal");
    let resp = plugin.reconcile_blocking(&request(mode)).unwrap();
    let err = validate::validate(
        &Target {
            manifest: plugin.manifest(),
            parent: &parent,
            scope_of: &|_| None,
            parent_scope: Scope::Namespaced,
        },
        resp,
    )
    .expect_err("validation should fail");
    assert_still_works(&plugin);
    err
}

#[test]
fn child_in_another_namespace_is_refused() {
    let err = validation_error("other-namespace");
    assert_eq!(err.violations.len(), 1, "{err}");
    assert_eq!(err.violations[0].subject, "child #0 (v1 ConfigMap probe)");
    assert!(
        err.violations[0]
            .rule
            .contains("\"elsewhere\" is not the parent's"),
        "{err}"
    );
}

#[test]
fn undeclared_child_kind_is_refused() {
    let err = validation_error("undeclared");
    assert_eq!(err.violations.len(), 1, "{err}");
    assert!(
        err.violations[0]
            .rule
            .contains("v1 Service is not a child kind"),
        "{err}"
    );
}

#[test]
fn forged_owner_reference_is_refused() {
    let err = validation_error("owner-ref");
    assert_eq!(err.violations.len(), 1, "{err}");
    assert!(
        err.violations[0]
            .rule
            .contains("the host sets owner references itself"),
        "{err}"
    );
}

#[test]
fn wrong_interface_version_fails_at_load() {
    let wasm = test_artifacts::read(test_artifacts::WRONG_VERSION);
    let err = sandbox().load_blocking(&wasm, LIMITS).unwrap_err();
    let PluginErrorKind::WrongInterface(detail) = &err.kind else {
        panic!("expected WrongInterface, got {err}");
    };
    assert!(
        detail.contains("wasmop:plugin/reconciler@0.2.0"),
        "{detail}"
    );
    assert_eq!(err.plugin, "<unknown>");
    assert_eq!(err.reason(), "WrongInterface");
}

#[test]
fn core_modules_and_garbage_are_not_components() {
    // The smallest valid core module: magic and version 1.
    let core = b"\0asm\x01\0\0\0";
    let err = sandbox().load_blocking(core, LIMITS).unwrap_err();
    let PluginErrorKind::NotAComponent(detail) = &err.kind else {
        panic!("expected NotAComponent, got {err}");
    };
    assert!(detail.contains("core WebAssembly module"), "{detail}");

    let err = sandbox()
        .load_blocking(b"#!/bin/sh\necho not wasm\n", LIMITS)
        .unwrap_err();
    assert!(
        matches!(err.kind, PluginErrorKind::NotAComponent(_)),
        "{err}"
    );
    assert_eq!(err.reason(), "NotAComponent");

    // A component header followed by nonsense.
    let mut broken = test_artifacts::read(test_artifacts::ADVERSARIAL);
    broken.truncate(broken.len() / 2);
    let err = sandbox().load_blocking(&broken, LIMITS).unwrap_err();
    assert!(
        matches!(err.kind, PluginErrorKind::NotAComponent(_)),
        "{err}"
    );
}

#[test]
fn bad_manifest_is_refused_at_load() {
    let wasm = test_artifacts::read(test_artifacts::BAD_MANIFEST);
    let err = sandbox().load_blocking(&wasm, LIMITS).unwrap_err();
    let PluginErrorKind::InvalidManifest(detail) = &err.kind else {
        panic!("expected InvalidManifest, got {err}");
    };
    assert!(detail.contains("name \"Bad_Name\""), "{detail}");
    assert!(detail.contains("is the parent kind"), "{detail}");
    assert_eq!(err.plugin, "Bad_Name");
}

#[test]
fn async_calls_run_concurrently_on_a_small_pool() {
    let sandbox = pool_of(2);
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let plugin = sandbox.load(wasm, LIMITS).await.unwrap();
        let calls = (0..16).map(|i| {
            let plugin = plugin.clone();
            let mode = if i % 4 == 0 { "panic" } else { "normal" };
            async move { (mode, plugin.reconcile(&request(mode)).await) }
        });
        for (mode, result) in futures::future::join_all(calls).await {
            match mode {
                "panic" => assert!(matches!(
                    result.unwrap_err().kind,
                    PluginErrorKind::Trap { .. }
                )),
                _ => assert_eq!(result.unwrap().children.len(), 1),
            }
        }
        let selectors = plugin.related(&parent("normal")).await.unwrap();
        assert_eq!(selectors.len(), 1);
    });
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn guest_logs_land_in_the_callers_span() {
    let plugin = adversarial();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("reconcile_probe", object = "ns/probe");
        let _entered = span.enter();
        runtime.block_on(plugin.reconcile(&request("log"))).unwrap();
        plugin.reconcile_blocking(&request("log")).unwrap();
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("hello from the guest"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for line in lines {
        assert!(line.contains("WARN"), "{line}");
        assert!(
            line.contains("reconcile_probe{object=\"ns/probe\"}"),
            "{line}"
        );
        assert!(line.contains("wasmop::plugin"), "{line}");
        assert!(line.contains("adversarial"), "{line}");
    }
}

#[test]
fn disk_cache_survives_restarts_and_corruption() {
    let dir = std::env::temp_dir().join(format!("wasmop-sandbox-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = SandboxConfig {
        max_instances: 2,
        cache_dir: Some(dir.clone()),
        ..SandboxConfig::default()
    };
    let wasm = test_artifacts::read(test_artifacts::ADVERSARIAL);
    let first = Sandbox::new(config.clone()).unwrap();
    let plugin = first.load_blocking(&wasm, LIMITS).unwrap();
    let hex = &plugin.digest()["sha256:".len()..];

    let engine_dirs: Vec<_> = std::fs::read_dir(dir.join("components"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(engine_dirs.len(), 1);
    let artifact = engine_dirs[0].join(format!("{hex}.cwasm"));
    let checksum = engine_dirs[0].join(format!("{hex}.cwasm.sha256"));
    assert!(artifact.is_file() && checksum.is_file());

    // A new engine of the same configuration reads the artifact back.
    let second = Sandbox::new(config.clone()).unwrap();
    assert_still_works(&second.load_blocking(&wasm, LIMITS).unwrap());

    // A flipped byte fails the checksum: the plugin is recompiled and the file rewritten.
    let mut bytes = std::fs::read(&artifact).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&artifact, &bytes).unwrap();
    let third = Sandbox::new(config).unwrap();
    assert_still_works(&third.load_blocking(&wasm, LIMITS).unwrap());
    assert_ne!(
        std::fs::read(&artifact).unwrap(),
        bytes,
        "artifact rewritten"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn memcached_reconciles_a_cr_with_three_pods() {
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
    let plugin = sandbox().load_blocking(&wasm, Limits::default()).unwrap();
    let m = plugin.manifest();
    assert_eq!(m.name, "memcached");
    assert_eq!(
        m.parent,
        KindRef::new("cache.example.com/v1alpha1", "Memcached")
    );

    let cr = json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "mc", "namespace": "demo", "uid": "u-mc", "generation": 2},
        "spec": {"size": 3}
    });
    let selectors = plugin.related_blocking(&cr).unwrap();
    assert_eq!(selectors.len(), 1);
    let labels = selectors[0].label_selector.match_labels.clone().unwrap();
    let mut observed: Vec<Value> = ["mc-c", "mc-a", "mc-b"]
        .iter()
        .map(|name| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": "demo", "labels": labels},
                   "spec": {"containers": [{"name": "memcached", "image": "memcached"}]}})
        })
        .collect();
    // A pod of another Memcached is not gathered.
    observed.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "other-0", "namespace": "demo",
                     "labels": {"app": "memcached", "memcached_cr": "other"}}}));

    let req = gather::request(
        m,
        &cr,
        Scope::Namespaced,
        &selectors,
        &ObjectList::new(observed),
        &Value::Null,
        false,
    );
    assert_eq!(req.related["Pod.v1"].len(), 3);
    let resp = plugin.reconcile_blocking(&req).unwrap();
    let validated = validate::validate(
        &Target {
            manifest: m,
            parent: &cr,
            scope_of: &|_| None,
            parent_scope: Scope::Namespaced,
        },
        resp,
    )
    .unwrap();
    assert_eq!(validated.children.len(), 1);
    let deployment = &validated.children[0];
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["metadata"]["name"], "mc");
    assert_eq!(deployment["metadata"]["namespace"], "demo");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let status = validated.status.unwrap();
    assert_eq!(status["nodes"], json!(["mc-a", "mc-b", "mc-c"]));
    assert_eq!(validated.events[0].reason, "Created");
}

#[test]
fn a_compile_past_its_deadline_fails_the_load() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
    // No time at all, and nothing cached: a real compile takes far longer than the timer's
    // one-millisecond tick.
    let hurried = Sandbox::new(SandboxConfig {
        max_instances: 1,
        cache_dir: None,
        compile_timeout: Duration::ZERO,
        ..SandboxConfig::default()
    })
    .unwrap();
    runtime.block_on(async {
        let err = hurried.load(wasm.clone(), LIMITS).await.unwrap_err();
        assert_eq!(err.kind.reason(), "NotAComponent", "{err}");
        assert!(
            err.to_string()
                .contains("compiling took longer than 0ns; it was abandoned"),
            "{err}"
        );
    });
    // The same module with time to spare loads.
    let patient = pool_of(1);
    runtime.block_on(async {
        let plugin = patient.load(wasm, LIMITS).await.unwrap();
        assert_eq!(plugin.manifest().name, "memcached");
    });
}

#[test]
fn a_compile_in_a_child_process_loads_says_why_it_failed_and_is_stopped_at_its_deadline() {
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
    let in_child = |compile_timeout| {
        Sandbox::new(SandboxConfig {
            max_instances: 2,
            cache_dir: None,
            compile_timeout,
            compiler: Compiler::Subprocess(env!("CARGO_BIN_EXE_wasmop").into()),
            ..SandboxConfig::default()
        })
        .unwrap()
    };
    let plugin = in_child(Duration::from_secs(60))
        .load_blocking(&wasm, LIMITS)
        .expect("compiled in a child");
    assert_eq!(plugin.manifest().name, "memcached");
    let memcached = json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "mc", "namespace": "ns", "uid": "u-1"}, "spec": {"size": 1}
    });
    let selectors = plugin.related_blocking(&memcached).expect("it answers");
    assert_eq!(selectors.len(), 1);

    // A component header on garbage: the child's own message comes back.
    let garbage = [&b"\0asm\x0d\0\x01\0"[..], b"garbage"].concat();
    let err = in_child(Duration::from_secs(60))
        .load_blocking(&garbage, LIMITS)
        .unwrap_err();
    assert_eq!(err.kind.reason(), "NotAComponent", "{err}");
    assert!(err.to_string().contains("failed to parse"), "{err}");

    // No time at all: the child is killed, not left running.
    let err = in_child(Duration::from_millis(1))
        .load_blocking(&wasm, LIMITS)
        .unwrap_err();
    assert!(
        err.to_string().contains("the compiler was stopped"),
        "{err}"
    );
}
