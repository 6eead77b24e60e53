//! The report: Markdown tables of absolute figures with the wasmop/Go and wasmop/kube-rs
//! ratios, the machine, the date and the command, printed and written to a file.

use std::fmt::Write as _;

use crate::calls::{CallCost, OptBuild, POD_COUNTS};
use crate::contestants::Contestant;
use crate::floor::Floor;
use crate::scenario::Outcome;
use crate::shards::{self, ShardRun, Sharding};

/// Results of one single-operator run (one setting of client rate limits).
pub struct SingleRun {
    /// E.g. "default client rate limits".
    pub title: String,
    /// Per contestant, in [`Contestant::ALL`] order; `None` when not selected.
    pub results: Vec<(Contestant, Option<Result<Outcome, String>>)>,
}

/// Results of the many-operators run.
pub struct ManyRun {
    /// Kinds.
    pub kinds: usize,
    /// Objects per kind.
    pub per_kind: usize,
    /// K Go processes.
    pub go: Option<Result<Outcome, String>>,
    /// One host with K plugins.
    pub wasmop: Option<Result<Outcome, String>>,
}

/// One point of the scale curve: parents of size 1.
pub struct ScaleRun {
    /// Parents.
    pub parents: usize,
    /// Per contestant, in [`Contestant::ALL`] order; `None` when not selected.
    pub results: Vec<(Contestant, Option<Result<Outcome, String>>)>,
}

/// Everything the report shows.
pub struct Report {
    /// The command line, as run.
    pub command: String,
    /// Date (UTC), `YYYY-MM-DD`.
    pub date: String,
    /// nproc, CPU model, memory, kernel.
    pub machine: String,
    /// Settings in a sentence.
    pub setup: String,
    /// The single-operator runs.
    pub single: Vec<SingleRun>,
    /// The many-operators run.
    pub many: Option<ManyRun>,
    /// The scale curve.
    pub scale: Vec<ScaleRun>,
    /// The plugin curve: K kinds of 10 parents each.
    pub plugins: Vec<ManyRun>,
    /// The plane's own cost of each kind of write.
    pub floors: Option<Result<Vec<Floor>, String>>,
    /// Sharding across replicas: parents, and per replica count its run.
    pub shards: Option<Sharding>,
    /// The plugin-call timings.
    pub calls: Option<Result<Vec<CallCost>, String>>,
    /// The guest built at other optimisation levels (full runs only).
    pub opt_levels: Option<Result<Vec<OptBuild>, String>>,
    /// Wall time of the whole run.
    pub took_secs: f64,
    /// Whether "How it is measured" follows (not when only the sharding part ran: its own
    /// section says how).
    pub method: bool,
}

impl Report {
    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(w, "# Benchmarks\n");
        let _ = writeln!(
            w,
            "wasmop side by side with the same Memcached operator written in Go with controller-runtime \
             and as a native kube-rs controller. Produced by `tests/bench` (see its README):\n"
        );
        let _ = writeln!(w, "```sh\n{}\n```\n", self.command);
        let _ = writeln!(w, "- date: {}", self.date);
        let _ = writeln!(w, "- machine: {}", self.machine);
        let _ = writeln!(w, "- {}", self.setup);
        let _ = writeln!(w, "- the whole run took {:.0} s\n", self.took_secs);

        for run in &self.single {
            single_table(w, run);
        }
        if let Some(many) = &self.many {
            many_table(w, many);
        }
        if !self.scale.is_empty() {
            scale_table(w, &self.scale);
        }
        if !self.plugins.is_empty() {
            plugins_table(w, &self.plugins);
        }
        if let Some(floors) = &self.floors {
            floor_table(w, floors);
        }
        if let Some(sharding) = &self.shards {
            shards_table(w, sharding);
        }
        if let Some(calls) = &self.calls {
            calls_table(w, calls);
        }
        if let Some(builds) = &self.opt_levels {
            opt_table(w, builds);
        }
        failures(w, self);
        if self.method {
            let _ = writeln!(w, "{}", METHOD.trim());
        }
        out
    }

    /// Whether anything failed (a contestant that never converged, a crash, a build).
    pub fn failed(&self) -> bool {
        let bad = |r: &Option<Result<Outcome, String>>| matches!(r, Some(Err(_)));
        self.single
            .iter()
            .any(|run| run.results.iter().any(|(_, r)| bad(r)))
            || self
                .many
                .iter()
                .chain(&self.plugins)
                .any(|m| bad(&m.go) || bad(&m.wasmop))
            || self
                .scale
                .iter()
                .any(|run| run.results.iter().any(|(_, r)| bad(r)))
            || matches!(self.calls, Some(Err(_)))
            || matches!(self.floors, Some(Err(_)))
            || self
                .shards
                .iter()
                .any(|s| s.runs.iter().any(|(_, r)| r.is_err()))
            || matches!(self.opt_levels, Some(Err(_)))
    }
}

const METHOD: &str = r#"
## How it is measured

- Each contestant gets a fresh local control plane (`tests/testenv`: etcd, kube-apiserver,
  controller-manager, scheduler, kwok; pods never run, kwok marks them Running and Ready) on
  the same machine, so the plane and the operator share its cores.
- Clocks start at the first create. "Converged": every Deployment has `size` available
  replicas and every `status.nodes` lists `size` pods, seen through watches (the runner does
  not poll the apiserver).
- Memory is VmRSS / VmHWM from `/proc/<pid>/status`, CPU is utime + stime + cutime + cstime
  from `/proc/<pid>/stat` (the host compiles plugins in child processes it waits for, so
  their CPU counts as its own; their memory is theirs and is not in the host's RSS). Start-up
  CPU runs from the process start to the first create (for the host it includes compiling the
  plugin with a cold cache). With several processes the figures are summed (peaks too,
  though they need not coincide).
- Requests come from the apiserver's `apiserver_request_total`, read before the first create,
  5 s after convergence, and after the steady window. They count what only an operator does
  here: every verb on the parent resource but GET, on Deployments and Services (not their
  status subresource, which the controller-manager writes), and GET/LIST of Pods; minus the
  runner's own creates. Watches are counted by the apiserver only when they end and are left
  out. `APPLY` is a server-side apply. The counters carry no client: GETs of parents are left
  out because the controller-manager's garbage collector makes hundreds a minute at 1000
  objects, alike under every operator, while none of the three GETs a parent (all read them
  from watch caches).
- The steady window starts 5 s after convergence, with a forced resync every 10 s (wasmop
  `--resync-seconds 10`, Go `SyncPeriod` 10 s, kube-rs `Action::requeue` 10 s). An operator
  that writes nothing then shows 0 writes.
- Client rate limits: controller-runtime v0.25 disables client-go's limiter by default
  (QPS −1), kube-rs has none, and the host has none; so the defaults run is unthrottled for
  all three. The lifted run gives the Go operator and the native controller an explicit
  1000 QPS / 2000 burst (the host has no knob): in practice a second sample.
- Not the same work: the Go operator writes only `status.nodes` (operator-sdk tutorial
  style, `Status().Update`); the plugin also reports an `Available` condition, and the host
  and the native controller add `observedGeneration` and a `Ready` condition, so they write
  status more often while pods come up. The host also records the plugin's Events on the
  parents; the other two record none.
- The first host compiles its plugins (in a child process, as `wasmop run` does) with an
  empty compile cache: that is most of its start-up CPU. After the steady window the runner
  stops it and starts two new pods in turn, each with an empty disk cache, as a failover or
  a rollout would: the first with `--no-shared-artifacts`, so it compiles; the second takes
  the compiled plugins the first host shared through the cluster (`wasmop-artifact-*`
  ConfigMaps). For each: process start → every plugin loaded, → its first reconcile, its CPU
  when loaded, and its RSS 5 s later. The second then serves the hot swap.
- The many-operators runs compare K Go processes, one per CRD kind, with one host running K
  plugins: `tests/bench/plugin` built once for `Memcached000`, the kind patched into a copy
  per kind (every kind's name has the same length), so each is a module of its own with its
  own digest, compiled by the host on its own.
- The scale curve gives every parent `spec.size` 1, runs no steady window and no hot swap,
  and reports RSS 5 s after convergence; its per-parent figure is that RSS less the RSS just
  before the first create, over the parents. "The plane" is the RSS of etcd, the apiserver,
  the controller-manager, the scheduler and kwok together at the same moment.
- Cached bytes per object come from the host's `wasmop_cache_bytes` and
  `wasmop_cache_objects`: each object's text and decoded metadata, not the indexes or the
  allocator's overhead.
"#;

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// A row: label, one value per column (None: not run or failed), decimals.
fn row(
    w: &mut String,
    label: &str,
    values: &[Option<f64>],
    decimals: usize,
    ratios: &[(usize, usize)],
) {
    let _ = write!(w, "| {label} |");
    for v in values {
        match v {
            Some(v) => {
                let v = v + 0.0; // no "-0"
                let _ = write!(w, " {v:.decimals$} |");
            }
            None => {
                let _ = write!(w, " – |");
            }
        }
    }
    for &(num, den) in ratios {
        let _ = write!(w, " {} |", ratio(values[num], values[den]));
    }
    let _ = writeln!(w);
}

fn ratio(num: Option<f64>, den: Option<f64>) -> String {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => format!("{:.2}×", n / d),
        (Some(0.0), Some(_)) => "=".into(),
        _ => "–".into(),
    }
}

fn single_table(w: &mut String, run: &SingleRun) {
    let _ = writeln!(w, "## One operator, {}\n", run.title);
    let ok: Vec<Option<&Outcome>> = run
        .results
        .iter()
        .map(|(_, r)| r.as_ref().and_then(|r| r.as_ref().ok()))
        .collect();
    let heads: Vec<&str> = run.results.iter().map(|(c, _)| c.label()).collect();
    let _ = writeln!(
        w,
        "| | {} | wasmop/Go | wasmop/kube-rs | Starlark/Go |",
        heads.join(" | ")
    );
    let _ = writeln!(w, "|---|{}---:|---:|---:|", "---:|".repeat(heads.len()));
    let (wasm, go, native, star) = (2, 0, 1, 3);
    let ratios = [(wasm, go), (wasm, native), (star, go)];
    let col =
        |f: &dyn Fn(&Outcome) -> f64| -> Vec<Option<f64>> { ok.iter().map(|o| o.map(f)).collect() };
    let steady = ok.iter().flatten().next().map_or(0, |o| o.steady.as_secs());
    row(
        w,
        "every Deployment exists (s)",
        &col(&|o| secs(o.convergence.deployments_exist)),
        1,
        &ratios,
    );
    row(
        w,
        "converged (s)",
        &col(&|o| secs(o.convergence.converged)),
        1,
        &ratios,
    );
    row(
        w,
        "CPU at start-up (s)",
        &col(&|o| o.at_start.cpu_secs),
        2,
        &ratios,
    );
    row(
        w,
        "CPU from first create to converged + 5 s (s)",
        &col(&|o| o.at_converged.cpu_secs - o.at_start.cpu_secs),
        2,
        &ratios,
    );
    row(
        w,
        "peak RSS (MiB)",
        &col(&|o| o.at_steady.peak_mib),
        1,
        &ratios,
    );
    row(
        w,
        "RSS after the steady window (MiB)",
        &col(&|o| o.at_steady.rss_mib),
        1,
        &ratios,
    );
    row(
        w,
        &format!("CPU during {steady} s steady (s)"),
        &col(&|o| o.at_steady.cpu_secs - o.at_converged.cpu_secs),
        2,
        &ratios,
    );
    row(
        w,
        "reads converging (GET+LIST)",
        &col(&|o| o.converging.reads()),
        0,
        &ratios,
    );
    row(
        w,
        "writes converging",
        &col(&|o| o.converging.writes()),
        0,
        &ratios,
    );
    row(
        w,
        &format!("reads during {steady} s steady"),
        &col(&|o| o.steady_requests.reads()),
        0,
        &ratios,
    );
    row(
        w,
        &format!("writes during {steady} s steady"),
        &col(&|o| o.steady_requests.writes()),
        0,
        &ratios,
    );
    row(
        w,
        "Events recorded on parents",
        &col(&|o| o.events as f64),
        0,
        &ratios,
    );
    let _ = writeln!(w);

    for (who, i) in [("wasmop", wasm), ("wasmop, Starlark", star)] {
        let Some(Some(o)) = ok.get(i) else {
            continue;
        };
        let mut extras = Vec::new();
        if let Some(d) = o.plugin_load {
            extras.push(format!(
                "plugin loaded {:.0} ms after its ConfigMap was created (cold compile)",
                d.as_secs_f64() * 1000.0
            ));
        }
        if let Some(c) = o.steady_calls {
            extras.push(format!(
                "during the steady window the host made {:.0} plugin calls and answered {:.0} \
                     resyncs without one (request byte-identical to the last answered)",
                c.calls, c.skipped
            ));
        }
        if let Some((cold, warm)) = o.new_pods {
            let mut vs = Vec::new();
            for (i, name) in [(go, "Go"), (native, "kube-rs")] {
                if let Some(Some(other)) = ok.get(i) {
                    vs.push(format!(
                        "{:.2}× {name}",
                        warm.settled.rss_mib / other.at_steady.rss_mib
                    ));
                }
            }
            extras.push(format!(
                "a new pod that compiles had the plugin loaded {} after it started and \
                     reconciled first at {}; one that takes the shared artifact, at {} and {}, \
                     with {:.2} s of CPU against {:.2} s, and {:.1} MiB 5 s later ({})",
                ms(cold.loaded),
                ms(cold.first_reconcile),
                ms(warm.loaded),
                ms(warm.first_reconcile),
                warm.cpu_at_loaded,
                cold.cpu_at_loaded,
                warm.settled.rss_mib,
                vs.join(", ")
            ));
        }
        if let Some(d) = o.hot_swap {
            let floor = o.service_floor.map_or(String::new(), |f| {
                format!(
                    " — the plane's own floor, the same number of Service applies at the same \
                         concurrency with no operator, took {:.1} s: {:.2}× the floor",
                    f.as_secs_f64(),
                    d.as_secs_f64() / f.as_secs_f64().max(1e-3)
                )
            });
            extras.push(format!(
                "hot swap to `memcached_v2.wasm`: every parent had its Service {:.1} s after the \
                     ConfigMap update{floor}",
                d.as_secs_f64()
            ));
        }
        if !extras.is_empty() {
            let _ = writeln!(w, "{who}: {}.\n", extras.join("; "));
        }
        caches(w, o);
    }
    let _ = writeln!(w, "Requests while converging, by verb and resource:\n");
    for ((c, _), o) in run.results.iter().zip(&ok) {
        if let Some(o) = o {
            let _ = writeln!(
                w,
                "- {}: {} (creating the objects took {:.1} s)",
                c.label(),
                o.converging.describe(),
                o.create.as_secs_f64()
            );
        }
    }
    let _ = writeln!(w);
    let steady: Vec<String> = run
        .results
        .iter()
        .zip(&ok)
        .filter_map(|((c, _), o)| {
            let o = o.filter(|o| !o.steady_requests.detail.is_empty())?;
            Some(format!("- {}: {}", c.label(), o.steady_requests.describe()))
        })
        .collect();
    if !steady.is_empty() {
        let _ = writeln!(
            w,
            "Requests during the steady window:\n\n{}\n",
            steady.join("\n")
        );
    }
}

fn many_table(w: &mut String, many: &ManyRun) {
    let k = many.kinds;
    let _ = writeln!(
        w,
        "## Many operators: {k} kinds × {} objects\n",
        many.per_kind
    );
    let ok =
        |r: &Option<Result<Outcome, String>>| r.as_ref().and_then(|r| r.as_ref().ok()).cloned();
    let (go, wasm) = (ok(&many.go), ok(&many.wasmop));
    let _ = writeln!(
        w,
        "| | {k} × Go controller-runtime | wasmop, {k} plugins | wasmop/Go |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|");
    let ratios = [(1, 0)];
    let pair = |f: &dyn Fn(&Outcome) -> f64| [go.as_ref().map(f), wasm.as_ref().map(f)];
    row(
        w,
        "every Deployment exists (s)",
        &pair(&|o| secs(o.convergence.deployments_exist)),
        1,
        &ratios,
    );
    row(
        w,
        "converged (s)",
        &pair(&|o| secs(o.convergence.converged)),
        1,
        &ratios,
    );
    row(
        w,
        "total RSS after the steady window (MiB)",
        &pair(&|o| o.at_steady.rss_mib),
        1,
        &ratios,
    );
    row(
        w,
        "sum of peak RSS (MiB)",
        &pair(&|o| o.at_steady.peak_mib),
        1,
        &ratios,
    );
    row(
        w,
        "CPU at start-up (s)",
        &pair(&|o| o.at_start.cpu_secs),
        2,
        &ratios,
    );
    row(
        w,
        "CPU from first create to converged + 5 s (s)",
        &pair(&|o| o.at_converged.cpu_secs - o.at_start.cpu_secs),
        2,
        &ratios,
    );
    row(
        w,
        "writes converging",
        &pair(&|o| o.converging.writes()),
        0,
        &ratios,
    );
    let _ = writeln!(w);
    let _ = writeln!(w, "Requests while converging, by verb and resource:\n");
    for (label, o) in [("Go controller-runtime", &go), ("wasmop", &wasm)] {
        if let Some(o) = o {
            let _ = writeln!(w, "- {label}: {}", o.converging.describe());
        }
    }
    let _ = writeln!(w);
    if let (Some((cold, warm)), Some(go)) = (wasm.as_ref().and_then(|o| o.new_pods), go.as_ref()) {
        let _ = writeln!(
            w,
            "wasmop: a new pod had the {k} plugins loaded {} after it started when it compiled \
             them ({:.2} s of CPU), {} when it took the shared artifacts ({:.2} s of CPU), and \
             then used {:.1} MiB ({:.2}× the Go processes together).\n",
            ms(cold.loaded),
            cold.cpu_at_loaded,
            ms(warm.loaded),
            warm.cpu_at_loaded,
            warm.settled.rss_mib,
            warm.settled.rss_mib / go.at_steady.rss_mib
        );
    }
    if let Some(d) = wasm.as_ref().and_then(|o| o.plugin_load) {
        let _ = writeln!(
            w,
            "wasmop: the {k} plugins were loaded {:.2} s after their ConfigMaps were created.\n",
            d.as_secs_f64()
        );
    }
}

fn ms(d: std::time::Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// The host's caches: objects and bytes per object, per kind.
fn caches(w: &mut String, o: &Outcome) {
    if o.caches.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "wasmop's caches 5 s after convergence (`wasmop_cache_objects`, `wasmop_cache_bytes`):\n"
    );
    let _ = writeln!(w, "| kind (body) | objects | bytes per object | MiB |");
    let _ = writeln!(w, "|---|---:|---:|---:|");
    for (kind, n, bytes) in &o.caches {
        let per = if *n > 0 { bytes / *n as f64 } else { 0.0 };
        let _ = writeln!(w, "| {kind} | {n} | {per:.0} | {:.2} |", bytes / 1048576.0);
    }
    let _ = writeln!(w);
}

fn scale_table(w: &mut String, runs: &[ScaleRun]) {
    let _ = writeln!(
        w,
        "## Scale: parents of size 1
"
    );
    let heads: Vec<&str> = runs[0].results.iter().map(|(c, _)| c.label()).collect();
    let (go, native, wasm, star) = (0, 1, 2, 3);
    let ok = |run: &ScaleRun, i: usize| -> Option<Outcome> {
        run.results.get(i)?.1.as_ref()?.as_ref().ok().cloned()
    };
    type Figure = (&'static str, usize, fn(&Outcome, usize) -> f64);
    let figures: [Figure; 6] = [
        ("converged (s)", 1, |o, _| secs(o.convergence.converged)),
        ("RSS at convergence + 5 s (MiB)", 1, |o, _| {
            o.at_converged.rss_mib
        }),
        ("peak RSS (MiB)", 1, |o, _| o.at_converged.peak_mib),
        ("RSS per parent (KiB)", 1, |o, n| {
            (o.at_converged.rss_mib - o.at_start.rss_mib) * 1024.0 / n as f64
        }),
        (
            "CPU from first create to convergence + 5 s (s)",
            2,
            |o, _| o.at_converged.cpu_secs - o.at_start.cpu_secs,
        ),
        ("CPU per parent (ms)", 2, |o, n| {
            (o.at_converged.cpu_secs - o.at_start.cpu_secs) * 1000.0 / n as f64
        }),
    ];
    for (title, decimals, f) in figures {
        let _ = writeln!(
            w,
            "| {title} | {} | wasmop/Go | wasmop/kube-rs | Starlark/Go |",
            heads.join(" | ")
        );
        let _ = writeln!(w, "|---|{}---:|---:|---:|", "---:|".repeat(heads.len()));
        for run in runs {
            let values: Vec<Option<f64>> = (0..heads.len())
                .map(|i| ok(run, i).map(|o| f(&o, run.parents)))
                .collect();
            row(
                w,
                &format!("{} parents", run.parents),
                &values,
                decimals,
                &[(wasm, go), (wasm, native), (star, go)],
            );
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(
        w,
        "The plane's own RSS at convergence + 5 s, under each contestant:
"
    );
    let _ = writeln!(w, "| parents | {} |", heads.join(" | "));
    let _ = writeln!(w, "|---|{}", "---:|".repeat(heads.len()));
    for run in runs {
        let cells: Vec<String> = (0..heads.len())
            .map(|i| ok(run, i).map_or("–".into(), |o| format!("{:.0} MiB", o.plane_mib)))
            .collect();
        let _ = writeln!(w, "| {} | {} |", run.parents, cells.join(" | "));
    }
    let _ = writeln!(w);
    if let Some(o) = runs.last().and_then(|r| ok(r, wasm)) {
        caches(w, &o);
    }
}

fn plugins_table(w: &mut String, runs: &[ManyRun]) {
    let _ = writeln!(
        w,
        "## Many plugins: K kinds × 10 parents
"
    );
    let _ = writeln!(
        w,
        "| K | K × Go: RSS (MiB) | wasmop: RSS (MiB) | wasmop/Go | wasmop: MiB per more plugin | \
         wasmop: watches | wasmop: plugins loaded after (s) |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|");
    let ok =
        |r: &Option<Result<Outcome, String>>| r.as_ref().and_then(|r| r.as_ref().ok()).cloned();
    let mut last: Option<(usize, f64)> = None;
    for run in runs {
        let (go, wasm) = (ok(&run.go), ok(&run.wasmop));
        let rss = |o: &Option<Outcome>| o.as_ref().map(|o| o.at_steady.rss_mib);
        let cell = |v: Option<f64>, d: usize| v.map_or("–".into(), |v| format!("{v:.d$}"));
        let marginal = match (last, rss(&wasm)) {
            (Some((k0, r0)), Some(r)) if run.kinds > k0 => Some((r - r0) / (run.kinds - k0) as f64),
            _ => None,
        };
        if let Some(r) = rss(&wasm) {
            last = Some((run.kinds, r));
        }
        let watches = wasm.as_ref().map(|o| o.caches.len() as f64);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} |",
            run.kinds,
            cell(rss(&go), 1),
            cell(rss(&wasm), 1),
            ratio(rss(&wasm), rss(&go)),
            cell(marginal, 2),
            cell(watches, 0),
            cell(wasm.as_ref().and_then(|o| o.plugin_load).map(secs), 1),
        );
    }
    let _ = writeln!(w);
}

fn floor_table(w: &mut String, floors: &Result<Vec<Floor>, String>) {
    let _ = writeln!(w, "## The plane's cost of each write\n");
    let Ok(floors) = floors else {
        let _ = writeln!(w, "Failed (see below).\n");
        return;
    };
    let _ = writeln!(
        w,
        "No operator: the runner writes what each operator writes, on a fresh plane, at the \
         run's concurrency; the CPU is kube-apiserver's and etcd's.\n"
    );
    let _ = writeln!(
        w,
        "| write | objects | took (s) | plane CPU (s) | plane CPU per write (ms) |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    for f in floors {
        let _ = writeln!(
            w,
            "| {} | {} | {:.1} | {:.2} | {:.2} |",
            f.what,
            f.n,
            secs(f.took),
            f.plane_cpu,
            f.plane_cpu * 1000.0 / f.n.max(1) as f64
        );
    }
    let _ = writeln!(w);
}

fn shards_table(w: &mut String, sharding: &Sharding) {
    let (parents, runs) = (sharding.parents, &sharding.runs);
    let _ = writeln!(w, "## Sharding across replicas\n");
    let _ = writeln!(
        w,
        "{parents} Memcached parents of size 1 in {} namespaces, R wasmop replicas each run \
         with `--shards {} --lease-duration-seconds {} --concurrency {}` over every namespace \
         (so R replicas reconcile R × {3} parents at once), on a fresh plane \
         per R whose API server shards lists and watches (`ShardedListAndWatch=true`), so each \
         replica lists, watches and caches only its shards' objects. The namespaces are named \
         so that each of the {1} shards has 2 or 3 of them, and the parents are dealt evenly \
         over the shards ({} each). The parents are created once the replicas share the shard \
         Leases evenly. Go and kube-rs have no sharding and are not run.\n",
        shards::NAMESPACES,
        shards::SHARDS,
        shards::LEASE_SECONDS,
        sharding.concurrency,
        parents / shards::SHARDS as usize,
    );
    let ok: Vec<(usize, &ShardRun)> = runs
        .iter()
        .filter_map(|(r, res)| Some((*r, res.as_ref().ok()?)))
        .collect();
    if ok.is_empty() {
        let _ = writeln!(w, "Failed (see below).\n");
        return;
    }
    let heads: Vec<String> = ok
        .iter()
        .map(|(r, _)| format!("{r} replica{}", if *r == 1 { "" } else { "s" }))
        .collect();
    let _ = writeln!(w, "| | {} |", heads.join(" | "));
    let _ = writeln!(w, "|---|{}", "---:|".repeat(heads.len()));
    let each = |f: &dyn Fn(&shards::Replica) -> String| -> Vec<String> {
        ok.iter()
            .map(|(_, run)| run.replicas.iter().map(f).collect::<Vec<_>>().join(" / "))
            .collect()
    };
    let line = |w: &mut String, label: &str, cells: Vec<String>| {
        let _ = writeln!(w, "| {label} | {} |", cells.join(" | "));
    };
    let stat = |run: &ShardRun, f: &dyn Fn(&shards::Replica) -> f64| -> (f64, f64) {
        let values: Vec<f64> = run.replicas.iter().map(f).collect();
        let max = values.iter().copied().fold(0.0, f64::max);
        (max, values.iter().sum::<f64>() / values.len().max(1) as f64)
    };
    let figure = |f: &dyn Fn(&ShardRun) -> f64, d: usize| -> Vec<String> {
        ok.iter()
            .map(|(_, run)| format!("{:.d$}", f(run)))
            .collect()
    };
    let peak = |r: &shards::Replica| r.at_converged.peak_mib;
    let cpu = |r: &shards::Replica| r.at_converged.cpu_secs - r.at_start.cpu_secs;
    line(w, "replicas (`POD_NAME`)", each(&|r| r.pod.clone()));
    line(
        w,
        "shard Leases held, per replica",
        each(&|r| r.shards.to_string()),
    );
    line(
        w,
        "parents cached, per replica",
        each(&|r| r.cached.to_string()),
    );
    line(
        w,
        "objects cached (every kind), per replica",
        each(&|r| r.cached_all.to_string()),
    );
    line(
        w,
        "cache's own bytes, per replica (MiB)",
        each(&|r| format!("{:.1}", r.cache_bytes / 1048576.0)),
    );
    line(
        w,
        "every Deployment exists (s)",
        figure(&|run| secs(run.convergence.deployments_exist), 1),
    );
    line(
        w,
        "converged (s)",
        figure(&|run| secs(run.convergence.converged), 1),
    );
    line(
        w,
        "peak RSS per replica, max (MiB)",
        figure(&|run| stat(run, &peak).0, 1),
    );
    line(
        w,
        "peak RSS per replica, mean (MiB)",
        figure(&|run| stat(run, &peak).1, 1),
    );
    let one = ok
        .iter()
        .find(|(r, _)| *r == 1)
        .map(|(_, run)| stat(run, &peak).0);
    line(
        w,
        "peak RSS per replica, max, against 1 replica",
        ok.iter()
            .map(|(_, run)| ratio(Some(stat(run, &peak).0), one))
            .collect(),
    );
    line(
        w,
        "RSS at convergence + 5 s, per replica (MiB)",
        each(&|r| format!("{:.1}", r.at_converged.rss_mib)),
    );
    line(
        w,
        "CPU from first create to converged + 5 s, per replica (s)",
        each(&|r| format!("{:.2}", cpu(r))),
    );
    line(
        w,
        "CPU, all replicas together (s)",
        figure(&|run| run.replicas.iter().map(cpu).sum(), 2),
    );
    line(
        w,
        "writes per parent, all replicas",
        figure(
            &|run| {
                run.replicas.iter().map(|r| r.all_writes()).sum::<f64>() / run.parents.max(1) as f64
            },
            2,
        ),
    );
    for resource in ["deployments", "memcacheds/status", "events"] {
        line(
            w,
            &format!("… of which `{resource}`"),
            figure(
                &|run| {
                    let sent: f64 = run
                        .replicas
                        .iter()
                        .filter_map(|r| r.writes.get(resource))
                        .sum();
                    sent / run.parents.max(1) as f64
                },
                2,
            ),
        );
    }
    line(
        w,
        "shards shared evenly after the last replica started (s)",
        figure(&|run| secs(run.shared_after), 1),
    );
    let _ = writeln!(w);
    for (_, run) in &ok {
        if let Some(f) = &run.failover {
            let _ = writeln!(
                w,
                "Failover, {} replicas: {} (holding {} shards) was SIGKILLed and {} of its \
                 parents had `spec.size` changed at once; its shard Leases were all held by the \
                 others {:.1} s later (Lease duration {} s), and the changed parents' status \
                 was written for their new generation {:.1} s after the SIGKILL.\n",
                run.replicas.len(),
                f.pod,
                f.shards,
                f.patched,
                secs(f.leases_moved),
                shards::LEASE_SECONDS,
                secs(f.reconciled),
            );
        }
    }
    let _ = writeln!(
        w,
        "Peak RSS is VmHWM at convergence + 5 s, CPU is utime + stime (children's included) \
         from the first create, cached parents are the replica's `wasmop_cache_objects` for \
         Memcached, writes are `wasmop_api_writes_total{{result=\"sent\"}}` from the first \
         create, summed over the replicas. \"Converged\" as elsewhere: every Deployment \
         available and every `status.nodes` complete, seen through the runner's watches. \
         Every replica and the plane share the machine's cores.\n"
    );
}

fn calls_table(w: &mut String, calls: &Result<Vec<CallCost>, String>) {
    let _ = writeln!(w, "## One plugin call, in process\n");
    let Ok(calls) = calls else {
        let _ = writeln!(w, "Failed (see below).\n");
        return;
    };
    let _ = writeln!(
        w,
        "The Memcached reconcile through the sandbox (fresh instance, JSON in and out) and natively \
         (the SDK's JSON path), mean per call, and what the freed pool slot kept resident for \
         the next call afterwards:\n"
    );
    let _ = writeln!(
        w,
        "| observed pods | sandbox (µs) | native (µs) | sandbox/native | kept resident (KiB) |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|");
    for c in calls {
        let (s, n) = (c.sandbox.as_secs_f64() * 1e6, c.native.as_secs_f64() * 1e6);
        let _ = writeln!(
            w,
            "| {} | {s:.1} | {n:.1} | {:.1}× | {} |",
            c.pods,
            s / n,
            c.kept >> 10
        );
    }
    let _ = writeln!(w);
}

fn opt_table(w: &mut String, builds: &Result<Vec<OptBuild>, String>) {
    let _ = writeln!(w, "## The guest's optimisation level\n");
    let Ok(builds) = builds else {
        let _ = writeln!(w, "Failed (see below).\n");
        return;
    };
    let _ = writeln!(
        w,
        "The Memcached plugin built with each `-C opt-level` (one codegen unit, symbols \
         stripped; `2` is what the repository ships), its size, and the mean sandbox call as \
         above:\n"
    );
    let pods: Vec<String> = POD_COUNTS
        .iter()
        .map(|p| format!("call, {p} pods (µs)"))
        .collect();
    let _ = writeln!(
        w,
        "| opt-level | module (KB) | in the ConfigMap (KB) | {} |",
        pods.join(" | ")
    );
    let _ = writeln!(w, "|---|---:|---:|{}", "---:|".repeat(POD_COUNTS.len()));
    for b in builds {
        let calls: Vec<String> = b
            .calls
            .iter()
            .map(|c| format!("{:.1}", c.as_secs_f64() * 1e6))
            .collect();
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.0} | {} |",
            b.level,
            b.bytes as f64 / 1000.0,
            b.stored as f64 / 1000.0,
            calls.join(" | ")
        );
    }
    let _ = writeln!(w);
}

fn failures(w: &mut String, r: &Report) {
    let mut lines = Vec::new();
    for run in &r.single {
        for (c, res) in &run.results {
            if let Some(Err(e)) = res {
                lines.push(format!("- {} ({}): {e}", c.label(), run.title));
            }
        }
    }
    let many = r.many.iter().map(|m| ("many operators".to_owned(), m));
    let curve = r
        .plugins
        .iter()
        .map(|m| (format!("{} plugins", m.kinds), m));
    for (title, m) in many.chain(curve) {
        for (who, res) in [("Go", &m.go), ("wasmop", &m.wasmop)] {
            if let Some(Err(e)) = res {
                lines.push(format!("- {title}, {who}: {e}"));
            }
        }
    }
    for run in &r.scale {
        for (c, res) in &run.results {
            if let Some(Err(e)) = res {
                lines.push(format!("- {} parents, {}: {e}", run.parents, c.label()));
            }
        }
    }
    if let Some(Err(e)) = &r.floors {
        lines.push(format!("- the plane's cost of each write: {e}"));
    }
    for (replicas, res) in r.shards.iter().flat_map(|s| &s.runs) {
        if let Err(e) = res {
            lines.push(format!("- sharding, {replicas} replica(s): {e}"));
        }
    }
    if let Some(Err(e)) = &r.opt_levels {
        lines.push(format!("- optimisation levels: {e}"));
    }
    if let Some(Err(e)) = &r.calls {
        lines.push(format!("- plugin calls: {e}"));
    }
    if !lines.is_empty() {
        let _ = writeln!(w, "## Failures\n\n```text\n{}\n```\n", lines.join("\n"));
    }
}

/// nproc, CPU model, memory and kernel of this machine.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".to_owned(), |(_, m)| m.trim().to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpus} CPUs ({model}), {mem_gib:.1} GiB memory, Linux {}",
        kernel.trim()
    )
}

/// Today's date, UTC.
pub fn today() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    now.get(..10).unwrap_or(&now).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios() {
        assert_eq!(ratio(Some(1.0), Some(2.0)), "0.50×");
        assert_eq!(ratio(Some(0.0), Some(0.0)), "=");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "–");
        assert_eq!(ratio(None, Some(1.0)), "–");
    }

    #[test]
    fn machine_names_cpus() {
        assert!(machine().contains("CPUs"));
        assert_eq!(today().len(), 10);
    }
}
