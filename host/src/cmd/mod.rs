//! One module per subcommand of the `wasmop` binary.

pub mod inspect;
pub mod package;
pub mod rbac;
pub mod render;
pub mod run;

use crate::cli::{Cli, Command};

/// Runs one parsed command line.
pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Render(args) => render::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Package(args) => package::run(args),
        Command::Rbac(args) => rbac::run(args),
    }
}
