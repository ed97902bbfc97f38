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
    /// `BindPaths=` targets: writable wherever they are but in what
    /// `ProtectHome=yes` hides (systemd drops mounts there).
    mounted: Vec<PathBuf>,
    /// `TemporaryFileSystem=`: a tmpfs of the service's own, empty at
    /// each start.
    private: Vec<PathBuf>,
    /// The unit's specifiers, for its socket unit's paths.
    specs: Vec<(&'static str, String)>,
}

/// Why the service cannot write a path.
#[derive(Debug, PartialEq)]
enum Kept {
    /// The service sees another file there, or none: the same file
    /// reached by a symlink from the host's view is no way in.
    Hidden(String),
    /// It sees the file, read-only.
    ReadOnly(String),
}

/// The folders systemd makes each `*Directory=` name under (for a system
/// service).
const OWN_FOLDERS: &[(&str, &str)] = &[
    ("RuntimeDirectory", "/run"),
    ("StateDirectory", "/var/lib"),
    ("CacheDirectory", "/var/cache"),
    ("LogsDirectory", "/var/log"),
];

const HOMES: &[&str] = &["/home", "/root", "/run/user"];
const TMPS: &[&str] = &["/tmp", "/var/tmp"];

/// The path specifiers a system service's settings may use, as systemd
/// expands them, for the unit named `unit` (`baton.service`).
fn specifiers(unit: &str) -> Vec<(&'static str, String)> {
    let name = unit.strip_suffix(".service").unwrap_or(unit);
    let prefix = name.split('@').next().unwrap_or(name);
    let fixed = [
        ("%t", "/run"),
        ("%S", "/var/lib"),
        ("%C", "/var/cache"),
        ("%L", "/var/log"),
        ("%E", "/etc"),
        ("%T", "/tmp"),
        ("%V", "/var/tmp"),
        ("%%", "%"),
    ];
    let mut all: Vec<(&'static str, String)> =
        fixed.iter().map(|(s, v)| (*s, v.to_string())).collect();
    all.extend([
        ("%n", unit.to_string()),
        ("%N", name.to_string()),
        ("%p", prefix.to_string()),
    ]);
    all
}

impl Sandbox {
    /// The unit's sandbox as systemd ends up with it (`files`: the unit
    /// file, then its drop-ins); `None` if a path in it could not be read.
    fn of(files: &[(PathBuf, String)]) -> Option<Sandbox> {
        let unit = unit_name(&files.first()?.0)?;
        let specs = specifiers(&unit);
        let list = |key| list_of(files, key, &specs);
        let last = |key| last_setting(files, &[key]).map(|s| s.value);
        let mut writable = Vec::new();
        for (key, base) in OWN_FOLDERS {
            for item in list(key)? {
                // `name:link` (systemd 253) makes `name`, and `link` to it.
                for name in item.split(':') {
                    writable.push(Path::new(base).join(name));
                }
            }
        }
        for item in list("ReadWritePaths")? {
            writable.push(PathBuf::from(item.trim_start_matches(['-', '+'])));
        }
        let mut mounted = Vec::new();
        for item in list("BindPaths")? {
            let item = item.trim_start_matches('-');
            let target = item.split(':').nth(1).unwrap_or(item);
            mounted.push(PathBuf::from(target));
        }
        let private = list("TemporaryFileSystem")?
            .iter()
            .map(|item| PathBuf::from(item.split(':').next().unwrap_or_default()))
            .collect();
        Some(Sandbox {
            protect_system: last("ProtectSystem"),
            protect_home: last("ProtectHome"),
            private_tmp: last("PrivateTmp").is_some_and(|v| is_yes(&v)),
            writable,
            mounted,
            private,
            specs,
        })
    }

    /// Why the service could not write `path` as `check` sees it, if it
    /// could not.
    fn keeps_from_writing(&self, path: &Path) -> Option<Kept> {
        let under = |prefixes: &[&str]| prefixes.iter().any(|p| path.starts_with(p));
        let within = |folders: &[PathBuf]| folders.iter().any(|f| path.starts_with(f));
        let home = self.protect_home.as_deref().unwrap_or_default();
        if is_yes(home) && under(HOMES) {
            return Some(Kept::Hidden(format!(
                "ProtectHome={home}: the service sees none of it"
            )));
        }
        if within(&self.mounted) {
            return None;
        }
        if self.private_tmp && under(TMPS) {
            return Some(Kept::Hidden(
                "PrivateTmp=yes: the service writes a /tmp of its own, gone at its stop".into(),
            ));
        }
        if within(&self.private) {
            return Some(Kept::Hidden(
                "TemporaryFileSystem=: the service writes a tmpfs of its own, empty at each start"
                    .into(),
            ));
        }
        if home == "tmpfs" && under(HOMES) {
            return Some(Kept::Hidden(
                "ProtectHome=tmpfs: the service sees an empty, read-only tmpfs there".into(),
            ));
        }
        if within(&self.writable) {
            return None;
        }
        if home == "read-only" && under(HOMES) {
            return Some(Kept::ReadOnly("ProtectHome=read-only".into()));
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
            Kept::ReadOnly(format!("ProtectSystem={value} makes it read-only"))
        })
    }

    /// The folders the service may write, as the sandbox leaves them.
    fn open_folders(&self) -> Vec<String> {
        self.writable
            .iter()
            .chain(&self.mounted)
            .filter(|f| self.keeps_from_writing(f).is_none())
            .map(|f| f.display().to_string())
            .collect()
    }
}

/// The name systemd knows the unit by: an alias (a symlink) names its
/// target; `None` for a masked unit (a link to /dev/null), which has no
/// sandbox to speak of.
fn unit_name(unit: &Path) -> Option<String> {
    let real = std::fs::canonicalize(unit).unwrap_or_else(|_| unit.to_path_buf());
    if real == Path::new("/dev/null") {
        return None;
    }
    let named = match real.extension().is_some_and(|e| e == "service") {
        true => &real,
        false => unit,
    };
    named.file_name()?.to_str().map(str::to_string)
}

/// A boolean unit setting's "yes" (systemd takes these, in any case).
pub(super) fn is_yes(value: &str) -> bool {
    let value = value.to_ascii_lowercase();
    matches!(value.as_str(), "yes" | "y" | "true" | "t" | "on" | "1")
}

/// A list setting as systemd ends up with it: each assignment adds its
/// items, an empty one clears those before it. `None` if an item holds a
/// specifier not in `specs`.
fn list_of(
    files: &[(PathBuf, String)],
    key: &str,
    specs: &[(&str, String)],
) -> Option<Vec<String>> {
    let mut items = Vec::new();
    for s in assignments(files, &[key]) {
        if s.value.is_empty() {
            items.clear();
        }
        for word in words(&s.value) {
            items.push(expanded(&word, specs)?);
        }
    }
    Some(items)
}

/// A setting's items as systemd splits them: at white space, but not
/// inside double or single quotes, which go, nor where a backslash makes
/// the next character plain.
fn words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => word.extend(chars.next()),
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
fn expanded(item: &str, specs: &[(&str, String)]) -> Option<String> {
    let mut out = String::new();
    let mut rest = item;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let spec = rest.get(at..at + 2)?;
        let (_, value) = specs.iter().find(|(s, _)| *s == spec)?;
        out.push_str(value);
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    Some(out)
}

/// What baton makes or writes, by what it is, made absolute from the
/// folder `check` runs in (a config named by a relative path leaves its
/// relative paths so). A socket path that the unit's socket unit listens
/// on is systemd's to make, not baton's.
fn written(c: &Config, systemds: &[PathBuf]) -> Vec<(String, PathBuf)> {
    let mut sockets = vec![("the control socket".to_string(), c.control.socket.clone())];
    if let AdminListen::Unix(path) = &c.admin.listen {
        sockets.push(("the admin socket".into(), path.clone()));
    }
    sockets.retain(|(_, path)| !systemds.contains(path));
    let mut paths = sockets;
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

/// The paths the unit's socket unit (the same name, `.socket`, in the
/// same folder; not its drop-ins, nor another unit's `Sockets=`) listens
/// on: a control socket made so is not warned of.
fn socket_unit_paths(unit: &Path, specs: &[(&str, String)]) -> Vec<PathBuf> {
    let socket = unit.with_extension("socket");
    let Ok(text) = std::fs::read_to_string(&socket) else {
        return Vec::new();
    };
    let files = [(socket, text)];
    list_of(&files, "ListenStream", specs)
        .unwrap_or_default()
        .into_iter()
        .filter(|item| item.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The same file reached without symlinks or `..` (the file itself if it
/// exists; a link to a file not made yet, as an access log before its
/// first line, by its target; else its folder, which the config's checks
/// saw to), if it can be.
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(real) = std::fs::canonicalize(path) {
        return Some(real);
    }
    let path = match std::fs::read_link(path) {
        Ok(target) => path.parent()?.join(target),
        Err(_) => path.to_path_buf(),
    };
    let folder = std::fs::canonicalize(path.parent()?).ok()?;
    Some(folder.join(path.file_name()?))
}

/// Warns of each path baton writes that the unit's sandbox keeps it from:
/// a read-only one as written and as resolved (a symlink into a writable
/// folder is fine), a hidden one as written (the link is not there for the
/// service).
pub fn warn_about_writes(files: &[(PathBuf, String)], c: &Config, unit: &Path) {
    // The unit file itself unread, its drop-ins alone say nothing of it.
    if unit.extension().is_some_and(|e| e == "conf") {
        return;
    }
    let Some(sandbox) = Sandbox::of(files) else {
        return;
    };
    let open = sandbox.open_folders();
    let place = match open.is_empty() {
        true => "a folder the service may write".to_string(),
        false => format!("a folder the service may write ({})", open.join(", ")),
    };
    for (what, path) in written(c, &socket_unit_paths(unit, &sandbox.specs)) {
        let (why, way_out) = match sandbox.keeps_from_writing(&path) {
            None => continue,
            Some(Kept::Hidden(why)) => (why, "or lift that setting in a drop-in"),
            Some(Kept::ReadOnly(why)) => {
                let real = resolved(&path);
                if real.is_some_and(|real| sandbox.keeps_from_writing(&real).is_none()) {
                    continue;
                }
                (why, "or name its folder in ReadWritePaths= in a drop-in")
            }
        };
        eprintln!(
            "baton: warning: {what} {} is out of the service's reach under {} ({why}): put it in {place}, {way_out}",
            path.display(),
            unit.display(),
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
            ..Sandbox::default()
        }
    }

    fn reason(s: &Sandbox, path: &str) -> String {
        match s.keeps_from_writing(Path::new(path)) {
            Some(Kept::Hidden(why) | Kept::ReadOnly(why)) => why,
            None => String::new(),
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
            assert!(
                reason(&s, kept).contains(why),
                "{kept}: {}",
                reason(&s, kept)
            );
        }
        assert_eq!(s.open_folders(), ["/run/baton", "/var/log/baton"]);
    }

    /// `ReadWritePaths=` opens what is read-only, not what is hidden (a
    /// private /tmp, a home under `ProtectHome=yes`); a bind mount opens
    /// anything but a home `ProtectHome=yes` hides; a `TemporaryFileSystem=`
    /// is the service's own.
    #[test]
    fn read_write_paths_open_what_is_read_only_and_mounts_more() {
        let mut s = shipped();
        s.writable
            .extend(["/srv/logs".into(), "/tmp/x".into(), "/home/a".into()]);
        assert_eq!(s.keeps_from_writing(Path::new("/srv/logs/a.log")), None);
        assert!(reason(&s, "/tmp/x/a.log").contains("PrivateTmp"));
        assert!(reason(&s, "/home/a/a.log").contains("ProtectHome=yes"));
        s.mounted.extend(["/home/a".into(), "/tmp/y".into()]);
        assert!(reason(&s, "/home/a/a.log").contains("ProtectHome=yes"));
        assert_eq!(s.keeps_from_writing(Path::new("/tmp/y/a.log")), None);
        s.private.push("/var/scratch".into());
        assert!(reason(&s, "/var/scratch/a.log").contains("TemporaryFileSystem"));
        let full = Sandbox {
            protect_system: Some("full".into()),
            ..Sandbox::default()
        };
        assert_eq!(full.keeps_from_writing(Path::new("/srv/a.log")), None);
        assert!(full.keeps_from_writing(Path::new("/etc/a.log")).is_some());
        let none = Sandbox::default();
        assert_eq!(none.keeps_from_writing(Path::new("/etc/a.log")), None);
    }

    /// Lists as systemd reads them: quotes, backslashes, specifiers (of
    /// the unit's own name), `-`/`+`, links, bind targets, and an empty
    /// assignment that clears; an unknown specifier leaves nothing to say.
    #[test]
    fn the_units_settings_are_read_as_systemd_reads_them() {
        let unit = "[Service]\nProtectSystem=strict\nReadWritePaths=/old\nReadWritePaths=\nReadWritePaths=\"/srv/my logs\" -%L/other +/opt/x /srv/a\\ b\nStateDirectory=%N:%p-link\nBindPaths=-/data:/var/lib/mnt:rbind\nTemporaryFileSystem=/var/scratch:ro\n";
        let files = vec![(PathBuf::from("/etc/x/edge@1.service"), unit.to_string())];
        let s = Sandbox::of(&files).expect("readable");
        let writable: Vec<&str> = s.writable.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(
            writable,
            [
                "/var/lib/edge@1",
                "/var/lib/edge-link",
                "/srv/my logs",
                "/var/log/other",
                "/opt/x",
                "/srv/a b"
            ]
        );
        let mounted: Vec<&str> = s.mounted.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(mounted, ["/var/lib/mnt"]);
        assert_eq!(s.private, [PathBuf::from("/var/scratch")]);
        let unknown = "[Service]\nReadWritePaths=%h/logs\n".to_string();
        assert!(Sandbox::of(&[(PathBuf::from("baton.service"), unknown)]).is_none());
    }
}
