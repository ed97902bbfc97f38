//! The binary: parse the command line, run the command, exit with its code.

use clap::Parser;

fn main() -> std::process::ExitCode {
    baton::lifecycle::signals::hold_sigusr1();
    let cli = baton::cli::Cli::parse();
    if matches!(
        cli.command,
        baton::cli::Command::Reload(_) | baton::cli::Command::Check(_)
    ) {
        baton::lifecycle::signals::hold_unit_signals();
    }
    baton::commands::dispatch(cli.command).into()
}

/// jemalloc, for its thread caches of large and over-aligned blocks (why:
/// at `tikv-jemallocator` in Cargo.toml).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
