//! The open-file limit: raised from its soft value to the hard one as a
//! generation starts. Every connection takes an fd or two, and a shell's
//! soft limit (commonly 1024) would refuse clients with EMFILE well below
//! what the host allows; the hard limit is what the admin granted (systemd's
//! unit sets both with `LimitNOFILE=`). HAProxy raises its own the same way,
//! and Go's runtime does for every program. A new generation inherits it.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft limit to the hard one; says so when it moved.
pub fn raise() {
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return;
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    let shown = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(
            from = %shown(limit.current),
            to = %shown(limit.maximum),
            "raised the open-file limit to its hard limit"
        ),
        Err(err) => tracing::warn!(
            soft = %shown(limit.current),
            cause = %err,
            "cannot raise the open-file limit"
        ),
    }
}
