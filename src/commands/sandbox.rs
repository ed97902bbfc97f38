//! What `baton check` says of the unit's sandbox: the files baton makes or
//! writes (access logs, the control socket, an admin socket) where the
//! shipped `baton.service` would not let it. `check` run as root sees a
//! writable, shared file system; the service under `ProtectSystem=strict`
//! writes only in its own folders and `ReadWritePaths=`, sees no `/home`
//! or `/root` under `ProtectHome=`, and a `/tmp` of its own under
//! `PrivateTmp=`. A config `check` passed then failed the start (or the
//! reload) with "Read-only file system".

use std::path::{Path, PathBuf};

use crate::access_log::sink::Destination;
use crate::config::{AdminListen, Config};

/// The settings of the unit (the last assignment of each, drop-ins
/// applied) that decide where the service may write.
#[derive(Debug, Default)]
pub struct Sandbox {
    /// `ProtectSystem=`: `strict`, `full`, `yes`/`true`, or none.
    pub protect_system: Option<String>,
    /// `ProtectHome=`: `yes`/`true`, `read-only`, `tmpfs`, or none.
    pub protect_home: Option<String>,
    pub private_tmp: bool,
    /// The unit's own folders (`RuntimeDirectory=` and the like, made
    /// absolute) and `ReadWritePaths=`.
    pub writable: Vec<PathBuf>,
}

/// The folders systemd makes each `*Directory=` name under.
pub const OWN_FOLDERS: &[(&str, &str)] = &[
    ("RuntimeDirectory", "/run"),
    ("StateDirectory", "/var/lib"),
    ("CacheDirectory", "/var/cache"),
    ("LogsDirectory", "/var/log"),
];

impl Sandbox {
    /// Why the service could not write `path`, if it could not.
    fn keeps_from_writing(&self, path: &Path) -> Option<String> {
        let under = |prefixes: &[&str]| prefixes.iter().any(|p| path.starts_with(p));
        if self.writable.iter().any(|w| path.starts_with(w)) {
            return None;
        }
        if self.private_tmp && under(&["/tmp", "/var/tmp"]) {
            return Some("PrivateTmp=yes: the service has a /tmp of its own".into());
        }
        if let Some(home) = &self.protect_home {
            let hides = is_yes(home) || matches!(home.as_str(), "read-only" | "tmpfs");
            if hides && under(&["/home", "/root", "/run/user"]) {
                return Some(format!("ProtectHome={home}"));
            }
        }
        let read_only: &[&str] = match self.protect_system.as_deref() {
            Some("strict") => &["/"],
            Some("full") => &["/usr", "/boot", "/efi", "/etc"],
            Some(yes) if is_yes(yes) => &["/usr", "/boot", "/efi"],
            _ => &[],
        };
        let kept = under(read_only) && !under(&["/dev", "/proc", "/sys"]);
        kept.then(|| {
            let value = self.protect_system.as_deref().unwrap_or_default();
            format!("ProtectSystem={value} makes it read-only")
        })
    }
}

/// A boolean unit setting's "yes" (systemd takes these, in any case).
pub fn is_yes(value: &str) -> bool {
    let value = value.to_ascii_lowercase();
    matches!(value.as_str(), "yes" | "true" | "on" | "1")
}

/// What baton makes or writes, by what it is.
fn written(c: &Config) -> Vec<(String, &Path)> {
    let mut paths = vec![("the control socket".to_string(), c.control.socket.as_path())];
    if let AdminListen::Unix(path) = &c.admin.listen {
        paths.push(("the admin socket".into(), path.as_path()));
    }
    for l in &c.listeners {
        if let Some(Destination::File(path)) = l.access_log.as_ref().map(|s| &s.destination) {
            paths.push((format!("listener \"{}\"'s access log", l.name), path));
        }
    }
    paths
}

/// Warns of each path baton writes that the unit's sandbox keeps it from.
pub fn warn_about_writes(sandbox: &Sandbox, c: &Config, unit: &Path) {
    for (what, path) in written(c) {
        if let Some(why) = sandbox.keeps_from_writing(path) {
            eprintln!(
                "baton: warning: {what} {} is out of the service's reach under {} ({why}): the start or reload would fail; put it under /var/log/baton or /run/baton, or name its folder in ReadWritePaths= in a drop-in",
                path.display(),
                unit.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Sandbox {
        Sandbox {
            protect_system: Some("strict".into()),
            protect_home: Some("yes".into()),
            private_tmp: true,
            writable: vec!["/run/baton".into(), "/var/log/baton".into()],
        }
    }

    #[test]
    fn the_shipped_sandbox_lets_baton_write_its_own_folders_only() {
        let s = shipped();
        for fine in ["/var/log/baton/access.log", "/run/baton/control.sock"] {
            assert_eq!(s.keeps_from_writing(Path::new(fine)), None, "{fine}");
        }
        for (kept, why) in [
            ("/etc/baton/access.log", "ProtectSystem=strict"),
            ("/var/log/other/access.log", "ProtectSystem=strict"),
            ("/root/access.log", "ProtectHome=yes"),
            ("/tmp/control.sock", "PrivateTmp=yes"),
        ] {
            let said = s.keeps_from_writing(Path::new(kept));
            assert!(
                said.as_deref().is_some_and(|w| w.contains(why)),
                "{kept}: {said:?}"
            );
        }
    }

    #[test]
    fn read_write_paths_and_laxer_settings_let_it_write() {
        let mut s = shipped();
        s.writable.push("/srv/logs".into());
        assert_eq!(s.keeps_from_writing(Path::new("/srv/logs/a.log")), None);
        let full = Sandbox {
            protect_system: Some("full".into()),
            ..Sandbox::default()
        };
        assert_eq!(full.keeps_from_writing(Path::new("/srv/a.log")), None);
        assert!(full.keeps_from_writing(Path::new("/etc/a.log")).is_some());
        let none = Sandbox::default();
        assert_eq!(none.keeps_from_writing(Path::new("/etc/a.log")), None);
    }
}
