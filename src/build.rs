//! Build script: records the git commit (and an optional version override,
//! `BATON_BUILD_VERSION`, used to tell binaries apart in upgrade tests) so
//! `baton --version` and `/status` say exactly what runs.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=BATON_COMMIT={commit}");
    let version = std::env::var("BATON_BUILD_VERSION")
        .unwrap_or_else(|_| std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    println!("cargo:rustc-env=BATON_VERSION={version}");
    println!("cargo:rerun-if-env-changed=BATON_BUILD_VERSION");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}
