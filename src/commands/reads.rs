//! What `baton check` says of the files the service reads as its own
//! user: `check` runs as root and reads anything, the service runs as the
//! unit's `User=` (`baton` in the shipped unit), and its start, or its
//! reload, failed on a key only root may read (certbot's `privkey.pem` is
//! root's alone). Asked of the system itself, as that user with the
//! groups systemd gives it (util-linux's `setpriv`), so ACLs and groups
//! count as they will for the service. Anything it cannot ask or judge
//! (not root, no `setpriv`, a user not known yet, `DynamicUser=`, a
//! specifier, a capability that reads past permissions) silences it: a
//! false verdict is worse than none. What it says is sure, so it is an
//! error: the service would exit 78 on that config, and a restart leave
//! it down (`RestartPreventExitStatus=78`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::unistd::{Gid, Group, Uid, User};

use super::sandbox::is_yes;
use super::unit::assignments;
use crate::config::Config;

/// Says each file the service's user may not read; whether there was one
/// in the config the unit runs. Another config (a copy checked before it
/// is put in place, in a folder of root's) gets warnings: where it will
/// lie, and so who may read it, is not known yet.
pub fn refuse_unreadable(files: &[(PathBuf, String)], c: &Config, unit: &Path) -> bool {
    if !nix::unistd::geteuid().is_root() {
        return false;
    }
    let Some(service) = Service::of(files) else {
        return false;
    };
    let runs = units_config(files).is_some_and(|config| same_file(&c.source, &config));
    let said = if runs { "error" } else { "warning" };
    let mut unreadable = false;
    let mut asked: Vec<(&str, PathBuf)> = vec![("the config", c.source.clone())];
    asked.extend(
        c.files_read
            .iter()
            .map(|(key, path)| (key.as_str(), path.clone())),
    );
    let mut seen = std::collections::HashSet::new();
    for (key, path) in asked {
        // Asked as the service will open it: from `/`, not from here.
        let path = std::path::absolute(&path).unwrap_or(path);
        if !seen.insert(path.clone()) {
            continue;
        }
        match service.may_read(&path) {
            Some(true) => {}
            Some(false) => {
                unreadable = runs;
                eprintln!(
                    "baton: {said}: {key} {} cannot be read by User={} of {}: the service reads it at each start and reload, as that user (give it the file, e.g. `chown {}` and `chmod 400`, and search access to the folders above it)",
                    path.display(),
                    service.name,
                    unit.display(),
                    service.name,
                );
            }
            // setpriv is missing or refused: nothing more can be asked.
            None => return unreadable,
        }
    }
    unreadable
}

/// The config the unit's service reads: `-c` or `--config` in its
/// `ExecStart=`, else `BATON_CONFIG` in its `Environment=`, else the
/// default path (as `baton run` finds it); none known when the value
/// names a variable (`-c ${CONF}`).
fn units_config(files: &[(PathBuf, String)]) -> Option<PathBuf> {
    match super::unit::service_setting(files, &["-c", "--config"], "BATON_CONFIG") {
        Some(named) if named.contains('$') => None,
        Some(path) => Some(path.into()),
        None => Some(crate::config::DEFAULT_PATH.into()),
    }
}

/// Whether two paths name one file (or, where either cannot be
/// resolved, read alike from `/`).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => std::path::absolute(a).ok() == std::path::absolute(b).ok(),
    }
}

/// The user, group and supplementary groups the unit runs the service as.
struct Service {
    name: String,
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

impl Service {
    /// Read from the unit's last assignments (an empty one resets: `User=`
    /// back to root, `Group=` to the user's own); `None` where it cannot be
    /// judged.
    fn of(files: &[(PathBuf, String)]) -> Option<Service> {
        let last = |key: &str| {
            assignments(files, &[key])
                .pop()
                .map(|s| s.value.trim().to_string())
        };
        let written = last("User").filter(|u| !u.is_empty())?;
        let dynamic = last("DynamicUser").is_some_and(|v| is_yes(&v));
        let reads_anything = assignments(files, &["AmbientCapabilities"])
            .iter()
            .any(|s| s.value.contains("CAP_DAC_"));
        if written.contains('%') || dynamic || reads_anything {
            return None;
        }
        let account = match written.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(&written),
        }
        .ok()
        .flatten()?;
        if account.uid.is_root() {
            return None;
        }
        let gid = match last("Group").filter(|g| !g.is_empty()) {
            None => account.gid,
            Some(group) => group_id(&group)?,
        };
        // As systemd: the user's groups from the group database, with
        // `Group=` as the primary one, then `SupplementaryGroups=`.
        let name = std::ffi::CString::new(account.name.clone()).ok()?;
        let mut groups = nix::unistd::getgrouplist(&name, gid).ok()?;
        for line in assignments(files, &["SupplementaryGroups"]) {
            if line.value.trim().is_empty() {
                groups.retain(|g| *g == gid);
            }
            for group in line.value.split_whitespace() {
                groups.push(group_id(group)?);
            }
        }
        Some(Service {
            name: account.name,
            uid: account.uid,
            gid,
            groups,
        })
    }

    /// Whether the service may read `path`; `None` when that cannot be
    /// asked.
    fn may_read(&self, path: &Path) -> Option<bool> {
        let groups: Vec<String> = self.groups.iter().map(|g| g.to_string()).collect();
        let status = Command::new("setpriv")
            .args([
                "--reuid",
                &self.uid.to_string(),
                "--regid",
                &self.gid.to_string(),
            ])
            .args(["--groups", &groups.join(","), "--"])
            .args([
                "sh",
                "-c",
                &format!("test -r \"$0\" || exit {NOT_READABLE}"),
            ])
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        match status.code() {
            Some(0) => Some(true),
            Some(NOT_READABLE) => Some(false),
            _ => None,
        }
    }
}

/// What `sh` exits with when the file is not readable: apart from any
/// code of setpriv's own failures (1) or a missing shell's (126, 127).
const NOT_READABLE: i32 = 42;

fn group_id(group: &str) -> Option<Gid> {
    match group.parse::<u32>() {
        Ok(gid) => Some(Gid::from_raw(gid)),
        Err(_) => Group::from_name(group).ok().flatten().map(|g| g.gid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(unit: &str, drop_in: &str) -> Option<Service> {
        Service::of(&[
            ("baton.service".into(), unit.to_string()),
            ("baton.service.d/x.conf".into(), drop_in.to_string()),
        ])
    }

    /// The config the unit runs, as `baton run` finds it: `-c` or
    /// `--config` in `ExecStart=`, else the last `BATON_CONFIG`, else the
    /// default.
    #[test]
    fn the_units_config_is_found_where_run_finds_it() {
        let found = |unit: &str, drop_in: &str| {
            units_config(&[
                ("baton.service".into(), unit.to_string()),
                ("baton.service.d/x.conf".into(), drop_in.to_string()),
            ])
            .unwrap_or_default()
        };
        let run = "[Service]\nExecStart=/usr/bin/baton run\n";
        assert_eq!(found(run, ""), PathBuf::from(crate::config::DEFAULT_PATH));
        let env = "[Service]\nEnvironment=\"BATON_CONFIG=/a.toml\" X=1\nEnvironment=BATON_CONFIG=/b.toml\n";
        assert_eq!(found(run, env), PathBuf::from("/b.toml"));
        let flag = "[Service]\nExecStart=\nExecStart=/usr/bin/baton run --config=/c.toml\n";
        assert_eq!(
            found(run, &format!("{env}{flag}")),
            PathBuf::from("/c.toml")
        );
        let short = "[Service]\nExecStart=\nExecStart=/usr/bin/baton run -c /d.toml\n";
        assert_eq!(found(run, short), PathBuf::from("/d.toml"));
        let named = "[Service]\nExecStart=\nExecStart=/usr/bin/baton run -c ${CONF}\n";
        assert_eq!(found(run, named), PathBuf::new(), "not known");
    }

    #[test]
    fn the_user_is_the_units_last_word_on_it() {
        let nobody = "[Service]\nUser=nobody\n";
        let found = service(nobody, "").expect("nobody is known");
        assert_eq!((found.name.as_str(), found.uid.as_raw()), ("nobody", 65534));
        assert!(found.groups.contains(&found.gid), "{:?}", found.groups);
        assert!(
            service(nobody, "[Service]\nUser=\n").is_none(),
            "reset to root"
        );
        assert!(service("[Service]\nUser=65534\n", "").is_some(), "a uid");
        assert!(service(nobody, "[Service]\nDynamicUser=yes\n").is_none());
        assert!(service(nobody, "[Service]\nDynamicUser=no\n").is_some());
        let capable = "[Service]\nAmbientCapabilities=CAP_DAC_READ_SEARCH\n";
        assert!(service(nobody, capable).is_none(), "reads past permissions");
        assert!(service("[Service]\nUser=%i\n", "").is_none());
        let grouped = service(nobody, "[Service]\nGroup=0\nSupplementaryGroups=65534\n")
            .expect("known groups");
        assert_eq!(grouped.gid.as_raw(), 0);
        assert!(grouped.groups.contains(&Gid::from_raw(65534)));
        assert!(service(nobody, "[Service]\nGroup=no-such-group-here\n").is_none());
    }
}
