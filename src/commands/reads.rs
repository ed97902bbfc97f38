//! What `baton check` says of the files the service reads as its own
//! user: `check` runs as root and reads anything, the service runs as the
//! unit's `User=` (`baton` in the shipped unit), and its start, or its
//! reload, failed on a key only root may read (certbot's `privkey.pem` is
//! root's alone). Asked of the system itself, as that user
//! (util-linux's `setpriv`, with the user's groups), so ACLs and groups
//! count as they will for the service. Anything it cannot ask (no
//! `setpriv`, a user not known yet, groups the unit adds) silences it: a
//! false warning is worse than none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::unit::last_setting;
use crate::config::Config;

pub fn warn_about_reads(files: &[(PathBuf, String)], c: &Config, unit: &Path) {
    let Some(user) = last_setting(files, &["User"]) else {
        return;
    };
    let name = user.value.trim();
    let groups_added = last_setting(files, &["SupplementaryGroups", "DynamicUser"]).is_some();
    if name == "root" || name == "0" || name.contains('%') || groups_added {
        return;
    }
    let Ok(Some(account)) = nix::unistd::User::from_name(name) else {
        return;
    };
    let gid = match last_setting(files, &["Group"]) {
        None => Some(account.gid),
        Some(group) => nix::unistd::Group::from_name(group.value.trim())
            .ok()
            .flatten()
            .map(|g| g.gid),
    };
    let Some(gid) = gid else {
        return;
    };
    let ids = (account.uid.to_string(), gid.to_string());
    for (key, path) in &c.files_read {
        if readable_as(&ids, path) == Some(false) {
            eprintln!(
                "baton: warning: {key} {} cannot be read by User={name} of {}: the service reads it at each start and reload, as that user (give it the file, e.g. `chown {name}` and `chmod 400`, and search access to the folders above it)",
                path.display(),
                unit.display(),
            );
        }
    }
}

/// What `sh` exits with when the file is not readable: apart from any
/// code of setpriv's own failures (1) or a missing shell's (126, 127).
const NOT_READABLE: i32 = 42;

/// Whether the user and group `(uid, gid)` may read `path`; `None` when
/// that cannot be asked.
fn readable_as((uid, gid): &(String, String), path: &Path) -> Option<bool> {
    let status = Command::new("setpriv")
        .args(["--reuid", uid, "--regid", gid, "--init-groups", "--"])
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
