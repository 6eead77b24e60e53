//! A plugin that misbehaves on request, for the sandbox tests.
//!
//! `reconcile` reads `settings.mode` and `related` reads the parent's `spec.mode`; without a
//! mode both behave. Written against the raw WIT bindings (not the SDK) so each failure is
//! exactly the one asked for.

use serde_json::{Value, json};

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{
    Guest, KindRef, PluginManifest, RelatedKind, RelatedSelector,
};
use wasmop::plugin::host::{Level, log};

struct Adversarial;

impl Guest for Adversarial {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "adversarial".into(),
            version: "0.1.0".into(),
            parent: KindRef {
                api_version: "test.wasmop.io/v1".into(),
                kind: "Probe".into(),
            },
            children: vec![
                KindRef {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                },
                // Only the `secret` mode writes one: for identities without Secret rights.
                KindRef {
                    api_version: "v1".into(),
                    kind: "Secret".into(),
                },
            ],
            related: vec![RelatedKind {
                api_version: "v1".into(),
                kind: "Pod".into(),
                metadata_only: true,
            }],
            finalizer: false,
            clock_seconds: None,
        }
    }

    fn related(parent: String) -> Result<Vec<RelatedSelector>, String> {
        install_panic_hook();
        let parent: Value = serde_json::from_str(&parent).map_err(|e| e.to_string())?;
        let name = parent["metadata"]["name"].as_str().unwrap_or("unnamed");
        let selector = |kind: &str, json: String| RelatedSelector {
            api_version: "v1".into(),
            kind: kind.into(),
            label_selector: json,
        };
        match parent["spec"]["mode"].as_str().unwrap_or("normal") {
            "undeclared" => Ok(vec![selector("Secret", "{}".into())]),
            "invalid-json" => Ok(vec![selector("Pod", "{matchLabels".into())]),
            "fail" => Err("related refuses".into()),
            "loop" => spin(),
            "flood" => Ok((0..100)
                .map(|i| {
                    selector(
                        "Pod",
                        json!({"matchLabels": {"n": i.to_string()}}).to_string(),
                    )
                })
                .collect()),
            _ => Ok(vec![selector(
                "Pod",
                json!({"matchLabels": {"app": name}}).to_string(),
            )]),
        }
    }

    fn reconcile(request: String) -> Result<String, String> {
        install_panic_hook();
        let req: Value = serde_json::from_str(&request).map_err(|e| e.to_string())?;
        let name = req["parent"]["metadata"]["name"]
            .as_str()
            .unwrap_or("unnamed")
            .to_owned();
        let mode = req["settings"]["mode"].as_str().unwrap_or("normal");
        let mut child = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name},
            "data": {"pods": req["related"]["Pod.v1"].as_object().map_or(0, |p| p.len()).to_string()},
        });
        match mode {
            "loop" => spin(),
            "memory" => hoard(),
            "stack" => {
                let depth = recurse(0);
                return Err(format!("came back from recursion at depth {depth}"));
            }
            "panic" => panic!("the guest panicked on purpose"),
            "abort" => {
                eprintln!("about to abort without a panic message");
                std::process::abort()
            }
            "fail" => return Err("the guest says no".into()),
            "invalid-json" => return Ok("{\"children\": [".into()),
            "huge" => {
                let bytes = req["settings"]["bytes"].as_u64().unwrap_or(5 << 20) as usize;
                child["data"]["blob"] = json!("x".repeat(bytes));
            }
            "other-namespace" => child["metadata"]["namespace"] = json!("elsewhere"),
            "undeclared" => child["kind"] = json!("Service"),
            // Its ConfigMap and an ordinary Secret beside it.
            "secret" => {
                let secret = json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name},
                    "stringData": {"note": "an ordinary Secret"},
                });
                return Ok(json!({"children": [child, secret]}).to_string());
            }
            // A token for the namespace's default ServiceAccount, to read back from `children`.
            "token" => {
                let token = json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "kubernetes.io/service-account-token",
                    "metadata": {
                        "name": format!("{name}-token"),
                        "annotations": {"kubernetes.io/service-account.name": "default"},
                    },
                });
                return Ok(json!({"children": [child, token]}).to_string());
            }
            "owner-ref" => {
                child["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Namespace", "name": "kube-system",
                    "uid": "forged", "controller": true,
                }]);
            }
            "log-flood" => {
                for i in 0..20_000 {
                    log(Level::Info, &format!("line {i}"));
                }
            }
            "log" => log(Level::Warn, "hello from the guest"),
            // A minute's sleep: it must neither hold the call past its deadline nor block.
            "sleep" => {
                let started = std::time::Instant::now();
                std::thread::sleep(std::time::Duration::from_secs(60));
                child["data"]["sleptNanos"] = json!(started.elapsed().as_nanos().to_string());
            }
            // Everything impure std offers: clocks and randomness.
            "impure" => {
                use std::hash::{BuildHasher, Hasher};
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
                hasher.write(b"x");
                let keys: Vec<String> = (0..16)
                    .map(|i| i.to_string())
                    .collect::<std::collections::HashSet<_>>()
                    .into_iter()
                    .collect();
                child["data"]["wallSeconds"] = json!(wall.to_string());
                child["data"]["hash"] = json!(hasher.finish().to_string());
                child["data"]["setOrder"] = json!(keys.join(","));
            }
            // Looks for what an earlier call left in a static, on the heap and on the stack.
            "remember" => {
                let (calls, stale) = remember();
                child["data"]["calls"] = json!(calls.to_string());
                child["data"]["staleBytes"] = json!(stale.to_string());
            }
            // `settings.count` copies of `settings.element` as children, written out as text:
            // a few bytes each, a million within the default response cap.
            "many" => {
                let element = req["settings"]["element"].as_str().unwrap_or("[0]");
                let count = req["settings"]["count"].as_u64().unwrap_or(1_000_000) as usize;
                let mut out = String::with_capacity(count * (element.len() + 1) + 16);
                out.push_str("{\"children\":[");
                for i in 0..count {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(element);
                }
                out.push_str("]}");
                return Ok(out);
            }
            "flood" => {
                let children: Vec<Value> = (0..10_000)
                    .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{name}-{i}")}}))
                    .collect();
                return Ok(json!({"children": children}).to_string());
            }
            _ => {}
        }
        let resp = json!({
            "children": [child],
            "status": {"mode": mode, "children": req["children"]["ConfigMap.v1"].as_object().map_or(0, |c| c.len())},
            "events": [{"type": "Normal", "reason": "Reconciled", "message": format!("mode {mode}")}],
        });
        Ok(resp.to_string())
    }
}

/// Sends panics to the host's log the way the SDK does: `panic: <msg> at <file:line>`.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info.payload_as_str().unwrap_or("a non-string panic");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        log(Level::Error, &format!("panic: {msg}{at}"));
    }));
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

fn hoard() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
    }
}

/// Counts this call in a static and returns the count with how many bytes of a fresh heap
/// block (memory the call grows) and of a fresh stack buffer (memory the module starts with)
/// still hold the mark an earlier call wrote there; 1 and 0 when every call starts clean.
fn remember() -> (u32, usize) {
    use std::alloc::{Layout, alloc, dealloc};
    use std::mem::MaybeUninit;
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const MARK: u8 = 0xa5;
    /// Counts the bytes of `block` that hold `MARK`, then marks them all.
    ///
    /// SAFETY: `block` is valid for `len` bytes; reading them before writing is the point
    /// (wasm memory is always initialised bytes).
    unsafe fn stale_then_mark(block: *mut u8, len: usize) -> usize {
        let stale = (0..len)
            .filter(|&i| unsafe { std::ptr::read_volatile(block.add(i)) } == MARK)
            .count();
        unsafe { std::ptr::write_bytes(block, MARK, len) };
        stale
    }
    let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
    let layout = Layout::from_size_align(512 << 10, 16).expect("layout");
    let mut stack = MaybeUninit::<[u8; 384 << 10]>::uninit();
    // SAFETY: the heap block is allocated with `layout` and freed with it; the stack buffer
    // lives to the end of this function; each is touched only within its length.
    let stale = unsafe {
        let block = alloc(layout);
        assert!(!block.is_null(), "out of memory");
        let heap = stale_then_mark(block, layout.size());
        dealloc(block, layout);
        heap + stale_then_mark(stack.as_mut_ptr().cast(), 384 << 10)
    };
    std::hint::black_box(&stack);
    (calls, stale)
}

fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 32]);
    if frame[0] == u64::MAX {
        return 0;
    }
    recurse(depth + 1) + frame[1]
}

export!(Adversarial);
