//! The binary: parse the command line, run the command, exit with its code.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = baton::cli::Cli::parse();
    let code = baton::commands::dispatch(cli.command);
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
