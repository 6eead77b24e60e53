//! `bench`: wasmop side by side with the same Memcached operator written in Go with
//! controller-runtime and as a native kube-rs controller, each on a fresh local control
//! plane; then ten operators on ten CRD kinds, as ten Go processes or one host with ten
//! plugins; and the cost of one plugin call, sandboxed and native.
//!
//! ```sh
//! cargo run -p bench -- --quick               # CI: 20 objects, dev builds: does it all run
//! cargo run --release -p bench                # 1000 objects, both limit settings, ~16 min
//! cargo run --release -p bench -- --shards-only # 1 to 3 sharded replicas, 3000 parents
//! cargo run --release -p bench -- --calls-only  # one plugin call, sandboxed and native
//! ```
//!
//! It builds what it runs (see [`artifacts`]), prints a Markdown report and writes it to
//! `docs/benchmarks.md` (with `--quick`, to `target/bench/benchmarks-quick.md`). It exits
//! non-zero only when something is broken: a build fails, an operator crashes or never
//! converges. Slow figures are reported, never judged.

/// Progress on stderr, stamped with the seconds since the runner started.
macro_rules! note {
    ($($arg:tt)*) => {
        eprintln!("bench [{:>6.1}s] {}", crate::elapsed(), format_args!($($arg)*))
    };
}

mod artifacts;
mod calls;
mod cluster;
mod contestants;
mod floor;
mod kinds;
mod process;
mod report;
mod scenario;
mod shards;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::contestants::{Contestant, Settings};
use crate::kinds::Kind;
use crate::report::{ManyRun, Report, ScaleRun, SingleRun};
use crate::scenario::Plan;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "wasmop against Go controller-runtime and native kube-rs"
)]
struct Args {
    /// CI mode: 20 objects, default client limits only, a 15 s steady window, 10 objects per
    /// kind in the many-operators run.
    #[arg(long)]
    quick: bool,
    /// Memcached objects in the one-operator runs [default: 1000, or 20 with --quick].
    #[arg(long)]
    crs: Option<usize>,
    /// Parents reconciled at once, the same for every operator.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Length of the steady-state window [default: 60 s, or 15 s with --quick].
    #[arg(long)]
    steady_seconds: Option<u64>,
    /// Kinds in the many-operators run.
    #[arg(long, default_value_t = 10)]
    kinds: usize,
    /// Objects per kind in the many-operators run [default: 100, or 10 with --quick].
    #[arg(long)]
    per_kind: Option<usize>,
    /// Run only these contestants (go, native, wasmop, starlark) [default: all, without
    /// starlark with --quick].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Skip the many-operators run.
    #[arg(long)]
    skip_many: bool,
    /// Skip the plugin-call timing.
    #[arg(long)]
    skip_calls: bool,
    /// The scale curve: parents of size 1, a fresh plane per contestant per point
    /// [default: 1000,5000,10000; none with --quick].
    #[arg(long, value_delimiter = ',')]
    scale: Option<Vec<usize>>,
    /// The plugin curve: this many kinds with 10 parents each, K Go processes against one host
    /// with K plugins [default: 10,20,50,100; none with --quick].
    #[arg(long, value_delimiter = ',')]
    plugins: Option<Vec<usize>>,
    /// Go processes run in the plugin curve at most; beyond, the Go figure is left out.
    #[arg(long, default_value_t = 100)]
    max_go_processes: usize,
    /// Measure the plane's own cost of each kind of write (POST against server-side apply,
    /// with no operator) for this many objects [default: --crs; none with --quick].
    #[arg(long)]
    floor: Option<usize>,
    /// Only the plane's cost of each kind of write; nothing else.
    #[arg(long)]
    floor_only: bool,
    /// Parents in the sharding part: 1, 2 and 3 replicas with `--shards 12`, each on a fresh
    /// plane with sharded watches [default: 3000; none with --quick].
    #[arg(long)]
    shards_parents: Option<usize>,
    /// Only the sharding part; nothing else.
    #[arg(long)]
    shards_only: bool,
    /// Replica counts of the sharding part, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = shards::REPLICAS)]
    shards_replicas: Vec<usize>,
    /// Only the plugin-call timing (and, without --quick, the optimisation levels); nothing
    /// else, no plane.
    #[arg(long)]
    calls_only: bool,
    /// Where to write the report [default: docs/benchmarks.md, or
    /// target/bench/benchmarks-quick.md with --quick, or target/bench/benchmarks-shards.md
    /// with --shards-only, or target/bench/benchmarks-calls.md with --calls-only].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The command line, as run.
fn command_line() -> String {
    let run = if cfg!(debug_assertions) {
        "cargo run -p bench --"
    } else {
        "cargo run --release -p bench --"
    };
    std::iter::once(run.to_owned())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `c` through `plan` if it is `selected`; a failure is noted and kept as its message.
async fn measure(
    c: Contestant,
    selected: &[Contestant],
    art: &artifacts::Artifacts,
    plan: &Plan,
    settings: &Settings,
    tag: &str,
) -> Option<Result<scenario::Outcome, String>> {
    if !selected.contains(&c) {
        return None;
    }
    let r = scenario::run(c, art, plan, settings, tag).await;
    if let Err(e) = &r {
        note!("[{tag}] {} failed: {e:#}", c.label());
    }
    Some(r.map_err(|e| format!("{e:#}")))
}

/// Seconds since the runner started.
fn elapsed() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// Where the part of the report file that the bench does not write begins.
const KEPT_FROM: &str = "\n## Measured by the test suites\n";

fn main() -> ExitCode {
    elapsed();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(report) if !report.failed() => ExitCode::SUCCESS,
        Ok(_) => {
            note!("something is broken; see Failures in the report");
            ExitCode::FAILURE
        }
        Err(e) => {
            note!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<Report> {
    let started = std::time::Instant::now();
    // The Starlark host joins a quick run only when named: CI's run stays as long.
    let selected: Vec<Contestant> = Contestant::ALL
        .into_iter()
        .filter(|&c| {
            if args.only.is_empty() {
                !(args.quick && c == Contestant::Starlark)
            } else {
                args.only.iter().any(|o| o == c.key())
            }
        })
        .collect();
    if selected.is_empty() {
        bail!("--only names none of go, native, wasmop, starlark");
    }
    let crs = args.crs.unwrap_or(if args.quick { 20 } else { 1000 });
    let steady =
        Duration::from_secs(
            args.steady_seconds
                .unwrap_or(if args.quick { 15 } else { 60 }),
        );
    let per_kind = args.per_kind.unwrap_or(if args.quick { 10 } else { 100 });
    let many_kinds: Vec<Kind> = (0..args.kinds).map(Kind::bench).collect();
    let scale = args.scale.clone().unwrap_or(if args.quick {
        Vec::new()
    } else {
        vec![1000, 5000, 10_000]
    });
    let plugin_counts = args.plugins.clone().unwrap_or(if args.quick {
        Vec::new()
    } else {
        vec![10, 20, 50, 100]
    });
    let most_kinds = if args.shards_only || args.calls_only {
        0
    } else {
        plugin_counts
            .iter()
            .copied()
            .chain((!args.skip_many).then_some(args.kinds))
            .max()
            .unwrap_or(0)
    };
    let shards_parents = args
        .shards_parents
        .or((!args.quick || args.shards_only).then_some(3000));
    let art = tokio::task::spawn_blocking({
        let kinds: Vec<Kind> = (0..most_kinds).map(Kind::bench).collect();
        move || artifacts::build(&kinds)
    })
    .await??;

    if args.shards_only {
        let shards = sharding(&art, shards_parents.unwrap_or(3000), &args).await;
        let report = Report {
            shards: Some(shards),
            ..part_report("the sharding part only".into(), started)
        };
        write_report(&report, &part_out(&args, "benchmarks-shards.md"))?;
        return Ok(report);
    }

    let calls = if args.skip_calls {
        None
    } else {
        note!("timing plugin calls");
        let wasm = art.memcached.clone();
        let n = if args.quick { 300 } else { 2000 };
        let result = tokio::task::spawn_blocking(move || calls::measure(&wasm, n)).await?;
        Some(result.map_err(|e| format!("{e:#}")))
    };
    let opt_levels = if args.skip_calls || args.quick {
        None
    } else {
        note!("building and timing the plugin at other optimisation levels");
        let wasm = art.memcached.clone();
        let result = tokio::task::spawn_blocking(move || {
            calls::opt_levels(&wasm, &["z", "s", "2", "3"], 2000)
        })
        .await?;
        Some(result.map_err(|e| format!("{e:#}")))
    };
    if args.calls_only {
        let report = Report {
            calls,
            opt_levels,
            ..part_report("the plugin-call timing only".into(), started)
        };
        write_report(&report, &part_out(&args, "benchmarks-calls.md"))?;
        return Ok(report);
    }

    let floor_n = args.floor.or((!args.quick).then_some(crs));
    let floors = match floor_n {
        Some(n) => {
            note!("[floor] the plane's cost of {n} writes of each kind, no operator");
            Some(
                floor::measure(n, args.concurrency)
                    .await
                    .map_err(|e| format!("{e:#}")),
            )
        }
        None => None,
    };
    if args.floor_only {
        let report = Report {
            floors,
            method: true,
            ..part_report(format!("concurrency {}", args.concurrency), started)
        };
        println!("{}", report.markdown());
        return Ok(report);
    }

    let mut limits: Vec<(String, Option<(f64, u32)>)> =
        vec![("default client rate limits".into(), None)];
    if !args.quick {
        limits.push((
            "client rate limits lifted (1000 QPS, burst 2000)".into(),
            Some((1000.0, 2000)),
        ));
    }
    let one_kind = Plan {
        kinds: vec![Kind::memcached()],
        per_kind: crs,
        steady,
        hot_swap: true,
        size_one: false,
        new_pods: true,
    };
    let mut single = Vec::new();
    for (i, (title, limit)) in limits.iter().enumerate() {
        let settings = Settings {
            concurrency: args.concurrency,
            resync: Duration::from_secs(10),
            limits: *limit,
        };
        let mut results = Vec::new();
        for c in Contestant::ALL {
            let tag = format!("run{i}");
            let outcome = measure(c, &selected, &art, &one_kind, &settings, &tag);
            results.push((c, outcome.await));
        }
        single.push(SingleRun {
            title: title.clone(),
            results,
        });
    }

    let many = if args.skip_many {
        None
    } else {
        let plan = Plan {
            kinds: many_kinds.clone(),
            per_kind,
            steady: steady.min(Duration::from_secs(15)),
            hot_swap: false,
            size_one: false,
            new_pods: true,
        };
        let settings = Settings {
            concurrency: args.concurrency,
            resync: Duration::from_secs(10),
            limits: None,
        };
        let selected = &selected;
        let go = measure(Contestant::Go, selected, &art, &plan, &settings, "many").await;
        let wasmop = measure(Contestant::Wasmop, selected, &art, &plan, &settings, "many").await;
        Some(ManyRun {
            kinds: args.kinds,
            per_kind,
            go,
            wasmop,
        })
    };

    let default_settings = Settings {
        concurrency: args.concurrency,
        resync: Duration::from_secs(10),
        limits: None,
    };
    let mut scale_runs = Vec::new();
    for &n in &scale {
        let plan = Plan {
            kinds: vec![Kind::memcached()],
            per_kind: n,
            steady: Duration::ZERO,
            hot_swap: false,
            size_one: true,
            new_pods: false,
        };
        let mut results = Vec::new();
        for c in Contestant::ALL {
            let tag = format!("scale{n}");
            let outcome = measure(c, &selected, &art, &plan, &default_settings, &tag);
            results.push((c, outcome.await));
        }
        scale_runs.push(ScaleRun {
            parents: n,
            results,
        });
    }
    let mut plugin_runs = Vec::new();
    for &k in &plugin_counts {
        let plan = Plan {
            kinds: (0..k).map(Kind::bench).collect(),
            per_kind: 10,
            steady: Duration::from_secs(15),
            hot_swap: false,
            size_one: false,
            new_pods: false,
        };
        let tag = format!("plugins{k}");
        // Past --max-go-processes, the Go side is left out.
        let go_too: Vec<Contestant> = selected
            .iter()
            .copied()
            .filter(|&c| c != Contestant::Go || k <= args.max_go_processes)
            .collect();
        let go = measure(
            Contestant::Go,
            &go_too,
            &art,
            &plan,
            &default_settings,
            &tag,
        )
        .await;
        let wasmop = measure(
            Contestant::Wasmop,
            &go_too,
            &art,
            &plan,
            &default_settings,
            &tag,
        );
        let wasmop = wasmop.await;
        plugin_runs.push(ManyRun {
            kinds: k,
            per_kind: 10,
            go,
            wasmop,
        });
    }

    let shards = match shards_parents {
        Some(n) => Some(sharding(&art, n, &args).await),
        None => None,
    };

    let report = Report {
        command: command_line(),
        date: report::today(),
        machine: report::machine(),
        setup: format!(
            "{crs} Memcached objects (spec.size 1–3) created by {} clients in parallel, one per \
             namespace; concurrency {} for every operator; forced resync every 10 s; steady \
             window {} s",
            cluster::NAMESPACES,
            args.concurrency,
            steady.as_secs()
        ) + if cfg!(debug_assertions) {
            "; **built in the dev profile**: a check that everything runs, not figures to compare"
        } else {
            ""
        },
        single,
        many,
        scale: scale_runs,
        plugins: plugin_runs,
        floors,
        shards,
        calls,
        opt_levels,
        took_secs: started.elapsed().as_secs_f64(),
        method: true,
    };
    let out = args.out.clone().unwrap_or_else(|| {
        if args.quick {
            artifacts::bench_dir().join("benchmarks-quick.md")
        } else {
            artifacts::root().join("docs/benchmarks.md")
        }
    });
    write_report(&report, &out)?;
    Ok(report)
}

/// The report of one part run alone (`--*-only`): the part's fields are set by the caller.
fn part_report(setup: String, started: std::time::Instant) -> Report {
    Report {
        command: command_line(),
        date: report::today(),
        machine: report::machine(),
        setup,
        single: Vec::new(),
        many: None,
        scale: Vec::new(),
        plugins: Vec::new(),
        floors: None,
        shards: None,
        calls: None,
        opt_levels: None,
        took_secs: started.elapsed().as_secs_f64(),
        method: false,
    }
}

/// Where a part run alone writes its report: `--out`, or `name` under `target/bench`.
fn part_out(args: &Args, name: &str) -> PathBuf {
    args.out
        .clone()
        .unwrap_or_else(|| artifacts::bench_dir().join(name))
}

/// The sharding part: `parents` parents on each of `--shards-replicas` replica counts (1, 2
/// and 3), each on a fresh plane; a failure is noted and kept as its message.
async fn sharding(art: &artifacts::Artifacts, parents: usize, args: &Args) -> shards::Sharding {
    let mut runs = Vec::new();
    for &r in &args.shards_replicas {
        let result = shards::measure(art, parents, r, args.concurrency).await;
        if let Err(e) = &result {
            note!("[shards{r}] failed: {e:#}");
        }
        runs.push((r, result.map_err(|e| format!("{e:#}"))));
    }
    shards::Sharding {
        parents,
        concurrency: args.concurrency,
        runs,
    }
}

/// Prints the report and writes it to `out`, keeping what follows [`KEPT_FROM`] there.
fn write_report(report: &Report, out: &std::path::Path) -> Result<()> {
    let text = report.markdown();
    println!("{text}");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Numbers other runs measured (the test suites') follow the report and are kept.
    let kept = std::fs::read_to_string(out)
        .ok()
        .and_then(|old| old.find(KEPT_FROM).map(|i| old[i..].to_owned()))
        .unwrap_or_default();
    std::fs::write(out, text + &kept).with_context(|| format!("writing {}", out.display()))?;
    note!("report written to {}", out.display());
    Ok(())
}
