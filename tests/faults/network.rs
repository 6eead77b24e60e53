//! A black-holed connection: the host reaches the apiserver through a proxy the test owns,
//! which stops forwarding but keeps every socket open, as a dead network path does.

use std::time::{Duration, Instant};

use crate::fleet::{PARENTS, converged, measured, memcached_wasm, scale, writes};
use crate::{plane, serial};
use support::{Env, Host};

/// How long the path stays dead: longer than the host's 30 s read timeout.
const BLACK_HOLE: Duration = Duration::from_secs(40);

/// Words of the errors a timed-out call or watch logs.
fn timed_out(logs: &str) -> bool {
    logs.contains("timed out")
        || logs.contains("deadline has elapsed")
        || logs.contains("idle timeout")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_black_holed_connection_fails_calls_in_time_and_heals() {
    let _turn = serial().await;
    let env = Env::new("f-blackhole").await;
    env.put_plugin("memcached", &memcached_wasm(), None).await;
    let plane = plane().await;
    let proxy = testenv::Proxy::start(plane.apiserver_addr())
        .await
        .expect("proxy");
    let kubeconfig = plane
        .work_dir()
        .join(format!("kubeconfig-via-{}", proxy.addr().port()));
    std::fs::write(&kubeconfig, plane.kubeconfig_via(proxy.addr())).unwrap();
    let host = Host::build(&kubeconfig, env.name()).start();
    scale(&env, PARENTS, 1).await;
    converged(&env, PARENTS, 1, &host).await;

    // Dead path mid-convergence: calls fail within the read timeout, and nothing is lost.
    let before = writes(&host, "").await;
    scale(&env, PARENTS, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mark = host.logs().len();
    proxy.black_hole();
    let dead = Instant::now();
    let first_failure = loop {
        if timed_out(&host.logs()[mark..]) {
            break dead.elapsed();
        }
        assert!(
            dead.elapsed() < BLACK_HOLE,
            "no call timed out in {BLACK_HOLE:?} of a dead connection:\n{}",
            host.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(BLACK_HOLE.saturating_sub(dead.elapsed())).await;
    proxy.heal();
    let healed = Instant::now();
    converged(&env, PARENTS, 2, &host).await;
    measured(
        "connection black-holed 40 s",
        healed.elapsed(),
        writes(&host, "").await - before,
        &format!("first_timeout_s={:.1}", first_failure.as_secs_f64()),
    );

    // SIGTERM while the path is dead: the host still exits in time.
    scale(&env, PARENTS, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.black_hole();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let term = Instant::now();
    let status = host.terminate();
    let exit = term.elapsed();
    println!(
        "measured: fault=\"SIGTERM while black-holed\" exit_s={:.1}",
        exit.as_secs_f64()
    );
    assert!(status.success(), "{status:?}");
    assert!(
        exit < Duration::from_secs(30),
        "exited {exit:?} after SIGTERM"
    );
    proxy.heal();
    let host = Host::build(&kubeconfig, env.name()).start();
    converged(&env, PARENTS, 1, &host).await;
}
