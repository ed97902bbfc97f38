//! A real systemd for end-to-end tests: `systemd-sandbox.sh` boots one as
//! PID 1 of private namespaces; this drives it (`systemctl`, files in) and
//! installs the freshly built binary and the shipped units into it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::load::Load;

/// The version a second build of baton reports (`baton --version`,
/// `/status`), to tell an upgrade's new generation from the old.
pub const UPGRADE_VERSION: &str = "9.9.9-upgrade";

/// A second build of baton that reports [`UPGRADE_VERSION`], for upgrade
/// tests. Its own target dir (the running test holds cargo's lock on the
/// main one), shared by every test that upgrades, so cargo builds it once;
/// seeded with the main build's dependencies, so only baton compiles: under
/// a minute, where building every dependency again took five of CI's 25.
pub fn upgrade_binary() -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/upgrade");
    seed(&target);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // With a test target, as `cargo test` builds: the dev-dependencies'
    // features (tokio's test-util, ...) then join the dependencies' as in
    // the main build, so the seeded ones match; a plain `cargo build` would
    // build tokio, hyper, h2 and hickory again.
    let out = Command::new(cargo)
        .args(["build", "--bin", "baton", "--test", "cli", "--target-dir"])
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("BATON_BUILD_VERSION", UPGRADE_VERSION)
        .output()
        .expect("cargo build");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("debug/baton")
}

/// Copies the main build's compiled dependencies and cargo's records of
/// them into `target` when it does not exist yet: a target dir is
/// relocatable, so cargo takes them as built. The copy is made beside it
/// and renamed into place, so two test binaries seeding at once never
/// build on half a copy.
///
/// The dependencies' libraries, most of the copy, are hard links: a CI
/// run on a nearly full disk failed on this copy. Only baton's own build
/// writes into the seeded dir, and rustc replaces an rlib or rmeta by
/// renaming a new file over it, so a link never carries a write back into
/// the main build; baton's own files, the proc-macro `.so`s the linker
/// writes and the dep-info rustc rewrites in place are copied all the same.
fn seed(target: &Path) {
    if target.exists() {
        return;
    }
    let main = Path::new(super::daemon::BIN)
        .parent()
        .expect("the binary's dir");
    let scratch = target.with_extension(format!("seeding-{}", std::process::id()));
    let deps = scratch.join("debug/deps");
    std::fs::create_dir_all(&deps).expect("seed dir");
    // Libraries and dep-info only: not the test executables beside them.
    let (linked, copied): (Vec<PathBuf>, Vec<PathBuf>) = std::fs::read_dir(main.join("deps"))
        .expect("the main build's deps")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let extension = path.extension().and_then(|e| e.to_str());
            matches!(extension, Some("rlib" | "rmeta" | "so" | "d"))
        })
        .partition(|path| is_a_dependency_library(path));
    let cp = |how: &str, what: &[PathBuf], into: &Path| {
        // -a keeps the files' times, which cargo compares with its records.
        Command::new("cp")
            .arg(how)
            .args(what)
            .arg(into)
            .output()
            .expect("cp")
    };
    let copy = |how: &str, what: &[PathBuf], into: &Path| {
        let out = cp(how, what, into);
        assert!(
            out.status.success(),
            "seeding {}: {}",
            into.display(),
            text(&out)
        );
    };
    // Copied after all where no link can be made (a CARGO_TARGET_DIR on
    // another filesystem).
    if !cp("-al", &linked, &deps).status.success() {
        copy("-af", &linked, &deps);
    }
    copy("-a", &copied, &deps);
    copy(
        "-a",
        &[main.join("build"), main.join(".fingerprint")],
        &scratch.join("debug"),
    );
    if std::fs::rename(&scratch, target).is_err() {
        // Another test binary seeded it first.
        let _ = std::fs::remove_dir_all(&scratch);
    }
}

/// An rlib or rmeta of a crate other than baton's: one the upgrade build
/// reads and never writes.
fn is_a_dependency_library(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let extension = path.extension().and_then(|e| e.to_str());
    matches!(extension, Some("rlib" | "rmeta")) && !name.starts_with("libbaton-")
}

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/systemd-sandbox.sh"
);

pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT)
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

/// What a command inside printed and returned.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Sandbox {
    /// Boots one; `None` (after saying so, loudly) when not root. CI is root.
    pub fn boot() -> Option<Sandbox> {
        if !super::skip::skipped_unless(
            nix::unistd::geteuid().is_root(),
            "root, for the systemd sandbox",
        ) {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("sbx")
            .tempdir()
            .expect("tempdir");
        let out = Command::new(SCRIPT)
            .arg("start")
            .arg(dir.path())
            .output()
            .expect("run sandbox script");
        assert!(out.status.success(), "sandbox did not boot: {}", text(&out));
        Some(Sandbox { dir })
    }

    /// The command that runs `args` inside, to run as the caller likes
    /// (say, as a tokio process while the test does something else).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SCRIPT);
        cmd.arg("exec").arg(self.dir.path()).args(args);
        cmd
    }

    pub fn exec(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("exec in sandbox")
    }

    /// `systemctl ARGS`, asserting it succeeded.
    pub fn systemctl_ok(&self, args: &[&str]) -> String {
        let mut all = vec!["systemctl"];
        all.extend_from_slice(args);
        self.succeeded(&format!("systemctl {args:?}"), self.exec(&all))
    }

    /// Asserts that `what`, run inside, succeeded (else shows what it said
    /// and baton's journal); what it printed.
    pub fn succeeded(&self, what: &str, out: Output) -> String {
        assert!(
            out.status.success(),
            "{what} failed: {}\njournal:\n{}",
            text(&out),
            self.journal()
        );
        text(&out)
    }

    /// One property of a unit (`systemctl show -p NAME --value`).
    pub fn show(&self, unit: &str, property: &str) -> String {
        let out = self.exec(&["systemctl", "show", unit, "-p", property, "--value"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The unit's journal, once journald has written out what it holds
    /// (`--sync`, bounded: it reads its sockets in its own time; a line
    /// still in a stream socket may come later, see `journal_holding`).
    pub fn journal(&self) -> String {
        self.exec(&["timeout", "10", "journalctl", "--sync"]);
        text(&self.exec(&["journalctl", "-u", "baton", "--no-pager", "-o", "cat"]))
    }

    /// baton's lines in the journal at `priority` (`err`, `warning`...) or
    /// more urgent, as baton's own `<N>` before each said.
    pub fn journal_at(&self, priority: &str) -> String {
        self.exec(&["timeout", "10", "journalctl", "--sync"]);
        let args = ["journalctl", "-u", "baton", "--no-pager", "-o", "cat", "-p"];
        text(&self.exec(&[&args[..], &[priority]].concat()))
    }

    /// `journal_at(priority)` once it holds `line`, or as it is after 10 s
    /// (see `journal_holding`).
    pub fn journal_at_holding(&self, priority: &str, line: &str) -> String {
        holding(|| self.journal_at(priority), line)
    }

    /// The journal once it holds `line`, or as it is after 10 s: journald
    /// takes a unit's output in its own time, and on a loaded machine a
    /// line written before the event a test waited on can still be on
    /// its way (the journal was read empty just after a socket-activated
    /// start, under `tests/stress.sh`'s busy core).
    pub fn journal_holding(&self, line: &str) -> String {
        holding(|| self.journal(), line)
    }

    /// Writes `contents` to `path` inside.
    pub fn write(&self, path: &str, contents: &str) {
        let mut child = self
            .command(&[
                "sh",
                "-c",
                &format!("mkdir -p \"$(dirname {path})\" && cat > {path}"),
            ])
            .stdin(Stdio::piped())
            .spawn()
            .expect("write in sandbox");
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, contents.as_bytes()).expect("feed file");
        }
        assert!(
            child.wait().expect("wait").success(),
            "writing {path} failed"
        );
    }

    /// Runs `script` (sh) inside with the host file `from` as its stdin.
    /// Files are streamed in, never named by host path: the sandbox has its
    /// own /tmp, where a CI checkout (and so the build) may live.
    fn stream_in(&self, from: &Path, script: &str) {
        let file =
            std::fs::File::open(from).unwrap_or_else(|e| panic!("open {}: {e}", from.display()));
        let out = self
            .command(&["sh", "-c", script])
            .stdin(file)
            .output()
            .expect("stream a file in");
        assert!(out.status.success(), "{script}: {}", text(&out));
    }

    /// Copies the host file `from` to `to` inside.
    pub fn copy_in(&self, from: &Path, to: &str) {
        self.stream_in(from, &format!("cat > {to}"));
    }

    /// Installs a binary as /usr/bin/baton the way a package upgrade does
    /// (a new file renamed over the old one).
    pub fn install_binary(&self, binary: &Path) {
        self.stream_in(
            binary,
            "cat > /usr/bin/baton.new && chmod 755 /usr/bin/baton.new && mv -f /usr/bin/baton.new /usr/bin/baton",
        );
    }

    /// Waits for `more` further successes of `load`; when it stalls, fails
    /// showing what systemd saw.
    pub async fn progressed(&self, load: &Load, more: u64) {
        if !load.advanced(more).await {
            panic!(
                "no load progress; failures: {:#?}\nstatus:\n{}\njournal:\n{}",
                load.failures_so_far(),
                text(&self.exec(&["systemctl", "status", "baton", "--no-pager"])),
                self.journal()
            );
        }
    }

    /// The shipped units, user and config; then `daemon-reload`.
    pub fn install_baton(&self, config: &str) {
        self.install_binary(Path::new(super::daemon::BIN));
        let sysusers = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/baton.sysusers");
        let users = std::fs::read_to_string(sysusers).expect("shipped sysusers.d file");
        self.write("/usr/lib/sysusers.d/baton.conf", &users);
        let out = self.exec(&["systemd-sysusers"]);
        assert!(out.status.success(), "systemd-sysusers: {}", text(&out));
        let units = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd");
        for unit in ["baton.service", "baton.socket"] {
            let text = std::fs::read_to_string(format!("{units}/{unit}")).expect("shipped unit");
            self.write(&format!("/etc/systemd/system/{unit}"), &text);
        }
        self.write("/etc/baton/baton.toml", config);
        self.systemctl_ok(&["daemon-reload"]);
    }
}

/// What `read` gives once it holds `line`, or as it is after 10 s.
fn holding(read: impl Fn() -> String, line: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = read();
        if text.contains(line) || std::time::Instant::now() >= deadline {
            return text;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
