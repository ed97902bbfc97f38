//! What `baton check` reads of the installed `baton.service`: the timeouts
//! systemd would hold baton to, the room in its fd store and what
//! `ExecReload=` runs, from the unit file and then its drop-ins,
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
/// small; and when `ExecReload=` runs more than `baton reload`.
/// `explicit` is `--unit`.
pub fn warn_about_the_unit(explicit: Option<&Path>, c: &Config) {
    let files: Vec<(PathBuf, String)> = unit_files(explicit)
        .into_iter()
        .filter_map(|path| match std::fs::read_to_string(&path) {
            Ok(text) => Some((path, text)),
            Err(_) => {
                eprintln!("baton: warning: cannot read unit {}", path.display());
                None
            }
        })
        .collect();
    let stop = Bound {
        needed: c.timeout_stop(),
        what: "pre_stop_delay + drain_timeout + 5s",
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
        if let Some(found) = last_setting(&files, &keys) {
            bound.check(&found);
        }
    }
    if let Some(store) = last_setting(&files, &["FileDescriptorStoreMax"]) {
        warn_about_fd_store(&store, c.listening_sockets());
    }
    if !files.is_empty() {
        warn_about_reload_commands(&reload_commands(&files));
    }
}

/// The commands `ExecReload=` ends up with, as systemd builds the list:
/// each assignment adds its commands (several on one line apart by a lone
/// `;`), an empty one clears it.
fn reload_commands(files: &[(PathBuf, String)]) -> Vec<Setting<'_>> {
    let mut commands = Vec::new();
    for assignment in assignments(files, &["ExecReload"]) {
        if assignment.value.is_empty() {
            commands.clear();
        }
        let words: Vec<&str> = assignment.value.split_whitespace().collect();
        for command in words.split(|w| *w == ";").filter(|c| !c.is_empty()) {
            commands.push(Setting {
                value: command.join(" "),
                ..assignment
            });
        }
    }
    commands
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

/// The words of `command` (one `ExecReload=` command), its prefixes and
/// quotes taken off.
fn words(command: &str) -> Vec<&str> {
    // systemd's prefixes: ignore failure, argv0, privileges, no variables.
    command
        .trim_start_matches(['-', '@', '+', '!', ':', '|'])
        .split_whitespace()
        .map(|w| w.trim_matches(['"', '\'']))
        .collect()
}

/// Where `command` runs `baton reload`, alone or inside another (`env`,
/// a shell): the place of its word `reload`, right after a word naming
/// `baton`.
fn reload_word(words: &[&str]) -> Option<usize> {
    let baton = |w: &str| Path::new(w).file_name().is_some_and(|n| n == "baton");
    // A shell's `reload;` or `reload&&` ends the word too.
    let reload = |w: &str| w.trim_end_matches([';', '&', '|']) == "reload";
    (1..words.len()).find(|&i| reload(words[i]) && baton(words[i - 1]))
}

/// Whether `command` runs more after `baton reload` itself (a shell's
/// `baton reload && notify-team`): a shell operator from its `reload` on.
fn chains_after_reload(command: &str) -> bool {
    let words = words(command);
    let Some(at) = reload_word(&words) else {
        return false;
    };
    words[at..]
        .iter()
        .any(|w| ["&&", "||", ";", "|", "&"].iter().any(|op| w.contains(op)))
}

/// The commands that run on after `baton reload` returns: those after the
/// last command that runs it, and one that chains more after it in the
/// same command. None without a `baton reload` (a `kill -HUP` returns at
/// once), and none before it (they run before the reload begins).
fn after_baton_reload<'a, 'b>(commands: &'a [Setting<'b>]) -> Vec<&'a Setting<'b>> {
    let Some(last) = commands
        .iter()
        .rposition(|c| reload_word(&words(&c.value)).is_some())
    else {
        return Vec::new();
    };
    let chained = commands[..=last]
        .iter()
        .filter(|c| chains_after_reload(&c.value));
    chained.chain(&commands[last + 1..]).collect()
}

/// systemd takes the new generation's `MAINPID=` only once every
/// `ExecReload=` command has ended, and the old generation names it for
/// 1.5 s after `baton reload` returns: a command that runs longer after it
/// (a notification, a sleep) makes systemd fail the reload and restart
/// baton.
fn warn_about_reload_commands(commands: &[Setting<'_>]) {
    for c in after_baton_reload(commands) {
        eprintln!(
            "baton: warning: ExecReload={} in {} runs after `baton reload`: systemd takes the new generation as the service's main process only once every ExecReload= command has ended, and one that runs on past `baton reload` (more than 1.5 s) makes systemd fail the reload and restart baton; run it elsewhere, after `systemctl reload`",
            c.value,
            c.file.display()
        );
    }
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
struct Setting<'a> {
    key: &'a str,
    value: String,
    file: &'a Path,
}

fn last_setting<'a>(files: &'a [(PathBuf, String)], keys: &[&'a str]) -> Option<Setting<'a>> {
    assignments(files, keys).pop()
}

/// Every assignment of any of `keys`, in the order systemd reads them.
fn assignments<'a>(files: &'a [(PathBuf, String)], keys: &[&'a str]) -> Vec<Setting<'a>> {
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

impl Bound {
    fn check(&self, s: &Setting<'_>) {
        let configured = match s.value.parse::<u64>() {
            Ok(secs) => Some(Duration::from_secs(secs)),
            Err(_) => humantime::parse_duration(&s.value).ok(),
        };
        match configured {
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
            // Empty: back to systemd's default (90 s), not checked here.
            None if s.value == "infinity" || s.value.is_empty() => {}
            None => eprintln!(
                "baton: warning: cannot read {}={} in {}",
                s.key,
                s.value,
                s.file.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baton_reload_is_found_alone_or_inside_another_command() {
        for reload in [
            "/usr/bin/baton reload",
            "baton reload",
            "-/usr/local/bin/baton reload --control /run/baton/control.sock",
            "+/usr/bin/baton  reload",
            "\"/usr/bin/baton\" reload",
            "@/usr/bin/baton baton reload",
            "/usr/bin/env BATON_CONFIG=/etc/b.toml /usr/bin/baton reload",
            "/bin/sh -c 'exec /usr/bin/baton reload'",
        ] {
            assert!(reload_word(&words(reload)).is_some(), "{reload}");
            assert!(!chains_after_reload(reload), "{reload}");
        }
        for other in [
            "/usr/bin/kill -HUP $MAINPID",
            "/usr/bin/baton check -c /etc/baton/pre-reload.toml",
            "/usr/bin/batonx reload",
        ] {
            assert!(reload_word(&words(other)).is_none(), "{other}");
        }
        assert!(chains_after_reload(
            "/bin/sh -c 'baton reload && notify-team'"
        ));
        assert!(chains_after_reload("/bin/sh -c \"baton reload; sleep 5\""));
    }

    /// Only what runs after the last `baton reload` holds the reload
    /// open: a check before it, or a `kill -HUP` instead of it, does not.
    #[test]
    fn only_commands_after_baton_reload_are_warned_of() {
        let after = |unit: &str| {
            let files = [(PathBuf::from("u"), unit.to_string())];
            let commands = reload_commands(&files);
            after_baton_reload(&commands)
                .iter()
                .map(|c| c.value.clone())
                .collect::<Vec<_>>()
        };
        assert!(after("ExecReload=/usr/bin/baton reload\n").is_empty());
        assert_eq!(
            after("ExecReload=/bin/sh -c '/usr/bin/baton reload'\nExecReload=/usr/bin/notify\n"),
            ["/usr/bin/notify"],
            "after a wrapped baton reload too"
        );
        assert_eq!(
            after("ExecReload=/bin/sh -c 'baton reload && notify'\n"),
            ["/bin/sh -c 'baton reload && notify'"],
            "once, for the chain in it"
        );
        assert!(
            after("ExecReload=/usr/bin/baton check\nExecReload=/usr/bin/baton reload\n").is_empty()
        );
        assert!(after("ExecReload=/bin/kill -HUP $MAINPID\n").is_empty());
        assert_eq!(
            after("ExecReload=/usr/bin/baton reload\n# a note \\\nExecReload=/usr/bin/notify\n"),
            ["/usr/bin/notify"],
            "a comment does not continue"
        );
        assert_eq!(
            after("ExecReload=/usr/bin/baton \\\n# a note\n  reload\nExecReload=/usr/bin/notify\n"),
            ["/usr/bin/notify"],
            "a comment inside a continued line is dropped"
        );
        assert_eq!(
            after("ExecReload=/usr/bin/baton reload ; /usr/bin/sleep 5\n"),
            ["/usr/bin/sleep 5"]
        );
        assert_eq!(
            after("ExecReload=/usr/bin/baton \\\n  reload\nExecReload=/usr/bin/notify\n"),
            ["/usr/bin/notify"]
        );
        assert!(
            after("ExecReload=/usr/bin/notify\nExecReload=\nExecReload=/usr/bin/baton reload\n")
                .is_empty(),
            "an empty assignment clears the list"
        );
    }
}
