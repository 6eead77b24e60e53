//! The `wasmop` binary: parses the command line and hands over to [`wasmop::cmd`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = wasmop::cli::Cli::parse();
    match wasmop::cmd::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line, the whole cause chain, no backtrace.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
