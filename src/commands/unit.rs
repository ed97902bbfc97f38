//! What `baton check` reads of the installed `baton.service`: the timeouts
//! systemd would hold baton to, its open-file limit, the room in its fd
//! store and its sandbox
//! (see `sandbox`), from the unit
//! file and then its drop-ins,
//! the place an admin's override survives a package upgrade (the package
//! replaces the unit file itself).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;

/// Where systemd looks for `baton.service` and its `.d` drop-ins, the one
/// that wins first.
const UNIT_DIRS: &[&str] = &[
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
];

/// Warns when the unit's `TimeoutStopSec` would SIGKILL baton mid-drain, or
/// its `TimeoutStartSec` (which bounds `ExecReload=` too) would kill
/// `baton reload` before the reload it waits for is over, so that systemd
/// calls failed a reload that may well succeed; when its fd store is too
/// small; when its sandbox keeps baton from a file it writes (see
/// `sandbox`); and refuses a file its user may not read (see `reads`):
/// true then. `files` are the unit's (`read_unit_files`).
pub fn warn_about_the_unit(files: &[(PathBuf, String)], c: &Config) -> bool {
    let stop = Bound {
        needed: c.timeout_stop(),
        what: "the stop's pause (pre_stop_delay, at least 1.5s with defer_accept) + drain_timeout + 5s",
        harm: "systemd would kill baton mid-drain",
    };
    let start = Bound {
        needed: c.reload_wait(),
        what: "reload.ready_timeout + 10s, what `baton reload` waits",
        harm: "systemd would kill ExecReload's `baton reload` and call failed a reload still under way",
    };
    for (keys, bound) in [
        (["TimeoutSec", "TimeoutStopSec"], stop),
        (["TimeoutSec", "TimeoutStartSec"], start),
    ] {
        match last_setting(files, &keys) {
            Some(found) => bound.check(&found),
            None if !files.is_empty() => bound.check_default(keys[1]),
            None => {}
        }
    }
    if let Some(store) = last_setting(files, &["FileDescriptorStoreMax"]) {
        warn_about_fd_store(&store, c.listening_sockets());
    }
    if !files.is_empty() {
        warn_about_fd_limit(last_setting(files, &["LimitNOFILE"]), c.max_connections());
    }
    let Some((unit, _)) = files.first() else {
        return false;
    };
    super::sandbox::warn_about_writes(files, c, unit);
    super::reads::refuse_unreadable(files, c, unit)
}

/// The unit (`explicit` is `--unit`, else the one systemd would load) and
/// its drop-ins with their text; one that cannot be read is warned of,
/// and left out.
pub fn read_unit_files(explicit: Option<&Path>) -> Vec<(PathBuf, String)> {
    unit_files(explicit)
        .into_iter()
        .filter_map(|path| match std::fs::read_to_string(&path) {
            Ok(text) => Some((path, text)),
            Err(err) => {
                eprintln!("baton: warning: cannot read unit {}: {err}", path.display());
                None
            }
        })
        .collect()
}

/// The stop budget the unit's service runs with, where it sets one:
/// `flag` (`--drain-timeout`) in its `ExecStart=`, else `variable`
/// (`BATON_DRAIN_TIMEOUT`) in its `Environment=`, the last assignment
/// winning, as `baton run` and systemd read them. `check` validates the
/// config with it: checked with its own, a drop-in's budget went unseen,
/// and a config `check` passed was refused at the next start (exit 78, no
/// restart) or cut short by `TimeoutStopSec`.
/// A value that names a variable (`${DRAIN}`) is not taken: what it
/// stands for is not known here.
pub fn units_budget(files: &[(PathBuf, String)], flag: &str, variable: &str) -> Option<String> {
    service_setting(files, &[flag], variable).filter(|v| !v.contains('$'))
}

/// Whether the unit reads an `EnvironmentFile=`, which `check` does not
/// (a variable set there beats `Environment=`'s).
pub fn reads_environment_files(files: &[(PathBuf, String)]) -> bool {
    last_setting(files, &["EnvironmentFile"]).is_some()
}

/// What the unit's service is given by one of `flags` in its
/// `ExecStart=` (`--flag VALUE` or `--flag=VALUE`), else by `variable` in
/// its `Environment=` (the last assignment wins, and an empty
/// `Environment=` clears those before it, as systemd reads them). Words
/// are split and unquoted as systemd splits them; an empty value is none.
/// A value may name a variable (`${DRAIN}`), which the caller cannot know.
pub(super) fn service_setting(
    files: &[(PathBuf, String)],
    flags: &[&str],
    variable: &str,
) -> Option<String> {
    let exec = last_setting(files, &["ExecStart"])
        .map(|s| s.value)
        .unwrap_or_default();
    let words = systemd_words(&exec);
    let from_args = words.iter().enumerate().find_map(|(i, word)| {
        flags.iter().find_map(|flag| {
            if word == flag {
                words.get(i + 1).cloned()
            } else {
                word.strip_prefix(flag)?
                    .strip_prefix('=')
                    .map(str::to_string)
            }
        })
    });
    let assigned = format!("{variable}=");
    let from_env = || {
        let mut value = None;
        for setting in assignments(files, &["Environment"]) {
            if setting.value.is_empty() {
                value = None;
            }
            for word in systemd_words(&setting.value) {
                if let Some(v) = word.strip_prefix(assigned.as_str()) {
                    value = Some(v.to_string());
                }
            }
        }
        value
    };
    from_args.or_else(from_env).filter(|v| !v.is_empty())
}

/// A setting's words as systemd splits them: at whitespace outside
/// double or single quotes, the quotes taken off.
fn systemd_words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in value.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// A unit file's lines as systemd reads them: comments (`#` or `;` first)
/// dropped, within a continued line too, and one ending in a backslash
/// goes on on the next.
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with(['#', ';']) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    if !pending.is_empty() {
        lines.push(pending);
    }
    lines
}

/// systemd refuses what goes past `FileDescriptorStoreMax`, so a restart
/// would find only some of the sockets (the rest of each listener's shards
/// closed, their queued connections reset).
fn warn_about_fd_store(store: &Setting<'_>, sockets: usize) {
    match store.value.parse::<usize>() {
        Ok(max) if max < sockets => eprintln!(
            "baton: warning: {}={} in {} is below the {sockets} listening sockets baton keeps there (a shard of each listener for every worker, admin and control; more once a reload lowered workers, as it keeps every shard): a restart would lose some",
            store.key,
            store.value,
            store.file.display()
        ),
        Ok(_) => {}
        Err(_) => eprintln!(
            "baton: warning: cannot read {}={} in {}",
            store.key,
            store.value,
            store.file.display()
        ),
    }
}

/// What systemd grants a unit that sets no `LimitNOFILE=` (the hard half
/// of `DefaultLimitNOFILE=1024:524288` in system.conf, since v240).
const SYSTEMD_DEFAULT_NOFILE: u64 = 524_288;

/// baton raises its soft open-file limit to the hard one, and no further:
/// under a hard limit below the fds its listeners' `max_connections` may
/// take (a client's and a backend's each), a flood meets EMFILE before the
/// cap, and clients already taken fail at their backend's connect (503)
/// where the cap would have left the excess waiting in the backlog.
fn warn_about_fd_limit(limit: Option<Setting<'_>>, connections: usize) {
    let needed = crate::lifecycle::fd_limit::fds_for(connections);
    let (hard, said) = match &limit {
        None => (
            SYSTEMD_DEFAULT_NOFILE,
            format!("the unit sets no LimitNOFILE, and systemd's default hard limit ({SYSTEMD_DEFAULT_NOFILE})"),
        ),
        Some(s) if s.value == "infinity" || s.value.ends_with(":infinity") => return,
        Some(s) => {
            let hard = s.value.rsplit(':').next().unwrap_or_default();
            match hard.parse::<u64>() {
                Ok(hard) => (hard, format!("{}={} in {}", s.key, s.value, s.file.display())),
                Err(_) => {
                    eprintln!(
                        "baton: warning: cannot read {}={} in {}",
                        s.key,
                        s.value,
                        s.file.display()
                    );
                    return;
                }
            }
        }
    };
    if hard < needed {
        eprintln!(
            "baton: warning: {said} is below the {needed} open files the listeners' max_connections ({connections} in all) may take, a client's and a backend's each and 1024 more: a flood would meet EMFILE before max_connections, and clients taken would get 503s; raise LimitNOFILE in a drop-in or lower max_connections"
        );
    }
}

/// The unit file and its drop-ins, in the order systemd applies them: the
/// unit, then every `*.conf` of its `.d` folders by file name, where a name
/// in a folder that wins hides the same name in the others.
fn unit_files(explicit: Option<&Path>) -> Vec<PathBuf> {
    let (unit, folders): (Option<PathBuf>, Vec<PathBuf>) = match explicit {
        Some(path) => {
            let mut folder = path.as_os_str().to_owned();
            folder.push(".d");
            (Some(path.to_path_buf()), vec![folder.into()])
        }
        None => (
            UNIT_DIRS
                .iter()
                .map(|d| Path::new(d).join("baton.service"))
                .find(|p| p.exists()),
            UNIT_DIRS
                .iter()
                .map(|d| Path::new(d).join("baton.service.d"))
                .collect(),
        ),
    };
    let Some(unit) = unit else {
        return Vec::new();
    };
    let mut dropins: BTreeMap<OsString, PathBuf> = BTreeMap::new();
    // The folder that wins last, so its files replace the others'.
    for folder in folders.iter().rev() {
        let Ok(entries) = std::fs::read_dir(folder) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "conf") {
                dropins.insert(entry.file_name(), entry.path());
            }
        }
    }
    std::iter::once(unit).chain(dropins.into_values()).collect()
}

/// A setting as systemd ends up with it: the last assignment of any of
/// `keys` (`TimeoutSec=` sets both timeouts), with where it was made.
pub(super) struct Setting<'a> {
    key: &'a str,
    pub(super) value: String,
    file: &'a Path,
}

/// An empty assignment is not one: systemd cannot parse it as a time or a
/// count, logs "ignoring", and the one before stays in force (a drop-in's
/// `TimeoutStopSec=` leaves the unit's 20 s, which `check` once took for
/// systemd's 90 s default, and did not check).
pub(super) fn last_setting<'a>(
    files: &'a [(PathBuf, String)],
    keys: &[&'a str],
) -> Option<Setting<'a>> {
    assignments(files, keys)
        .into_iter()
        .rev()
        .find(|s| !s.value.is_empty())
}

/// Every assignment of any of `keys`, in the order systemd reads them.
pub(super) fn assignments<'a>(
    files: &'a [(PathBuf, String)],
    keys: &[&'a str],
) -> Vec<Setting<'a>> {
    let mut found = Vec::new();
    for (file, text) in files {
        for line in logical_lines(text) {
            // systemd trims around the `=`.
            let Some((name, value)) = line.split_once('=') else {
                continue;
            };
            if let Some(key) = keys.iter().find(|k| **k == name.trim()) {
                found.push(Setting {
                    key,
                    value: value.trim().to_string(),
                    file,
                });
            }
        }
    }
    found
}

/// The least a timeout must be, what that is, and what a shorter one does.
struct Bound {
    needed: Duration,
    what: &'static str,
    harm: &'static str,
}

/// What systemd holds a unit to that sets no timeout of its own
/// (`DefaultTimeoutStopSec=` and `DefaultTimeoutStartSec=` in
/// system.conf, unless an admin changed them there).
const SYSTEMD_DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

impl Bound {
    fn check(&self, s: &Setting<'_>) {
        let configured = crate::config::duration::span(&s.value).ok();
        match configured {
            // systemd reads 0 as no timeout, as `infinity`.
            Some(Duration::ZERO) => {}
            Some(d) if d < self.needed => eprintln!(
                "baton: warning: {}={} in {} is shorter than {} = {}s: {}",
                s.key,
                s.value,
                s.file.display(),
                self.what,
                super::check::seconds_up(self.needed),
                self.harm
            ),
            Some(_) => {}
            None if s.value == "infinity" => {}
            None => eprintln!(
                "baton: warning: cannot read {}={} in {}",
                s.key,
                s.value,
                s.file.display()
            ),
        }
    }

    /// The unit sets no `key`: systemd's default applies.
    fn check_default(&self, key: &str) {
        if SYSTEMD_DEFAULT_TIMEOUT < self.needed {
            eprintln!(
                "baton: warning: the unit sets no {key}, and systemd's default ({}s, Default{key} in system.conf) is shorter than {} = {}s: {}; set {key} in a drop-in",
                SYSTEMD_DEFAULT_TIMEOUT.as_secs(),
                self.what,
                super::check::seconds_up(self.needed),
                self.harm
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Comments are dropped, inside continued lines too, and never
    /// continue; a trailing backslash continues; the last assignment wins.
    #[test]
    fn settings_are_read_as_systemd_reads_the_lines() {
        let last = |unit: &str| {
            let files = [(PathBuf::from("u"), unit.to_string())];
            last_setting(&files, &["TimeoutStopSec"]).map(|s| s.value)
        };
        let cases = [
            (
                "TimeoutStopSec=20\nTimeoutStopSec=30\n",
                Some("30"),
                "the last wins",
            ),
            (
                "TimeoutStopSec=20\n# a note \\\nTimeoutStopSec=30\n",
                Some("30"),
                "a comment does not continue",
            ),
            (
                "TimeoutStopSec=\\\n# a note\n  45s\n",
                Some("45s"),
                "a comment inside a continued line is dropped",
            ),
            ("; TimeoutStopSec=5\n# TimeoutStopSec=6\n", None, "comments"),
            (
                "TimeoutStopSec=20\nTimeoutStopSec=\n",
                Some("20"),
                "an empty one is ignored, as systemd ignores it",
            ),
        ];
        for (unit, expected, why) in cases {
            assert_eq!(last(unit).as_deref(), expected, "{why}: {unit:?}");
        }
    }

    /// The stop budget the service runs with, as systemd hands it over:
    /// quotes taken off, an empty `Environment=` clearing those before it,
    /// a flag beating the environment; a variable's name is not a value.
    #[test]
    fn a_units_budget_is_read_as_systemd_hands_it_over() {
        let budget = |unit: &str| {
            let files = [(PathBuf::from("u"), format!("[Service]\n{unit}"))];
            units_budget(&files, "--drain-timeout", "BATON_DRAIN_TIMEOUT")
        };
        let cases = [
            ("Environment=BATON_DRAIN_TIMEOUT=2m\n", Some("2m")),
            ("Environment=\"A=1\" \"BATON_DRAIN_TIMEOUT=2m\"\n", Some("2m")),
            ("Environment='BATON_DRAIN_TIMEOUT=2m 30s'\n", Some("2m 30s")),
            ("Environment=BATON_DRAIN_TIMEOUT=\"2m\"\n", Some("2m")),
            ("Environment=BATON_DRAIN_TIMEOUT=2m\nEnvironment=\n", None),
            ("Environment=BATON_DRAIN_TIMEOUT=2m\nEnvironment=BATON_DRAIN_TIMEOUT=\n", None),
            ("ExecStart=/usr/bin/baton run --drain-timeout \"90s\"\nEnvironment=BATON_DRAIN_TIMEOUT=2m\n", Some("90s")),
            ("ExecStart=/usr/bin/baton run --drain-timeout=${DRAIN}\n", None),
        ];
        for (unit, expected) in cases {
            assert_eq!(budget(unit).as_deref(), expected, "{unit:?}");
        }
    }
}
