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

/// `wasmop compile-plugin`.
fn compile_plugin(args: &crate::cli::CompilePluginArgs) -> anyhow::Result<()> {
    let order = crate::sandbox::CompileOrder {
        max_instances: args.max_instances,
        functions: args
            .functions
            .as_deref()
            .map(|dir| (dir, args.functions_max_bytes)),
        out: args.out.as_deref(),
    };
    crate::sandbox::serve_compile(&order).map_err(anyhow::Error::msg)
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
