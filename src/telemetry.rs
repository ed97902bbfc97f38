//! Logging: `BATON_LOG` is the filter (default `info`), `BATON_LOG_FORMAT`
//! picks `text`, `json` or `auto` (plain text without colours or timestamps
//! when stderr is the journal, which adds its own). A value that is not
//! one of these is said on stderr, not taken silently.

pub fn init() {
    let filter = match std::env::var("BATON_LOG") {
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
        Ok(text) => tracing_subscriber::EnvFilter::try_new(&text).unwrap_or_else(|err| {
            eprintln!("baton: BATON_LOG={text:?} is not a log filter ({err}); logging at info");
            tracing_subscriber::EnvFilter::new("info")
        }),
    };
    let mut format = std::env::var("BATON_LOG_FORMAT").unwrap_or_else(|_| "auto".into());
    if !matches!(format.as_str(), "auto" | "text" | "json") {
        eprintln!("baton: BATON_LOG_FORMAT={format:?} is not auto, text or json; using auto");
        format = "auto".into();
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match format.as_str() {
        "json" => builder.json().try_init(),
        _ if format == "auto" && stderr_is_the_journal() => {
            builder.with_ansi(false).without_time().try_init()
        }
        _ => builder.with_ansi(false).try_init(),
    };
    if installed.is_err() {
        eprintln!("baton: logging was already initialised");
    }
}

/// systemd sets `JOURNAL_STREAM` to the `device:inode` of the stream it
/// connects stderr to; a child whose stderr was redirected elsewhere
/// inherits the variable all the same, so the stream itself is compared.
fn stderr_is_the_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(std::io::stderr()) else {
        return false;
    };
    stream.to_str() == Some(&format!("{}:{}", stat.st_dev, stat.st_ino))
}
