//! Tests that need what not every machine gives (root, a namespace): they
//! skip where it is missing, with a line saying so, except under `CI`,
//! which has all of it: there they fail instead of skipping unseen. (A
//! file of its own so that `tests/cli.rs`, which takes no other support,
//! can include it by path.)

/// Whether `possible`; if not, the test is skipped as needing `needs`.
pub fn skipped_unless(possible: bool, needs: &str) -> bool {
    if !possible {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this: it needs {needs}"
        );
        eprintln!("skipped: needs {needs} (CI has it)");
    }
    possible
}

/// Whether this test runs as root, which acting as another uid needs.
pub fn root_or_skipped() -> bool {
    skipped_unless(
        nix::unistd::geteuid().is_root(),
        "root, to act as another uid",
    )
}
