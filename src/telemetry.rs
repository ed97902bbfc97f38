//! Logging: `BATON_LOG` is the filter (default `info`), `BATON_LOG_FORMAT`
//! picks `text`, `json` or `auto` (plain text without colours or timestamps
//! when stderr is the journal, which adds its own).

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let format = std::env::var("BATON_LOG_FORMAT").unwrap_or_else(|_| "auto".into());
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match format.as_str() {
        "json" => builder.json().try_init(),
        "text" => builder.with_ansi(false).try_init(),
        _ if journal => builder.with_ansi(false).without_time().try_init(),
        _ => builder.with_ansi(false).try_init(),
    };
    if installed.is_err() {
        eprintln!("baton: logging was already initialised");
    }
}
