//! The host's image as a cluster would run it: `wasmop image` builds it from the test build of
//! `wasmop` (no container engine) and pushes it to a real registry; pulled back, its config
//! runs `/wasmop run` as a user that is not root, and its root filesystem, unpacked and
//! entered with `chroot` as that user, with nothing from this machine but the kernel, starts
//! the host with in-cluster configuration (a ServiceAccount token, the CA and the namespace
//! where a Pod has them, `KUBERNETES_SERVICE_HOST`/`PORT`) and answers `/healthz`.

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use support::registry::TestRegistry;
use wasmop::plugin::oci::{Limits, Manifest, OciClient, Reference};

/// The pod's files, where the host looks for them in a cluster.
const SERVICE_ACCOUNT_DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";

#[tokio::test]
async fn the_image_runs_the_host_as_nonroot_with_in_cluster_configuration() {
    assert!(
        is_root(),
        "this test enters the image's root filesystem with chroot, which needs root"
    );
    let registry = TestRegistry::start();
    let out = Command::new(support::wasmop_bin())
        .arg("image")
        .arg(format!("{}:test", registry.reference("wasmop")))
        .output()
        .expect("running wasmop image");
    assert!(
        out.status.success(),
        "wasmop image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pinned: Reference = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .expect("wasmop image prints a reference");

    // Pulled back as a runtime would: the manifest by digest, then its config and layer.
    let limits = Limits {
        blob_bytes: 1 << 30,
        ..Limits::default()
    };
    let client = OciClient::new(&pinned, None, limits).unwrap();
    let (bytes, _) = client.manifest(&pinned).await.expect("the manifest");
    let manifest: Manifest = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        manifest.config.media_type,
        "application/vnd.oci.image.config.v1+json"
    );
    let blob = |d: &wasmop::plugin::oci::Descriptor| {
        let digest = d.digest.parse().unwrap();
        let client = &client;
        let pinned = &pinned;
        let size = d.size;
        async move { client.blob(pinned, &digest, size).await.expect("a blob") }
    };
    let config: serde_json::Value = serde_json::from_slice(&blob(&manifest.config).await).unwrap();
    let user = config["config"]["User"].as_str().unwrap_or("");
    let uid = user.split(':').next().unwrap_or("");
    assert!(
        !uid.is_empty() && uid != "0" && uid != "root",
        "the image runs as {user:?}"
    );
    let mut argv: Vec<String> = [&config["config"]["Entrypoint"], &config["config"]["Cmd"]]
        .iter()
        .flat_map(|v| v.as_array().cloned().unwrap_or_default())
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(argv, ["/wasmop", "run"], "what the image starts");
    let [layer] = &manifest.layers[..] else {
        panic!("one layer expected: {:?}", manifest.layers)
    };
    let layer = blob(layer).await;

    let dir = std::env::temp_dir().join(format!("wasmop-e2e-image-{}", std::process::id()));
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    std::fs::write(dir.join("layer.tar.gz"), &layer).unwrap();
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(dir.join("layer.tar.gz"))
        .arg("-C")
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(untar.success(), "unpacking the layer");

    // What the kubelet would mount: a token of the host's ServiceAccount, the cluster's CA,
    // the namespace.
    let env = support::Env::new("image").await;
    let ns = env.name().to_string();
    let sa: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &ns);
    sa.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "wasmop"}})).unwrap(),
    )
    .await
    .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(env.client.clone());
    let binding = format!("wasmop-image-{ns}");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "wasmop", "namespace": ns}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let token = sa
        .create_token_request(
            "wasmop",
            &PostParams::default(),
            &serde_json::from_value::<TokenRequest>(
                serde_json::json!({"spec": {"expirationSeconds": 3600}}),
            )
            .unwrap(),
        )
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let kubeconfig = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    let server: http::Uri = cluster.server.as_deref().unwrap().parse().unwrap();
    let ca = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        cluster.certificate_authority_data.as_deref().unwrap(),
    )
    .unwrap();
    let mounted = rootfs.join(SERVICE_ACCOUNT_DIR);
    std::fs::create_dir_all(&mounted).unwrap();
    std::fs::write(mounted.join("token"), token).unwrap();
    std::fs::write(mounted.join("ca.crt"), ca).unwrap();
    std::fs::write(mounted.join("namespace"), &ns).unwrap();
    std::fs::create_dir_all(rootfs.join("proc")).unwrap();

    // The image's own command, as its user, in its own root: nothing of this machine's files.
    let probe = free_port();
    argv.extend([
        format!("--probe-addr=127.0.0.1:{probe}"),
        format!("--metrics-addr=127.0.0.1:{probe}"),
    ]);
    let mut child = Command::new("unshare")
        .arg("--mount")
        .arg("--fork")
        .arg("--kill-child")
        .arg(format!("--mount-proc={}", rootfs.join("proc").display()))
        .arg(program("chroot"))
        .arg(format!("--userspec={user}"))
        .arg(&rootfs)
        .args(&argv)
        .env_clear()
        .env("KUBERNETES_SERVICE_HOST", server.host().unwrap())
        .env(
            "KUBERNETES_SERVICE_PORT",
            server.port_u16().unwrap().to_string(),
        )
        .env("XDG_CACHE_HOME", "/cache")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("host.log")).unwrap())
        .spawn()
        .expect("unshare and chroot (util-linux, coreutils)");
    let addr = format!("127.0.0.1:{probe}");
    let log = dir.join("host.log");
    // Live, then ready: its caches synced through the API server with the mounted token.
    for path in ["/healthz", "/readyz"] {
        let mut answered = false;
        for _ in 0..120 {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "the image's host exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if tokio::net::TcpStream::connect(&addr).await.is_err() {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            let get = support::http_get(&addr, path);
            if let Ok((200, _)) = tokio::time::timeout(Duration::from_secs(2), get).await {
                answered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !answered {
            let _ = child.kill();
            panic!(
                "no 200 on {path} from the image's host: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = bindings.delete(&binding, &Default::default()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Where `name` is on the usual system paths: the child's environment is cleared, `PATH`
/// with it.
fn program(name: &str) -> std::path::PathBuf {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found in /usr/sbin, /usr/bin, /sbin or /bin"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
