//! What `baton check` says of the unit's sandbox: the files baton makes or
//! writes (access logs, the control socket, an admin socket) where the
//! installed `baton.service` would not let it. `check` run as root sees a
//! writable, shared file system; the service under `ProtectSystem=strict`
//! writes only in its own folders, `ReadWritePaths=` and bind mounts, sees
//! no `/home` or `/root` under `ProtectHome=`, and a `/tmp` of its own
//! under `PrivateTmp=`. A config `check` passed then failed the start (or
//! the reload) with "Read-only file system". A setting it cannot read (a
//! specifier it does not know) silences it: a false warning is worse than
//! none.

use std::path::{Path, PathBuf};

use super::unit::{assignments, last_setting};
use crate::access_log::sink::Destination;
use crate::config::{AdminListen, Config};

/// The settings of the unit (the last assignment of each, drop-ins
/// applied) that decide where the service may write.
#[derive(Debug, Default)]
struct Sandbox {
    /// `ProtectSystem=`: `strict`, `full`, `yes`/`true`, or none.
    protect_system: Option<String>,
    /// `ProtectHome=`: `yes`/`true`, `read-only`, `tmpfs`, or none.
    protect_home: Option<String>,
    private_tmp: bool,
    /// The unit's own folders (`RuntimeDirectory=` and the like, made
    /// absolute) and `ReadWritePaths=`: writable under `ProtectSystem=`
    /// and `ProtectHome=read-only`, not inside what is hidden.
    writable: Vec<PathBuf>,
    /// Mounted in whatever is around them (`BindPaths=` targets,
    /// `TemporaryFileSystem=`): writable wherever they are.
    mounted: Vec<PathBuf>,
}

/// The folders systemd makes each `*Directory=` name under (for a system
/// service).
const OWN_FOLDERS: &[(&str, &str)] = &[
    ("RuntimeDirectory", "/run"),
    ("StateDirectory", "/var/lib"),
    ("CacheDirectory", "/var/cache"),
    ("LogsDirectory", "/var/log"),
];

/// The path specifiers a system service's settings may use, as systemd
/// expands them (`%%` last, so that it makes no specifier).
const SPECIFIERS: &[(&str, &str)] = &[
    ("%t", "/run"),
    ("%S", "/var/lib"),
    ("%C", "/var/cache"),
    ("%L", "/var/log"),
    ("%E", "/etc"),
    ("%T", "/tmp"),
    ("%V", "/var/tmp"),
    ("%n", "baton.service"),
    ("%N", "baton"),
    ("%p", "baton"),
    ("%%", "%"),
];

const HOMES: &[&str] = &["/home", "/root", "/run/user"];
const TMPS: &[&str] = &["/tmp", "/var/tmp"];

impl Sandbox {
    /// The unit's sandbox as systemd ends up with it; `None` if a path in
    /// it could not be read.
    fn of(files: &[(PathBuf, String)]) -> Option<Sandbox> {
        let last = |key| last_setting(files, &[key]).map(|s| s.value);
        let mut writable = Vec::new();
        for (key, base) in OWN_FOLDERS {
            for item in list_of(files, key)? {
                // `name:link` (systemd 253) makes `name`, and `link` to it.
                for name in item.split(':') {
                    writable.push(Path::new(base).join(name));
                }
            }
        }
        for item in list_of(files, "ReadWritePaths")? {
            writable.push(PathBuf::from(item.trim_start_matches(['-', '+'])));
        }
        let mut mounted = Vec::new();
        for item in list_of(files, "BindPaths")? {
            let item = item.trim_start_matches('-');
            let target = item.split(':').nth(1).unwrap_or(item);
            mounted.push(PathBuf::from(target));
        }
        for item in list_of(files, "TemporaryFileSystem")? {
            mounted.push(PathBuf::from(item.split(':').next().unwrap_or_default()));
        }
        Some(Sandbox {
            protect_system: last("ProtectSystem"),
            protect_home: last("ProtectHome"),
            private_tmp: last("PrivateTmp").is_some_and(|v| is_yes(&v)),
            writable,
            mounted,
        })
    }

    /// Why the service could not write `path` as `check` sees it, if it
    /// could not.
    fn keeps_from_writing(&self, path: &Path) -> Option<String> {
        let under = |prefixes: &[&str]| prefixes.iter().any(|p| path.starts_with(p));
        let within = |folders: &[PathBuf]| folders.iter().any(|f| path.starts_with(f));
        if within(&self.mounted) {
            return None;
        }
        if self.private_tmp && under(TMPS) {
            return Some(
                "PrivateTmp=yes: the service writes a /tmp of its own, gone at its stop".into(),
            );
        }
        let home = self.protect_home.as_deref().unwrap_or_default();
        let hides_home = is_yes(home) || home == "tmpfs";
        if hides_home && under(HOMES) {
            return Some(format!("ProtectHome={home}: the service sees none of it"));
        }
        if within(&self.writable) {
            return None;
        }
        if home == "read-only" && under(HOMES) {
            return Some("ProtectHome=read-only".into());
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
fn is_yes(value: &str) -> bool {
    let value = value.to_ascii_lowercase();
    matches!(value.as_str(), "yes" | "y" | "true" | "t" | "on" | "1")
}

/// A list setting as systemd ends up with it: each assignment adds its
/// items, an empty one clears those before it. `None` if an item holds a
/// specifier this does not know.
fn list_of(files: &[(PathBuf, String)], key: &str) -> Option<Vec<String>> {
    let mut items = Vec::new();
    for s in assignments(files, &[key]) {
        if s.value.is_empty() {
            items.clear();
        }
        for word in words(&s.value) {
            items.push(expanded(&word)?);
        }
    }
    Some(items)
}

/// A setting's items as systemd splits them: at white space, but not
/// inside double or single quotes, which go.
fn words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    for c in value.chars() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            (_, c) => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// `item` with its specifiers expanded, or `None` for one not known.
fn expanded(item: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = item;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let spec = rest.get(at..at + 2)?;
        let (_, value) = SPECIFIERS.iter().find(|(s, _)| *s == spec)?;
        out.push_str(value);
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    Some(out)
}

/// What baton makes or writes, by what it is, made absolute from the
/// folder `check` runs in (a config named by a relative path leaves its
/// relative paths so).
fn written(c: &Config) -> Vec<(String, PathBuf)> {
    let mut paths = vec![("the control socket".to_string(), c.control.socket.clone())];
    if let AdminListen::Unix(path) = &c.admin.listen {
        paths.push(("the admin socket".into(), path.clone()));
    }
    for l in &c.listeners {
        if let Some(Destination::File(path)) = l.access_log.as_ref().map(|s| &s.destination) {
            paths.push((
                format!("listener \"{}\"'s access log", l.name),
                path.clone(),
            ));
        }
    }
    let here = std::env::current_dir().unwrap_or_default();
    paths
        .into_iter()
        .map(|(what, path)| (what, here.join(path)))
        .collect()
}

/// The same file reached without symlinks or `..` in its folder (which
/// exists: the config's checks saw to it), if it can be.
fn resolved(path: &Path) -> Option<PathBuf> {
    let folder = std::fs::canonicalize(path.parent()?).ok()?;
    Some(folder.join(path.file_name()?))
}

/// Warns of each path baton writes that the unit's sandbox keeps it from,
/// as written and as resolved (a symlink into a writable folder is fine).
pub fn warn_about_writes(files: &[(PathBuf, String)], c: &Config, unit: &Path) {
    let Some(sandbox) = Sandbox::of(files) else {
        return;
    };
    for (what, path) in written(c) {
        let Some(why) = sandbox.keeps_from_writing(&path) else {
            continue;
        };
        if resolved(&path).is_some_and(|real| sandbox.keeps_from_writing(&real).is_none()) {
            continue;
        }
        let writable: Vec<String> = sandbox
            .writable
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        eprintln!(
            "baton: warning: {what} {} is out of the service's reach under {} ({why}): put it in a folder the service may write ({}), or name its folder in ReadWritePaths= in a drop-in",
            path.display(),
            unit.display(),
            writable.join(", ")
        );
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
            mounted: Vec::new(),
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

    /// `ReadWritePaths=` opens what is read-only, not what is hidden (a
    /// private /tmp, a home under `ProtectHome=yes`); a bind mount opens
    /// anything.
    #[test]
    fn read_write_paths_open_what_is_read_only_and_mounts_anything() {
        let mut s = shipped();
        s.writable
            .extend(["/srv/logs".into(), "/tmp/x".into(), "/home/a".into()]);
        assert_eq!(s.keeps_from_writing(Path::new("/srv/logs/a.log")), None);
        assert!(s.keeps_from_writing(Path::new("/tmp/x/a.log")).is_some());
        assert!(s.keeps_from_writing(Path::new("/home/a/a.log")).is_some());
        s.mounted.push("/home/a".into());
        assert_eq!(s.keeps_from_writing(Path::new("/home/a/a.log")), None);
        let full = Sandbox {
            protect_system: Some("full".into()),
            ..Sandbox::default()
        };
        assert_eq!(full.keeps_from_writing(Path::new("/srv/a.log")), None);
        assert!(full.keeps_from_writing(Path::new("/etc/a.log")).is_some());
        let none = Sandbox::default();
        assert_eq!(none.keeps_from_writing(Path::new("/etc/a.log")), None);
    }

    /// Lists as systemd reads them: quotes, specifiers, `-`/`+`, links,
    /// bind targets, and an empty assignment that clears; an unknown
    /// specifier leaves nothing to say.
    #[test]
    fn the_units_settings_are_read_as_systemd_reads_them() {
        let unit = "[Service]\nProtectSystem=strict\nReadWritePaths=/old\nReadWritePaths=\nReadWritePaths=\"/srv/my logs\" -%L/other +/opt/x\nStateDirectory=%N:baton-link\nBindPaths=-/data:/var/lib/mnt:rbind\nTemporaryFileSystem=/var/scratch:ro\n";
        let files = vec![(PathBuf::from("baton.service"), unit.to_string())];
        let s = Sandbox::of(&files).expect("readable");
        let writable: Vec<&str> = s.writable.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(
            writable,
            [
                "/var/lib/baton",
                "/var/lib/baton-link",
                "/srv/my logs",
                "/var/log/other",
                "/opt/x"
            ]
        );
        let mounted: Vec<&str> = s.mounted.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(mounted, ["/var/lib/mnt", "/var/scratch"]);
        let unknown = "[Service]\nReadWritePaths=%h/logs\n".to_string();
        assert!(Sandbox::of(&[(PathBuf::from("u"), unknown)]).is_none());
    }
}
