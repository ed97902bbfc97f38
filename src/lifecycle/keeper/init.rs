//! Whether this `baton run` is under an init that ends the container with
//! it: where a reload's new generation, detached, would die with the old
//! one unless a keeper holds the generations.

use rustix::process::Pid;

use crate::lifecycle::process::proc_is_ours;

/// The name of PID 1 of our namespace when it is one of the minimal inits
/// containers run (`docker run --init`'s tini, dumb-init, podman's
/// catatonit, or a shell entrypoint that did not `exec` baton) and every
/// process between it and us is a shell that did not `exec` either: each
/// exits when its one child does, and the kernel then ends the namespace,
/// a detached new generation with it. A host's init (systemd, sysvinit,
/// OpenRC) outlives its children, and so does any other process between
/// (a supervisor, a `docker exec` shell's own parent). Not when our parent
/// is the keeper (`BATON_KEPT` set, and it runs this binary): it is the new
/// generation's reaper. Without /proc nothing is known, and the reload
/// goes ahead.
pub fn init_that_exits_with_us() -> Option<String> {
    const EXIT_WITH_THEIR_CHILD: [&str; 4] = ["tini", "docker-init", "dumb-init", "catatonit"];
    const SHELLS: [&str; 3] = ["sh", "bash", "dash"];
    let exits_with_its_child =
        |name: &str| EXIT_WITH_THEIR_CHILD.contains(&name) || SHELLS.contains(&name);
    // Our parent as /proc numbers it: a /proc of the namespace outside
    // ours (not mounted afresh) numbers it otherwise, and its `1` is
    // another process.
    let mut at = parent_of("self")?;
    if rustix::process::getppid() == Pid::from_raw(1) {
        let name = comm_of(&at)?;
        return exits_with_its_child(&name).then_some(name);
    }
    if !proc_is_ours() || kept_by_parent(&at) {
        return None;
    }
    // Up the shells, to PID 1 (bounded: /proc may change under us).
    for _ in 0..16 {
        let name = comm_of(&at)?;
        if at == "1" {
            return exits_with_its_child(&name).then_some(name);
        }
        if !SHELLS.contains(&name.as_str()) {
            return None;
        }
        at = parent_of(&at)?;
    }
    None
}

/// Whether `parent` is the keeper of our generations: `BATON_KEPT` says
/// one keeps us, and the parent runs what we run (the keeper is `baton
/// run`). Set by hand under another parent, it only says none is to be
/// made.
fn kept_by_parent(parent: &str) -> bool {
    std::env::var_os(super::ENV_KEPT).is_some() && comm_of(parent) == comm_of("self")
}

/// The parent of `pid` (or `self`) as /proc numbers it.
fn parent_of(pid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let parent = status.lines().find_map(|line| line.strip_prefix("PPid:"))?;
    Some(parent.trim().to_string())
}

fn comm_of(pid: &str) -> Option<String> {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(name.trim_end().to_string())
}
