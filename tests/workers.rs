//! Thread per core: `workers` threads, each with its own SO_REUSEPORT
//! shard of every listener, seen from outside in `/proc`: the threads by
//! name, the listening sockets by inode; a reload hands every shard over.

mod support;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{Baton, Spec};
use support::listening_inodes;

/// The names of a process's threads that carry connections.
fn worker_threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim().to_string())
                .filter(|c| c.starts_with("baton-worker"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_has_a_shard_of_every_listener_and_a_reload_hands_all_over() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .top("workers = 3")
        .http("web", "app")
        .tcp("raw", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let pid = baton.serving_pid().await;
    assert_eq!(
        worker_threads(pid),
        ["baton-worker-0", "baton-worker-1", "baton-worker-2"]
    );
    let web = listening_inodes(baton.addr("web").port());
    assert_eq!(web.len(), 3, "one shard per worker");
    assert_eq!(listening_inodes(baton.addr("raw").port()).len(), 3);
    for i in 0..30 {
        let answer = client::get(baton.addr("web"), &format!("/{i}"))
            .await
            .expect("served");
        assert_eq!(answer.status, 200);
    }

    let next = baton.reload_ok().await;
    assert_ne!(next, pid);
    assert_eq!(worker_threads(next).len(), 3);
    assert_eq!(
        listening_inodes(baton.addr("web").port()),
        web,
        "the very same sockets, every shard"
    );
    assert_eq!(
        client::get(baton.addr("web"), "/after")
            .await
            .expect("served after the reload")
            .status,
        200
    );
}

/// A listener on port 0 is on one port, the one the kernel picked for its
/// first shard, whatever the number of workers: each shard picked its
/// own, so the listener was on as many ports as workers, each served by
/// one worker, and `/status` showed the last. A reload keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_on_port_0_has_every_shard_on_one_port() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .top("workers = 3")
        .section("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let status = client::status(baton.admin).await;
    let bound: std::net::SocketAddr = status["listeners"][0]["bind"]
        .as_str()
        .and_then(|b| b.parse().ok())
        .expect("/status names the bound address");
    assert_ne!(bound.port(), 0);
    assert_eq!(
        listening_inodes(bound.port()).len(),
        3,
        "three shards listening on {bound}"
    );
    let answer = client::get(bound, "/").await.expect("served");
    assert_eq!(answer.status, 200);
    // And a reload adopts the very same three sockets.
    let shards = listening_inodes(bound.port());
    baton.reload_ok().await;
    baton.settled().await;
    assert_eq!(listening_inodes(bound.port()), shards);
}

/// A reload to fewer workers drops a shard of each listener. Unless the
/// kernel moves what still arrives at a closing socket to a shard that
/// stays (`net.ipv4.tcp_migrate_req`), the old generation says so, naming
/// the shards; with it set, it says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_fewer_workers_warns_unless_the_kernel_moves_its_queues() {
    const WARNING: &str = "tcp_migrate_req is 0";
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .top("workers = 2")
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    baton.reload_ok().await;
    assert!(!baton.log().contains(WARNING), "nothing dropped");
    baton.write_config(&baton.config_text().replace("workers = 2", "workers = 1"));
    baton.reload_ok().await;
    let migrates = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req")
        .expect("the sysctl")
        .trim()
        != "0";
    let log = baton.log();
    let warned = log
        .lines()
        .any(|l| l.contains(WARNING) && l.contains("web#1"));
    assert_eq!(warned, !migrates, "{log}");
}
