//! Tests in a network namespace of their own: baton started under
//! `unshare -n`, and a test thread that joins it (its clients, its
//! backends, what the namespace's kernel counts).

use std::time::Duration;

/// Moves this thread into `pid`'s network namespace once it has one of
/// its own (`unshare` makes it just after the process starts).
pub fn enter_network_namespace_of(pid: u32, log: &dyn Fn() -> String) {
    let ours = std::fs::read_link("/proc/self/ns/net").expect("our namespace");
    let path = format!("/proc/{pid}/ns/net");
    for _ in 0..500 {
        if std::fs::read_link(&path).is_ok_and(|theirs| theirs != ours) {
            let namespace = std::fs::File::open(&path).expect("its namespace");
            nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "baton never had a network namespace of its own; log:\n{}",
        log()
    );
}

/// Waits until `at` takes connections (from this thread's namespace).
pub fn wait_listening(at: std::net::SocketAddr, log: &dyn Fn() -> String) {
    for _ in 0..500 {
        if std::net::TcpStream::connect(at).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("baton never listened on {at}; log:\n{}", log());
}
