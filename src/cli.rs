//! The command line (clap derive). No logic here: `commands` runs each one.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "baton", version = crate::LONG_VERSION, about = "Load balancer that never drops a connection on reload")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground (systemd Type=notify).
    Run(RunArgs),
    /// Validate the config and print the effective settings.
    Check(CheckArgs),
    /// Ask the running daemon for a new generation; wait for the outcome.
    Reload(ReloadArgs),
    /// Show generations, listeners, pools and backends (from the admin API).
    Status(StatusArgs),
    /// Drain or restore one backend (by global index, name, or a DNS member's name@address).
    Backend(BackendArgs),
    /// Demo: backends, a proxy, steady traffic and live reloads, no config needed.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print the raw JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BackendArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// What to do with the backend.
    #[arg(value_enum)]
    pub action: BackendAction,
    /// The backend's global index (config order, from 0), its name, or
    /// one DNS member's `name@address` (`app1@10.0.0.5:8080`).
    pub id: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BackendAction {
    Drain,
    Restore,
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// The config file.
    #[arg(short, long, env = "BATON_CONFIG", default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(flatten)]
    pub budgets: BudgetArgs,
}

/// The budgets too, though a reload changes none of the running daemon's:
/// the config is checked here as the daemon reads it (`reload.drain_timeout`
/// defaults to the stop's, which `BATON_DRAIN_TIMEOUT` may set), or a
/// config the daemon takes would be refused before it is asked.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Under their own heading in `--help`: `baton reload --drain-timeout
    /// 30m` reads as a longer drain for this reload, and changes nothing.
    #[command(
        flatten,
        next_help_heading = "The running daemon's budgets, as it was started with them (to check the config as it reads it; a reload changes none: set them in the unit and restart)"
    )]
    pub budgets: BudgetArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(flatten)]
    pub budgets: BudgetArgs,
    /// The installed unit whose TimeoutStopSec is compared with the drain
    /// budgets, and whose own budgets (ExecStart= flags, Environment=) are
    /// checked with where none is given (default: the first baton.service
    /// systemd would load).
    #[arg(long)]
    pub unit: Option<PathBuf>,
}

/// Stop budgets that beat the file (flag > environment > file > default).
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// Budget for in-flight work at a stop (overrides shutdown.drain_timeout).
    #[arg(long, env = "BATON_DRAIN_TIMEOUT", allow_hyphen_values = true)]
    pub drain_timeout: Option<String>,
    /// Keep serving this long after readiness flips (overrides shutdown.pre_stop_delay).
    #[arg(long, env = "BATON_PRE_STOP_DELAY", allow_hyphen_values = true)]
    pub pre_stop_delay: Option<String>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long the client traffic runs (at most a day).
    #[arg(long, default_value = "10s", value_parser = demo_duration)]
    pub duration: std::time::Duration,
    /// How many live reloads happen while it runs (at most 10000).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub reloads: u32,
}

/// A demo's `--duration`, a day at most: a longer one was past what the
/// clock's arithmetic holds, and the demo panicked with its daemon running.
fn demo_duration(text: &str) -> Result<std::time::Duration, String> {
    const DAY: std::time::Duration = std::time::Duration::from_secs(86_400);
    match humantime::parse_duration(text) {
        Ok(d) if d <= DAY => Ok(d),
        Ok(_) => Err("at most a day (24h)".into()),
        Err(err) => Err(err.to_string()),
    }
}
