//! The report: Markdown tables of absolute figures with the wasmop/Go and wasmop/kube-rs
//! ratios, the machine, the date and the command, printed and written to a file.

use std::fmt::Write as _;

use crate::calls::{CallCost, OptBuild, POD_COUNTS};
use crate::contestants::Contestant;
use crate::scenario::Outcome;

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
    /// The plugin-call timings.
    pub calls: Option<Result<Vec<CallCost>, String>>,
    /// The guest built at other optimisation levels (full runs only).
    pub opt_levels: Option<Result<Vec<OptBuild>, String>>,
    /// Wall time of the whole run.
    pub took_secs: f64,
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
        if let Some(calls) = &self.calls {
            calls_table(w, calls);
        }
        if let Some(builds) = &self.opt_levels {
            opt_table(w, builds);
        }
        failures(w, self);
        let _ = writeln!(w, "{}", METHOD.trim());
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
                .as_ref()
                .is_some_and(|m| bad(&m.go) || bad(&m.wasmop))
            || matches!(self.calls, Some(Err(_)))
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
- Memory is VmRSS / VmHWM from `/proc/<pid>/status`, CPU is utime + stime from
  `/proc/<pid>/stat`. Start-up CPU runs from the process start to the first create (for the
  host it includes compiling the plugin with a cold cache). With several processes the
  figures are summed (peaks too, though they need not coincide).
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
- The host compiles its plugins with a cold compile cache, as a new pod would: that is most
  of its start-up CPU and sets its early peak RSS. After the steady window the runner starts
  a second host on the same plugins with the now warm cache and reports its RSS too.
- The many-operators run compares K Go processes, one per CRD kind, with one host running K
  builds of the same plugin (`tests/bench/plugin`, kind fixed at build time).
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
        "| | {} | wasmop/Go | wasmop/kube-rs |",
        heads.join(" | ")
    );
    let _ = writeln!(w, "|---|{}---:|---:|", "---:|".repeat(heads.len()));
    let (wasm, go, native) = (2, 0, 1);
    let ratios = [(wasm, go), (wasm, native)];
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

    if let Some(Some(o)) = ok.get(wasm) {
        let mut extras = Vec::new();
        if let Some(d) = o.plugin_load {
            extras.push(format!(
                "plugin loaded {:.0} ms after its ConfigMap was created (cold compile)",
                d.as_secs_f64() * 1000.0
            ));
        }
        if let Some(u) = o.warm_restart {
            let mut vs = vec![format!(
                "{:.0} % of the first host's RSS",
                100.0 * u.rss_mib / o.at_steady.rss_mib
            )];
            for (i, name) in [(go, "Go"), (native, "kube-rs")] {
                if let Some(Some(other)) = ok.get(i) {
                    vs.push(format!(
                        "{:.2}× {name}",
                        u.rss_mib / other.at_steady.rss_mib
                    ));
                }
            }
            extras.push(format!(
                "a second host started on the same plugin with a warm compile cache used \
                 {:.1} MiB ({})",
                u.rss_mib,
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
            let _ = writeln!(w, "wasmop: {}.\n", extras.join("; "));
        }
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
    if let (Some(u), Some(go)) = (wasm.as_ref().and_then(|o| o.warm_restart), go.as_ref()) {
        let _ = writeln!(
            w,
            "wasmop: a second host started on the same {k} plugins with a warm compile cache used \
             {:.1} MiB ({:.2}× the Go processes together).\n",
            u.rss_mib,
            u.rss_mib / go.at_steady.rss_mib
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

fn calls_table(w: &mut String, calls: &Result<Vec<CallCost>, String>) {
    let _ = writeln!(w, "## One plugin call, in process\n");
    let Ok(calls) = calls else {
        let _ = writeln!(w, "Failed (see below).\n");
        return;
    };
    let _ = writeln!(
        w,
        "The Memcached reconcile through the sandbox (fresh instance, JSON in and out) and natively \
         (the SDK's JSON path), mean per call:\n"
    );
    let _ = writeln!(
        w,
        "| observed pods | sandbox (µs) | native (µs) | sandbox/native |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|");
    for c in calls {
        let (s, n) = (c.sandbox.as_secs_f64() * 1e6, c.native.as_secs_f64() * 1e6);
        let _ = writeln!(w, "| {} | {s:.1} | {n:.1} | {:.1}× |", c.pods, s / n);
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
         stripped; `z` is what the repository ships), its size, and the mean sandbox call as \
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
    if let Some(m) = &r.many {
        for (who, res) in [("Go", &m.go), ("wasmop", &m.wasmop)] {
            if let Some(Err(e)) = res {
                lines.push(format!("- many operators, {who}: {e}"));
            }
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
