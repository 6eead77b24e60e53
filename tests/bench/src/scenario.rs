//! One measured scenario on a fresh control plane: start the operator(s), create the load,
//! wait for convergence, hold a steady state with forced resyncs, and (wasmop) hot-swap the
//! plugin. Every figure the report shows comes from here.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use testenv::TestEnv;
use tokio::time::Instant;

use crate::artifacts::Artifacts;
use crate::cluster::{self, Convergence, Cr, OperatorRequests, Requests, Tracker};
use crate::contestants::{self, Contestant, PLUGIN_NAMESPACE, Settings};
use crate::contestants::{Calls, NewPod};
use crate::kinds::Kind;
use crate::process::{Proc, Usage};

/// After convergence, late writes (the last status updates) land before the steady window.
const SETTLE: Duration = Duration::from_secs(5);
/// Where the first object of each kind is created and deleted before anything is measured.
const WARM_UP_NAMESPACE: &str = "bench-warm-up";

/// What one scenario measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Milestones from the first create.
    pub convergence: Convergence,
    /// How long creating the objects took (one client per namespace, in parallel).
    pub create: Duration,
    /// Summed over the operator's processes, just before the first create.
    pub at_start: Usage,
    /// Summed over the operator's processes, at convergence + [`SETTLE`].
    pub at_converged: Usage,
    /// Summed at the end of the steady window.
    pub at_steady: Usage,
    /// The steady window's length.
    pub steady: Duration,
    /// Operator requests from the first create until convergence + [`SETTLE`].
    pub converging: OperatorRequests,
    /// Operator requests during the steady window.
    pub steady_requests: OperatorRequests,
    /// wasmop: plugin calls and reconciles answered without one during the steady window.
    pub steady_calls: Option<Calls>,
    /// Events recorded on the parents.
    pub events: usize,
    /// wasmop: plugin ConfigMap(s) created → loaded.
    pub plugin_load: Option<Duration>,
    /// wasmop: new pods started after the steady window, each with an empty disk cache: one
    /// that compiles (sharing off), then one that takes what the first host shared.
    pub new_pods: Option<(NewPod, NewPod)>,
    /// wasmop: each shared cache at convergence + 5 s: `Kind.apiVersion` and body (`full`,
    /// `metadata`), objects, bytes.
    pub caches: Vec<(String, usize, f64)>,
    /// The plane's processes together (etcd, apiserver, controller-manager, scheduler, kwok),
    /// RSS at convergence + 5 s, MiB.
    pub plane_mib: f64,
    /// wasmop: ConfigMap updated to the second build → every parent has its Service.
    pub hot_swap: Option<Duration>,
    /// With the hot swap: the same number of Service applies at the same concurrency with no
    /// operator, on the same plane just after it ([`cluster::service_floor`]).
    pub service_floor: Option<Duration>,
}

/// The scenario's shape.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The parent kinds; one operator process (or plugin) per kind.
    pub kinds: Vec<Kind>,
    /// Objects per kind.
    pub per_kind: usize,
    /// Steady-state window.
    pub steady: Duration,
    /// wasmop: measure a hot swap to `memcached_v2.wasm` afterwards.
    pub hot_swap: bool,
    /// Every parent of size 1 (else 1 to 3).
    pub size_one: bool,
    /// wasmop: start new pods after the steady window (see [`Outcome::new_pods`]).
    pub new_pods: bool,
}

/// Runs `who` through `plan` on a fresh control plane, stopped afterwards.
pub async fn run(
    who: Contestant,
    art: &Artifacts,
    plan: &Plan,
    settings: &Settings,
    tag: &str,
) -> Result<Outcome> {
    note!("[{tag}] {}: starting a control plane", who.label());
    let env = TestEnv::start()
        .await
        .context("starting the control plane")?;
    let result = measure(who, art, plan, settings, tag, &env).await;
    if let Err(e) = env.stop().await {
        note!("[{tag}] stopping the control plane: {e}");
    }
    result
}

async fn measure(
    who: Contestant,
    art: &Artifacts,
    plan: &Plan,
    settings: &Settings,
    tag: &str,
    env: &TestEnv,
) -> Result<Outcome> {
    let client = env.client().await?;
    cluster::install_crds(&client, &plan.kinds).await?;
    let mut namespaces: Vec<String> = (0..cluster::NAMESPACES).map(cluster::namespace).collect();
    namespaces.extend([PLUGIN_NAMESPACE.into(), WARM_UP_NAMESPACE.into()]);
    cluster::create_namespaces(&client, &namespaces).await?;
    cluster::warm_up(&client, &plan.kinds, WARM_UP_NAMESPACE).await?;
    let tracker = Tracker::start(&client, &plan.kinds).await?;

    let running = contestants::start(who, art, env, &client, &plan.kinds, settings, tag).await?;
    let mut procs = running.procs;
    let mut crs = cluster::plan(plan.kinds.len(), plan.per_kind);
    if plan.size_one {
        crs.iter_mut().for_each(|cr| cr.size = 1);
    }
    let parent_resources: Vec<String> = plan.kinds.iter().map(|k| k.plural.clone()).collect();
    note!(
        "[{tag}] {}: creating {} objects in {} namespaces",
        who.label(),
        crs.len(),
        cluster::NAMESPACES
    );

    // One client per namespace, connected before the clock starts.
    let clients =
        futures::future::try_join_all((0..cluster::NAMESPACES).map(|_| env.client())).await?;
    let at_start = usage(&mut procs)?;
    let before = Requests::read(&client).await?;
    let start = Instant::now();
    let posts = cluster::create_all(&clients, &plan.kinds, &crs).await?;
    let create = start.elapsed();
    let timeout = Duration::from_secs(180) + Duration::from_millis(200) * crs.len() as u32;
    let convergence = tracker.wait(&crs, start, timeout, &mut procs).await?;
    note!(
        "[{tag}] {}: converged in {:.1} s",
        who.label(),
        convergence.converged.as_secs_f64()
    );
    tokio::time::sleep(SETTLE).await;
    let at_converged = usage(&mut procs)?;
    let plane_mib = env
        .processes()
        .iter()
        .filter_map(|(_, pid)| Usage::of(*pid).ok())
        .map(|u| u.rss_mib)
        .sum();
    let caches = match &running.metrics {
        Some(addr) => contestants::cache_stats(addr).await?,
        None => Vec::new(),
    };
    let settled = Requests::read(&client).await?;
    let calls_before = match &running.metrics {
        Some(addr) => Some(Calls::read(addr).await?),
        None => None,
    };
    let mut converging = settled.since(&before);
    // The creates were the runner's; each kind has its own resource.
    for (i, kind) in plan.kinds.iter().enumerate() {
        let n = crs.iter().filter(|c| c.kind == i).count();
        converging.discount("POST", &kind.plural, n.min(posts));
    }

    note!(
        "[{tag}] {}: steady window of {} s",
        who.label(),
        plan.steady.as_secs()
    );
    tokio::time::sleep(plan.steady).await;
    let at_steady = usage(&mut procs)?;
    let steady_calls = match (&running.metrics, calls_before) {
        (Some(addr), Some(before)) => Some(Calls::read(addr).await?.since(before)),
        _ => None,
    };
    let steady_requests = Requests::read(&client)
        .await?
        .since(&settled)
        .operator(&parent_resources);
    let events = cluster::parent_events(&client, &plan.kinds).await?;

    // New pods, as a failover or a rollout starts them: an empty disk cache, first compiling
    // (sharing off), then taking what the first host shared. The second replaces the first
    // host from here on.
    let new_pods = if matches!(who, Contestant::Wasmop | Contestant::Starlark) && plan.new_pods {
        procs.clear();
        note!("[{tag}] {}: a new pod that compiles", who.label());
        let (cold, pod) = contestants::new_pod(art, env, &plan.kinds, settings, tag, false).await?;
        drop(cold);
        note!(
            "[{tag}] {}: a new pod that takes the shared artifact",
            who.label()
        );
        let (warm, warm_pod) =
            contestants::new_pod(art, env, &plan.kinds, settings, tag, true).await?;
        procs.push(warm);
        Some((pod, warm_pod))
    } else {
        None
    };

    let hot_swap = if who == Contestant::Wasmop && plan.hot_swap {
        note!("[{tag}] {}: hot swap to the second build", who.label());
        Some(hot_swap(art, &client, &crs, &mut procs).await?)
    } else {
        None
    };
    let service_floor = if hot_swap.is_some() {
        note!(
            "[{tag}] the plane's floor: {} Service applies, no operator",
            crs.len()
        );
        Some(cluster::service_floor(&client, crs.len(), settings.concurrency).await?)
    } else {
        None
    };
    for p in &mut procs {
        p.check_alive()?;
    }
    Ok(Outcome {
        convergence,
        create,
        at_start,
        at_converged,
        at_steady,
        steady: plan.steady,
        converging: converging.operator(&parent_resources),
        steady_requests,
        steady_calls,
        events,
        plugin_load: running.plugin_load,
        new_pods,
        caches,
        plane_mib,
        hot_swap,
        service_floor,
    })
}

fn usage(procs: &mut [Proc]) -> Result<Usage> {
    let mut all = Vec::new();
    for p in procs.iter_mut() {
        p.check_alive()?;
        all.push(p.usage()?);
    }
    Ok(Usage::sum(all))
}

/// Updates the plugin ConfigMap to the second build and waits until every parent has the
/// Service that build adds.
async fn hot_swap(
    art: &Artifacts,
    client: &kube::Client,
    crs: &[Cr],
    procs: &mut [Proc],
) -> Result<Duration> {
    let start = Instant::now();
    contestants::put_plugin(client, "memcached", &art.memcached_v2).await?;
    let timeout = Duration::from_secs(120) + Duration::from_millis(100) * crs.len() as u32;
    loop {
        let have = cluster::services_for(client, crs).await?;
        if have == crs.len() {
            return Ok(start.elapsed());
        }
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        if start.elapsed() > timeout {
            bail!(
                "hot swap: only {have}/{} parents have a Service after {timeout:?}",
                crs.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
