//! One module per subcommand of the `wasmop` binary.

pub mod capture;
pub mod image;
pub mod inspect;
pub mod new;
pub mod package;
pub mod push;
pub mod rbac;
pub mod render;
pub mod replay;
pub mod rollout;
pub mod run;
pub mod test;

use crate::cli::{Cli, Command};

/// Runs one parsed command line.
pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Render(args) => render::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Package(args) => package::run(args),
        Command::Push(args) => push::run(args),
        Command::Image(args) => image::run(args),
        Command::Rbac(args) => rbac::run(args),
        Command::Rollout(args) => rollout::run(args),
        Command::Capture(args) => capture::run(args),
        Command::Replay(args) => replay::run(args),
        Command::New(args) => new::run(args),
        Command::Test(args) => test::run(args),
        Command::CompilePlugin(args) => compile_plugin(&args),
    }
}

/// `wasmop compile-plugin`: a script's own fault goes to stdout as JSON, with its own exit
/// status, for the host to report as it would have in process.
fn compile_plugin(args: &crate::cli::CompilePluginArgs) -> anyhow::Result<()> {
    use crate::sandbox::{
        CompileFailure, CompileOrder, Language, Limits, PLUGIN_FAILED, ScriptOrder,
    };
    let limits = Limits {
        deadline: std::time::Duration::from_millis(args.deadline_ms),
        memory_bytes: args.memory_bytes,
        response_bytes: args.response_bytes,
    };
    let order = CompileOrder {
        max_instances: args.max_instances,
        functions: args
            .functions
            .as_deref()
            .map(|dir| (dir, args.functions_max_bytes)),
        out: args.out.as_deref(),
        script: match (&args.script, &args.language) {
            (Some(file), Some(language)) => Some(ScriptOrder {
                language: Language::named(language)
                    .ok_or_else(|| anyhow::anyhow!("no script language {language:?}"))?,
                file,
                limits,
            }),
            _ => None,
        },
    };
    match crate::sandbox::serve_compile(&order) {
        Ok(()) => Ok(()),
        Err(CompileFailure::Other(message)) => Err(anyhow::Error::msg(message)),
        Err(CompileFailure::Plugin(kind)) => {
            print(&serde_json::to_string(&kind)?)?;
            std::process::exit(PLUGIN_FAILED)
        }
    }
}

/// Writes `text` to stdout. A reader that went away (`| head`) is no error: the rest is
/// dropped, and the command still ends with its own exit status.
pub fn print(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
