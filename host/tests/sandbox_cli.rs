//! `wasmop render`, `inspect` and `test`, run as the built binary on the Memcached plugin and
//! the sample in `deploy/samples/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::{Value, json};

fn wasmop(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmop"))
        .args(args)
        // Keep the user's artifact cache out of it.
        .env("XDG_CACHE_HOME", scratch("xdg"))
        .output()
        .expect("running wasmop")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wasmop-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "wasmop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn sample() -> PathBuf {
    test_artifacts::workspace_root().join("deploy/samples/memcached.yaml")
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// One line on stderr, `error: …`, a non-zero exit, nothing on stdout.
fn assert_one_line_error(out: &Output, needles: &[&str]) {
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn render_memcached_sample_with_pods() {
    let plugin = Path::new(test_artifacts::MEMCACHED);
    let sample_yaml: Value =
        serde_yaml::from_str(&std::fs::read_to_string(sample()).unwrap()).unwrap();
    let name = sample_yaml["metadata"]["name"].as_str().unwrap().to_owned();
    let namespace = sample_yaml["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let size = sample_yaml["spec"]["size"].as_i64().unwrap();

    // Three pods in one multi-document file, one unrelated pod in a second file.
    let observed = scratch("observed");
    let pods: Vec<String> = (0..3)
        .map(|i| {
            serde_yaml::to_string(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{name}-{i}"), "namespace": namespace,
                             "labels": {"app": "memcached", "memcached_cr": name}},
            }))
            .unwrap()
        })
        .collect();
    std::fs::write(observed.join("pods.yaml"), pods.join("---\n")).unwrap();
    std::fs::write(
        observed.join("other.json"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "stray", "namespace": namespace, "labels": {"app": "web"}}})
        .to_string(),
    )
    .unwrap();
    std::fs::write(observed.join("notes.txt"), "ignored").unwrap();

    let out = wasmop(&[
        "render",
        "--plugin",
        path_str(plugin),
        "--parent",
        path_str(&sample()),
        "--observed",
        path_str(&observed),
    ]);
    let text = stdout(&out);
    assert!(
        text.starts_with("# wasmop render: plugin memcached "),
        "{text}"
    );
    let docs = documents(&text);
    assert!(docs.len() >= 2, "{text}");

    let deployment = &docs[0];
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["metadata"]["name"], name.as_str());
    assert_eq!(deployment["metadata"]["namespace"], namespace.as_str());
    assert_eq!(deployment["spec"]["replicas"], size);
    // What the host adds: its controller reference, its label, the desired-object hash.
    let owner = &deployment["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Memcached");
    assert_eq!(owner["name"], name.as_str());
    assert_eq!(owner["controller"], true);
    assert_eq!(
        deployment["metadata"]["labels"]["wasmop.io/managed-by"],
        "memcached"
    );
    assert!(deployment["metadata"]["annotations"]["wasmop.io/desired-hash"].is_string());

    let result = &docs[1];
    assert_eq!(result["apiVersion"], "render.wasmop.io/v1");
    assert_eq!(result["kind"], "Result");
    assert_eq!(result["fieldManager"], "wasmop/memcached");
    let nodes: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    assert_eq!(result["pluginStatus"]["nodes"], json!(nodes));
    // The status the host writes: the plugin's, with its own fields.
    assert_eq!(result["status"]["nodes"], json!(nodes));
    let ready = result["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .starts_with("reconciled by memcached ")
    );

    let events: Vec<&Value> = docs[2..].iter().filter(|d| d["kind"] == "Event").collect();
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["reason"], "Created");
    assert_eq!(events[0]["type"], "Normal");
}

#[test]
fn inspect_memcached() {
    let plugin = Path::new(test_artifacts::MEMCACHED);
    let text = stdout(&wasmop(&["inspect", path_str(plugin)]));
    let report: Value = serde_yaml::from_str(&text).unwrap();
    let size = std::fs::metadata(plugin).unwrap().len();
    assert_eq!(report["size"], size);
    let gzip = report["sizeGzip"].as_u64().unwrap();
    assert!(gzip > 0 && gzip < size, "{gzip} vs {size}");
    assert!(report["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(report["manifest"]["name"], "memcached");
    assert_eq!(report["manifest"]["parent"]["kind"], "Memcached");
    assert_eq!(report["manifest"]["children"][0]["kind"], "Deployment");
    assert_eq!(report["manifest"]["related"][0]["metadataOnly"], true);
}

#[test]
fn missing_files_are_one_line_errors() {
    let out = wasmop(&["inspect", "/nonexistent/plugin.wasm"]);
    assert_one_line_error(&out, &["reading plugin /nonexistent/plugin.wasm"]);

    let plugin = Path::new(test_artifacts::MEMCACHED);
    let out = wasmop(&[
        "render",
        "--plugin",
        path_str(plugin),
        "--parent",
        "/nonexistent/cr.yaml",
    ]);
    assert_one_line_error(&out, &["/nonexistent/cr.yaml"]);
}

#[test]
fn garbage_modules_are_one_line_errors() {
    let garbage = scratch("garbage").join("garbage.wasm");
    std::fs::write(&garbage, b"this is not wasm").unwrap();
    let out = wasmop(&["inspect", path_str(&garbage)]);
    assert_one_line_error(
        &out,
        &[
            "loading plugin",
            "garbage.wasm",
            "not a loadable WebAssembly component",
        ],
    );

    let out = wasmop(&[
        "render",
        "--plugin",
        path_str(&garbage),
        "--parent",
        path_str(&sample()),
    ]);
    assert_one_line_error(
        &out,
        &["garbage.wasm", "not a loadable WebAssembly component"],
    );
}

#[test]
fn a_parent_of_another_kind_is_refused() {
    let plugin = Path::new(test_artifacts::MEMCACHED);
    let parent = scratch("parent").join("cm.yaml");
    std::fs::write(
        &parent,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
    )
    .unwrap();
    let out = wasmop(&[
        "render",
        "--plugin",
        path_str(plugin),
        "--parent",
        path_str(&parent),
    ]);
    assert_one_line_error(
        &out,
        &[
            "v1 ConfigMap",
            "reconciles cache.example.com/v1alpha1 Memcached",
        ],
    );
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    // The packaged ConfigMap is far larger than a pipe's buffer, so the write meets the
    // closed end, as `wasmop package plugin.wasm | head -1` does.
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmop"))
        .args(["package", test_artifacts::MEMCACHED])
        .env("XDG_CACHE_HOME", scratch("xdg"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running wasmop package");
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"# Plugin memcached"));
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn render_takes_an_unowned_child_and_says_what_it_leaves_out() {
    let plugin = Path::new(test_artifacts::MEMCACHED);
    let sample_yaml: Value =
        serde_yaml::from_str(&std::fs::read_to_string(sample()).unwrap()).unwrap();
    let name = sample_yaml["metadata"]["name"].as_str().unwrap().to_owned();
    let ns = sample_yaml["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let size = sample_yaml["spec"]["size"].as_i64().unwrap();
    let observed = scratch("unowned");
    // Written by hand, as an author does: no ownerReferences.
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": size},
        "status": {"availableReplicas": size},
    });
    let stray = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stray", "namespace": ns, "labels": {"app": "web"}}});
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": ns}});
    std::fs::write(
        observed.join("objects.json"),
        json!({"apiVersion": "v1", "kind": "List", "items": [deployment, stray, secret]})
            .to_string(),
    )
    .unwrap();
    let out = wasmop(&[
        "render",
        "--plugin",
        path_str(plugin),
        "--parent",
        path_str(&sample()),
        "--observed",
        path_str(&observed),
    ]);
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "note: observed Deployment {ns}/{name} has no controller ownerReference: taken as a child of Memcached {ns}/{name}"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "note: observed Pod {ns}/stray left out of the request: no selector the plugin's related() returned matches its labels"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "note: observed Secret {ns}/s left out of the request: v1 Secret is neither a child nor a related kind of plugin memcached"
        )),
        "{stderr}"
    );
    // The plugin saw its Deployment: it is available, and nothing says it was created.
    let docs = documents(&text);
    let result = docs.iter().find(|d| d["kind"] == "Result").unwrap();
    let available = result["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Available")
        .unwrap();
    assert_eq!(available["status"], "True", "{text}");
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Event" && d["reason"] == "Created"),
        "{text}"
    );
}

#[test]
fn test_runs_a_scripts_tests_and_fails_on_a_failure() {
    let memcached = test_artifacts::workspace_root().join("plugins/memcached-star");
    let text = stdout(&wasmop(&["test", path_str(&memcached)]));
    assert!(text.starts_with("plugin_test.star\n"), "{text}");
    assert!(text.ends_with("5 passed, 0 failed\n"), "{text}");

    let dir = scratch("failing-tests");
    std::fs::copy(memcached.join("plugin.star"), dir.join("plugin.star")).unwrap();
    std::fs::write(
        dir.join("plugin_test.star"),
        "def test_ok():\n    pass\n\ndef test_wrong():\n    assert_eq(MANIFEST[\"name\"], \"redis\")\n",
    )
    .unwrap();
    let out = wasmop(&["test", path_str(&dir)]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("  FAIL test_wrong")
            && text.contains("plugin_test.star:5:5: assert_eq: got \"memcached\", want \"redis\"")
            && text.ends_with("1 passed, 1 failed\n"),
        "{text}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr, "error: 1 of 2 failed\n");

    std::fs::remove_file(dir.join("plugin_test.star")).unwrap();
    assert_one_line_error(&wasmop(&["test", path_str(&dir)]), &["no test files"]);
}
