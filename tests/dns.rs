//! Backends named by DNS through the real binary, answered by the tests'
//! own DNS server on loopback while load runs: an address that moves, a
//! name server that fails or goes silent, SRV weights, a reload with DNS
//! down, what `/status` and `/metrics` show, and `baton check`.

mod support;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use support::backend::HttpBackend;
use support::client;
use support::daemon::{signal, wait_exit, Baton, Notifications, Spec};
use support::dns::{DnsServer, Mode, SrvRecord};
use support::load::{Load, Targets};
use support::raw::{ok as raw_ok, RawBackend, Seen, Then};
use support::tls::{Authority, TlsBackend};

const HOST: &str = "app.baton.test";
const CHECKS: &str = "health = { kind = \"http\", path = \"/health\", interval = \"100ms\", timeout = \"500ms\", rise = 2, fall = 3 }";

/// Backends on one port of two loopback addresses (an A record gives an
/// address, not a port): 127.0.0.2 and 127.0.0.3.
async fn two_hosts() -> (HttpBackend, HttpBackend) {
    let first = HttpBackend::start_on("a", "127.0.0.2:0".parse().expect("addr")).await;
    let port = first.addr.port();
    let second = HttpBackend::start_on("b", SocketAddr::from(([127, 0, 0, 3], port))).await;
    (first, second)
}

/// Everything a test of a host name needs: the DNS server, two backends
/// (`a` on 127.0.0.2, `b` on 127.0.0.3), and baton started on
/// [`named_spec`] once `HOST` resolves to the addresses ending in `last`.
struct Named {
    dns: DnsServer,
    first: HttpBackend,
    second: HttpBackend,
    baton: Baton,
}

async fn named(last: &[u8], extra: &str) -> Named {
    let dns = DnsServer::start().await;
    let (first, second) = two_hosts().await;
    let ips: Vec<Ipv4Addr> = last.iter().map(|&l| Ipv4Addr::new(127, 0, 0, l)).collect();
    dns.set_a(HOST, &ips);
    let baton = Baton::start(named_spec(&dns, first.addr.port(), extra)).await;
    Named {
        dns,
        first,
        second,
        baton,
    }
}

/// A pool "app" whose one backend is `HOST` at `port`, resolved on `dns`
/// every 200 ms, behind an http listener "web".
fn named_spec(dns: &DnsServer, port: u16, extra: &str) -> Spec {
    named_spec_every("200ms", dns, port, extra)
}

/// [`named_spec`] resolved every `interval`.
fn named_spec_every(interval: &str, dns: &DnsServer, port: u16, extra: &str) -> Spec {
    named_spec_waiting(interval, "300ms", dns, port, extra)
}

/// [`named_spec_every`] with a lookup given up after `timeout`.
fn named_spec_waiting(
    interval: &str,
    timeout: &str,
    dns: &DnsServer,
    port: u16,
    extra: &str,
) -> Spec {
    Spec::new()
        .section(&format!(
            "[resolver]\nnameservers = [\"{}\"]\ntimeout = \"{timeout}\"\n\n[[pools]]\nname = \"app\"\nresolve_interval = \"{interval}\"\n{extra}\nbackends = [{{ name = \"app\", address = \"{HOST}:{port}\" }}]\n",
            dns.addr
        ))
        .http("web", "app")
}

async fn status(admin: SocketAddr) -> Value {
    let a = client::get(admin, "/status").await.expect("status");
    serde_json::from_str(&a.body).expect("status json")
}

/// `/status`'s backends of pool "app", by address: (address, state).
async fn members(admin: SocketAddr) -> Vec<(String, String)> {
    let v = status(admin).await;
    v["pools"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let s = |k: &str| b[k].as_str().unwrap_or("").to_string();
            (s("address"), s("state"))
        })
        .collect()
}

/// `/status`'s weights of pool "app"'s backends, in order.
async fn weights(admin: SocketAddr) -> Vec<u64> {
    let v = status(admin).await;
    v["pools"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["weight"].as_u64())
        .collect()
}

async fn wait_members(admin: SocketAddr, want: &[(String, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, s)| (a.clone(), s.to_string()))
        .collect();
    let what = format!("members {want:?}");
    support::eventually(&what, || {
        let want = want.clone();
        async move { members(admin).await == want }
    })
    .await;
}

/// The value of one series in `/metrics` (0 when absent).
async fn sample(admin: SocketAddr, series: &str) -> f64 {
    client::metrics(admin)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn load_on(baton: &Baton) -> Load {
    Load::start(Targets {
        http: Some(baton.addr("web")),
        tcp: None,
        names: vec!["a", "b"],
    })
}

/// A name is asked again when its records' TTL runs out, before its
/// `resolve_interval` (README; here 60 s): an address that came is
/// followed within its TTL. And never more than about once a second
/// however short the TTL: a TTL of 0 (Consul's default) is no query storm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_brings_a_lookup_forward_but_never_under_a_second() {
    let dns = DnsServer::start().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 1)]);
    let baton = Baton::start(named_spec_every("60s", &dns, 9, "")).await;
    wait_members(baton.admin, &[("127.0.0.1:9".to_string(), "up")]).await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    // (The old one is held a while before it drains, in case the name
    // flaps.)
    support::eventually("the new address joins", || async {
        members(baton.admin)
            .await
            .contains(&("127.0.0.2:9".to_string(), "up".to_string()))
    })
    .await;
    dns.set_ttl(0);
    // The last answer's TTL (1 s) runs out first.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = dns.queries();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let more = dns.queries() - asked;
    assert!((2..=6).contains(&more), "{more} queries in 3 s at TTL 0");
}

/// A first start's lookup is the name's first: the name is asked again
/// when that answer says (its TTL, the interval: past this test), not at
/// once as the doors open (every name was asked twice at every start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_asks_each_name_once() {
    let dns = DnsServer::start().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 1)]);
    dns.set_ttl(300);
    let baton = Baton::start(named_spec_every("60s", &dns, 9, "")).await;
    wait_members(baton.admin, &[("127.0.0.1:9".to_string(), "up")]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(dns.queries(), 1, "{}", baton.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_moves_drains_the_old_member_and_fails_nothing() {
    let Named {
        dns,
        first,
        second,
        baton,
    } = named(&[2], CHECKS).await;
    let (old, new) = (first.addr.to_string(), second.addr.to_string());
    wait_members(baton.admin, &[(old.clone(), "up")]).await;
    let load = load_on(&baton);
    load.progress(50).await;
    let web = baton.addr("web");
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the gated request reached the first backend", || async {
        first.held() == 1
    })
    .await;

    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 3)]);
    // The new member comes in through `rise`; the old one drains meanwhile.
    wait_members(
        baton.admin,
        &[(old.clone(), "draining"), (new.clone(), "up")],
    )
    .await;
    support::eventually("traffic reaches the second backend", || async {
        second.hits() > 20
    })
    .await;
    first.release();
    let answer = held.await.expect("join").expect("gated answer");
    assert_eq!(answer.status, 200);
    wait_members(baton.admin, &[(new.clone(), "up")]).await;
    let first_hits = first.hits();
    load.progress(100).await;
    assert_eq!(
        first.hits(),
        first_hits,
        "nothing reaches the removed member"
    );
    load.stop().await.assert_clean();
    // Its series leave `/metrics` with it, and stay out after a reload
    // (addresses that churn would otherwise grow the exposition for good).
    let gone = format!("backend=\"app@{old}\"");
    let text = client::metrics(baton.admin).await;
    assert!(text.contains(&format!("backend=\"app@{new}\"")), "{text}");
    assert!(!text.contains(&gone), "{gone} in\n{text}");
    baton.reload_ok().await;
    baton.settled().await;
    let text = client::metrics(baton.admin).await;
    assert!(!text.contains(&gone), "{gone} after a reload, in\n{text}");
}

/// A reload while an address moves (the new one not up yet) keeps the
/// member still serving: the new generation does not start with only the
/// new address, which would leave the name nobody to take work (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_in_the_middle_of_a_move_keeps_the_member_still_serving() {
    let Named {
        dns,
        first,
        second,
        baton,
    } = named(&[2], CHECKS).await;
    let (old, new) = (first.addr.to_string(), second.addr.to_string());
    wait_members(baton.admin, &[(old.clone(), "up")]).await;
    // The new address answers no health check yet.
    drop(second);
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 3)]);
    wait_members(baton.admin, &[(old.clone(), "up"), (new.clone(), "down")]).await;
    let web = baton.addr("web");
    let before = client::get(web, "/x").await.expect("answer");
    assert_eq!((before.status, before.body.as_str()), (200, "a /x\n"));
    baton.reload_ok().await;
    baton.settled().await;
    let after = client::get(web, "/x").await.expect("answer");
    assert_eq!(
        (after.status, after.body.as_str()),
        (200, "a /x\n"),
        "the old member still serves after the reload"
    );
    wait_members(baton.admin, &[(old, "up"), (new, "down")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servfail_and_silence_keep_the_last_set() {
    let Named {
        dns, first, baton, ..
    } = named(&[2], "").await;
    wait_members(baton.admin, &[(first.addr.to_string(), "up")]).await;
    let load = load_on(&baton);
    load.progress(20).await;
    for (mode, result) in [(Mode::ServFail, "error"), (Mode::Silent, "timeout")] {
        dns.set_mode(mode);
        // A few resolutions' worth (one query each).
        dns.more_queries(4).await;
        let series = format!("baton_dns_resolutions_total{{pool=\"app\",result=\"{result}\"}}");
        support::eventually(&format!("{result} counted"), || async {
            sample(baton.admin, &series).await > 0.0
        })
        .await;
        assert_eq!(
            members(baton.admin).await,
            [(first.addr.to_string(), "up".to_string())]
        );
        load.progress(20).await;
    }
    dns.set_mode(Mode::Answer);
    let ok = "baton_dns_resolutions_total{pool=\"app\",result=\"ok\"}";
    let before = sample(baton.admin, ok).await;
    support::eventually("DNS answers again", || async {
        sample(baton.admin, ok).await > before
    })
    .await;
    assert!(baton.log().contains("keeping the last good set"));
    load.stop().await.assert_clean();
}

/// An answer of no address (NOERROR without records here; NXDOMAIN the
/// same) keeps the last good set for the hold (two resolve intervals: an
/// answer cut short once churns nothing), then the name's members drain:
/// kept for good, they took work for addresses the name no longer gives
/// (a service scaled to zero, its addresses given to others). Addresses
/// in an answer again bring members back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_no_address_drains_the_members_after_the_hold() {
    let dns = DnsServer::start().await;
    let (first, _second) = two_hosts().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    let baton = Baton::start(named_spec_every("2s", &dns, first.addr.port(), "")).await;
    let up = [(first.addr.to_string(), "up")];
    wait_members(baton.admin, &up).await;
    dns.set_mode(Mode::Empty);
    let empty = "baton_dns_resolutions_total{pool=\"app\",result=\"empty\"}";
    support::eventually("an empty answer counted", || async {
        sample(baton.admin, empty).await > 0.0
    })
    .await;
    assert_eq!(
        members(baton.admin).await,
        [(up[0].0.clone(), "up".to_string())],
        "kept within the hold (4 s from the first empty answer)"
    );
    // The next answer, 2 s on, taken: still within it.
    support::eventually("a second empty answer counted", || async {
        sample(baton.admin, empty).await >= 2.0
    })
    .await;
    assert_eq!(
        members(baton.admin).await,
        [(up[0].0.clone(), "up".to_string())],
        "kept at the second empty answer"
    );
    wait_members(baton.admin, &[]).await;
    let answer = client::get(baton.addr("web"), "/x").await.expect("answer");
    assert_eq!(answer.status, 503, "no backend left: {}", answer.body);
    assert!(baton
        .log()
        .contains("DNS has said for the hold that the name has no address"));
    dns.set_mode(Mode::Answer);
    wait_members(baton.admin, &up).await;
    let answer = client::get(baton.addr("web"), "/x").await.expect("answer");
    assert_eq!(answer.status, 200);
}

/// Reloads during the hold do not start it again: a new generation's
/// hold counts from the first answer of no address the old one heard
/// (reloads more often than the hold kept the members for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_during_the_hold_do_not_start_it_again() {
    let dns = DnsServer::start().await;
    let (first, _second) = two_hosts().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    // A hold of 4 s; reloads every second or so, for 7 s at least: no
    // generation lives through a hold of its own.
    let baton = Baton::start(named_spec_every("2s", &dns, first.addr.port(), "")).await;
    wait_members(baton.admin, &[(first.addr.to_string(), "up")]).await;
    dns.set_mode(Mode::Empty);
    let empty = "baton_dns_resolutions_total{pool=\"app\",result=\"empty\"}";
    support::eventually("an empty answer counted", || async {
        sample(baton.admin, empty).await > 0.0
    })
    .await;
    for _ in 0..10 {
        baton.reload_ok().await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let left = members(baton.admin).await;
    assert!(
        left.iter().all(|(_, state)| state != "up"),
        "past the hold: {left:?}"
    );
}

/// A name with A and AAAA records stands for its A addresses: its AAAA
/// ones would be members on a host that may not route IPv6. Without A
/// records, it stands for its AAAA ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_stands_for_its_a_addresses_else_its_aaaa_ones() {
    let dns = DnsServer::start().await;
    let (first, _second) = two_hosts().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    dns.set_aaaa(HOST, &[Ipv6Addr::LOCALHOST]);
    let baton = Baton::start(named_spec(&dns, first.addr.port(), "")).await;
    let v4 = first.addr.to_string();
    wait_members(baton.admin, &[(v4.clone(), "up")]).await;
    // A few resolutions more (A queries and AAAA ones).
    dns.more_queries(6).await;
    assert_eq!(members(baton.admin).await, [(v4, "up".to_string())]);
    dns.set_a(HOST, &[]);
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, first.addr.port())).to_string();
    support::eventually("the AAAA address joins", || async {
        members(baton.admin)
            .await
            .iter()
            .any(|(address, _)| *address == v6)
    })
    .await;
}

/// An A query that fails is a failed lookup even when AAAA answers: the
/// last good set stays (the IPv4 members were not replaced by the IPv6
/// addresses), and the failure is counted as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_a_query_keeps_the_last_set_though_aaaa_answers() {
    let Named {
        dns, first, baton, ..
    } = named(&[2], "").await;
    let v4 = first.addr.to_string();
    wait_members(baton.admin, &[(v4.clone(), "up")]).await;
    dns.set_aaaa(HOST, &[Ipv6Addr::LOCALHOST]);
    dns.set_mode(Mode::ServFailA);
    let failed = "baton_dns_resolutions_total{pool=\"app\",result=\"error\"}";
    support::eventually("the failed A query counted", || async {
        sample(baton.admin, failed).await > 0.0
    })
    .await;
    // Past the hold a replaced member would have had (two intervals).
    dns.more_queries(6).await;
    assert_eq!(members(baton.admin).await, [(v4, "up".to_string())]);
}

/// A pool "app" of the members the SRV records of `name` give, asked of
/// `dns` every 200 ms, behind an http listener "web".
fn srv_spec(dns: &DnsServer, name: &str) -> Spec {
    srv_spec_every("200ms", dns, name)
}

/// [`srv_spec`] resolved every `interval`.
fn srv_spec_every(interval: &str, dns: &DnsServer, name: &str) -> Spec {
    Spec::new()
        .section(&format!(
            "[resolver]\nnameservers = [\"{}\"]\n\n[[pools]]\nname = \"app\"\nresolve_interval = \"{interval}\"\nsrv = \"{name}\"\n",
            dns.addr
        ))
        .http("web", "app")
}

/// Backends a and b as the targets of two SRV records of `weights`, of
/// priority 10 (`more` records after them), followed until both are
/// members: `(dns, a, b, baton)`.
async fn srv_pair(
    weights: [u16; 2],
    more: &[support::dns::SrvRecord],
) -> (DnsServer, HttpBackend, HttpBackend, Baton) {
    let dns = DnsServer::start().await;
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    dns.set_a("a.baton.test", &[Ipv4Addr::LOCALHOST]);
    dns.set_a("b.baton.test", &[Ipv4Addr::LOCALHOST]);
    // Given as additionals too (as Consul does): not a member, A wins.
    dns.set_aaaa("a.baton.test", &[Ipv6Addr::LOCALHOST]);
    let mut records = vec![
        (10, weights[0], a.addr.port(), "a.baton.test"),
        (10, weights[1], b.addr.port(), "b.baton.test"),
    ];
    records.extend_from_slice(more);
    dns.set_srv("_http._tcp.app.baton.test", &records);
    let baton = Baton::start(srv_spec(&dns, "_http._tcp.app.baton.test")).await;
    wait_members(
        baton.admin,
        &[(a.addr.to_string(), "up"), (b.addr.to_string(), "up")],
    )
    .await;
    (dns, a, b, baton)
}

/// `n` requests on one connection to `baton`'s `web`, each answered 200.
async fn requests_on_one_connection(baton: &Baton, n: usize) {
    let web = baton.addr("web");
    let mut conn = client::connect(web).await.expect("connect");
    for i in 0..n {
        let answer = client::send(&mut conn, web, &format!("/r/{i}"))
            .await
            .expect("request");
        assert_eq!(answer.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_give_one_member_each_weighted_by_the_record() {
    let (_dns, a, b, baton) = srv_pair([1, 3], &[(20, 5, 1, "fallback.baton.test")]).await;
    assert_eq!(weights(baton.admin).await, [1, 3]);
    requests_on_one_connection(&baton, 400).await;
    assert_eq!(
        (a.hits(), b.hits()),
        (100, 300),
        "smooth round robin is exact per weight"
    );
}

/// SRV records of weight 0 (a common way to write them: "no preference")
/// count as 1 each (README): at weight 0, a weighted pick sent every
/// request to the first member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_of_weight_0_share_the_work_evenly() {
    let (_dns, a, b, baton) = srv_pair([0, 0], &[]).await;
    assert_eq!(weights(baton.admin).await, [1, 1]);
    requests_on_one_connection(&baton, 200).await;
    assert_eq!((a.hits(), b.hits()), (100, 100));
}

/// An SRV target whose lookup fails keeps its last good addresses while
/// the other targets are followed: the whole answer failed, so the pool
/// followed none of them (and at a first start had no member at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_srv_target_keeps_its_addresses_and_the_others_are_followed() {
    let dns = DnsServer::start().await;
    let (a, b, c) = (
        HttpBackend::start("a").await,
        HttpBackend::start("b").await,
        HttpBackend::start("c").await,
    );
    dns.leave_out_additionals();
    dns.set_a("a.baton.test", &[Ipv4Addr::LOCALHOST]);
    dns.set_a("b.baton.test", &[Ipv4Addr::LOCALHOST]);
    let name = "_http._tcp.app.baton.test";
    let port = |backend: &HttpBackend| backend.addr.port();
    dns.set_srv(
        name,
        &[
            (10, 1, port(&a), "a.baton.test"),
            (10, 1, port(&b), "b.baton.test"),
        ],
    );
    let baton = Baton::start(srv_spec(&dns, name)).await;
    wait_members(
        baton.admin,
        &[(a.addr.to_string(), "up"), (b.addr.to_string(), "up")],
    )
    .await;
    dns.servfail_a_of("b.baton.test");
    dns.set_srv(
        name,
        &[
            (10, 1, port(&c), "a.baton.test"),
            (10, 1, port(&b), "b.baton.test"),
        ],
    );
    wait_members(
        baton.admin,
        &[(b.addr.to_string(), "up"), (c.addr.to_string(), "up")],
    )
    .await;
    let error = "baton_dns_resolutions_total{pool=\"app\",result=\"error\"}";
    assert!(sample(baton.admin, error).await > 0.0, "counted as failed");
    assert!(baton.log().contains("DNS failed for some SRV targets"));
}

/// An SRV target whose lookup failed with no address to keep (here at a
/// first start) is asked again within a second, as a name that never
/// answered is, not a whole `resolve_interval` on (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_srv_target_failing_at_a_first_start_is_asked_again_soon() {
    let dns = DnsServer::start().await;
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    dns.leave_out_additionals();
    // Records that hold a minute: the TTL does not bring the next try.
    dns.set_ttl(60);
    dns.set_a("a.baton.test", &[Ipv4Addr::LOCALHOST]);
    dns.set_a("b.baton.test", &[Ipv4Addr::LOCALHOST]);
    dns.servfail_a_of("b.baton.test");
    let name = "_http._tcp.app.baton.test";
    dns.set_srv(
        name,
        &[
            (10, 1, a.addr.port(), "a.baton.test"),
            (10, 1, b.addr.port(), "b.baton.test"),
        ],
    );
    let baton = Baton::start(srv_spec_every("60s", &dns, name)).await;
    wait_members(baton.admin, &[(a.addr.to_string(), "up")]).await;
    dns.servfail_a_of("nothing.baton.test");
    wait_members(
        baton.admin,
        &[(a.addr.to_string(), "up"), (b.addr.to_string(), "up")],
    )
    .await;
}

/// RFC 2782: SRV records whose target is "." say the service is not
/// available at that name. That is an empty answer, said as such (not a
/// failed lookup of "."): the last good set is kept for the hold, then
/// drains, as for any answer of no address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_srv_target_of_dot_is_said_to_mean_not_available() {
    let dns = DnsServer::start().await;
    let a = HttpBackend::start("a").await;
    dns.set_a("a.baton.test", &[Ipv4Addr::LOCALHOST]);
    let name = "_http._tcp.app.baton.test";
    dns.set_srv(name, &[(10, 1, a.addr.port(), "a.baton.test")]);
    let baton = Baton::start(srv_spec(&dns, name)).await;
    let up = [(a.addr.to_string(), "up")];
    wait_members(baton.admin, &up).await;
    dns.set_srv(name, &[(0, 0, 0, ".")]);
    let said = "the service is not available there (target \".\")";
    support::eventually("the answer said to mean not available", || async {
        baton.log().contains(said)
    })
    .await;
    let empty = "baton_dns_resolutions_total{pool=\"app\",result=\"empty\"}";
    assert!(sample(baton.admin, empty).await > 0.0, "counted as empty");
    wait_members(baton.admin, &[]).await;
}

/// An SRV record of port 0 makes no member (nothing can be reached
/// there): it was one that failed every request its weight gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_srv_record_of_port_0_makes_no_member() {
    // `srv_pair` waits for the members to be a and b alone.
    let (_dns, a, b, baton) = srv_pair([1, 1], &[(10, 1, 0, "a.baton.test")]).await;
    let want = [a.addr.to_string(), b.addr.to_string()];
    let members: Vec<String> = members(baton.admin)
        .await
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(members, want);
}

/// One name server that answers SERVFAIL at once (a forwarder whose own
/// upstream is down) ahead of one that answers: the name's members come
/// from the second, as glibc moves on to the next server on SERVFAIL
/// (HAProxy waits for every server's answer). hickory ends a lookup at
/// the first such answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_server_answering_servfail_is_passed_over_for_the_next() {
    let failing = DnsServer::start().await;
    failing.set_mode(Mode::ServFail);
    let answering = DnsServer::start().await;
    // Slower than the failure by far, so hickory's two-at-once ends at
    // the SERVFAIL (else the test would pass without the fallback).
    answering.set_delay(Duration::from_millis(300));
    let backend = HttpBackend::start("a").await;
    answering.set_a(HOST, &[Ipv4Addr::LOCALHOST]);
    let spec = Spec::new()
        .section(&format!(
            "[resolver]\nnameservers = [\"{}\", \"{}\"]\ntimeout = \"1s\"\n\n[[pools]]\nname = \"app\"\nresolve_interval = \"200ms\"\nbackends = [{{ name = \"app\", address = \"{HOST}:{}\" }}]\n",
            failing.addr,
            answering.addr,
            backend.addr.port()
        ))
        .http("web", "app");
    let baton = Baton::start(spec).await;
    wait_members(baton.admin, &[(backend.addr.to_string(), "up")]).await;
    let answer = client::get(baton.addr("web"), "/").await.expect("served");
    assert_eq!(answer.status, 200);
}

/// A name holding '_' (a Compose service's, `my_app`) is looked up and
/// served, as nginx and HAProxy take it: it was refused as no host name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_an_underscore_is_looked_up_and_served() {
    let dns = DnsServer::start().await;
    let a = HttpBackend::start("a").await;
    dns.set_a("my_app.baton.test", &[Ipv4Addr::LOCALHOST]);
    let spec = Spec::new()
        .section(&format!(
            "[resolver]\nnameservers = [\"{}\"]\n\n[[pools]]\nname = \"app\"\nbackends = [{{ name = \"app\", address = \"my_app.baton.test:{}\" }}]\n",
            dns.addr,
            a.addr.port()
        ))
        .http("web", "app");
    let baton = Baton::start(spec).await;
    wait_members(baton.admin, &[(a.addr.to_string(), "up")]).await;
    let answer = client::get(baton.addr("web"), "/").await.expect("served");
    assert_eq!((answer.status, answer.body.as_str()), (200, "a /\n"));
}

/// A first start waits for a whole SRV answer as long as its queries in
/// turn may take, and asks its targets at once. Here the server gives no
/// addresses with the records (as many recursive resolvers answer), each
/// target has AAAA addresses alone (an A query, then an AAAA one), and
/// each query takes 0.4 s with `timeout = "1s"`: the answer takes 1.2 s
/// with its four targets asked at once, where the first start waited 1 s,
/// and asked one after another they took 3.6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_waits_for_an_srv_answer_whose_targets_are_asked_apart() {
    let dns = DnsServer::start().await;
    let records: Vec<SrvRecord> = [
        "a.baton.test",
        "b.baton.test",
        "c.baton.test",
        "d.baton.test",
    ]
    .into_iter()
    .zip(8001..)
    .map(|(target, port)| (10, 1, port, target))
    .collect();
    for record in &records {
        dns.set_aaaa(record.3, &[Ipv6Addr::LOCALHOST]);
    }
    dns.set_srv("_http._tcp.app.baton.test", &records);
    dns.leave_out_additionals();
    dns.set_delay(Duration::from_millis(400));
    let spec = Spec::new()
        .section(&format!(
            "[resolver]\nnameservers = [\"{}\"]\ntimeout = \"1s\"\n\n[[pools]]\nname = \"app\"\nresolve_interval = \"60s\"\nsrv = \"_http._tcp.app.baton.test\"\n",
            dns.addr
        ))
        .http("web", "app");
    let baton = Baton::start(spec).await;
    let want: Vec<(String, String)> = records
        .iter()
        .map(|r| (format!("[::1]:{}", r.2), "up".to_string()))
        .collect();
    assert_eq!(members(baton.admin).await, want, "{}", baton.log());
    assert!(
        !baton.log().contains("no DNS answer at start"),
        "{}",
        baton.log()
    );
}

/// A stop signal while a first start waits for its first DNS answers (25 s
/// away here, within the lookup's bound, past `wait_exit`'s) ends the
/// wait: the generation stops at once, exits 0, and never tells systemd
/// it is ready (its first health round had nothing to check, so it used
/// to say `READY=1` just before `STOPPING=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_the_first_dns_answers_are_awaited_ends_the_start_unready() {
    let dns = DnsServer::start().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    dns.set_delay(Duration::from_secs(25));
    let spec = named_spec_waiting("60s", "30s", &dns, 8080, "");
    let notifications = Notifications::listen();
    let baton = Baton::spawn_under(spec, &[], &["env", &notifications.env]);
    support::eventually("the first lookup is under way", || async {
        dns.queries() > 0
    })
    .await;
    signal(baton.first_pid, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0), "{}", baton.log());
    assert!(
        baton
            .log()
            .contains("stop signal during start-up: not waiting for the first DNS answers"),
        "{}",
        baton.log()
    );
    notifications.stopping_never_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_while_dns_is_silent_serves_the_carried_set() {
    let Named {
        dns, first, baton, ..
    } = named(&[2], CHECKS).await;
    wait_members(baton.admin, &[(first.addr.to_string(), "up")]).await;
    dns.set_mode(Mode::Silent);
    let load = load_on(&baton);
    load.progress(20).await;
    let old = baton.serving_pid().await;
    let new = baton.reload_ok().await;
    assert_ne!(old, new);
    baton.settled().await;
    load.progress(50).await;
    assert_eq!(
        members(baton.admin).await,
        [(first.addr.to_string(), "up".to_string())]
    );
    let ready = client::get(baton.admin, "/readyz").await.expect("readyz");
    assert_eq!(ready.status, 200, "{}", ready.body);
    load.stop().await.assert_clean();
}

/// A reload that changes a named backend's weight while DNS is silent:
/// the members the old generation handed over take the new weight at
/// once, not at DNS's next answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_changed_by_a_reload_while_dns_is_silent_holds_at_once() {
    let Named {
        dns, first, baton, ..
    } = named(&[2], "").await;
    wait_members(baton.admin, &[(first.addr.to_string(), "up")]).await;
    dns.set_mode(Mode::Silent);
    let port = first.addr.port();
    let before = format!("address = \"{HOST}:{port}\" }}");
    let after = format!("address = \"{HOST}:{port}\", weight = 5 }}");
    let text = baton.config_text();
    assert!(text.contains(&before), "{text}");
    baton.write_config(&text.replace(&before, &after));
    baton.reload_ok().await;
    baton.settled().await;
    assert_eq!(weights(baton.admin).await, [5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_metrics_show_each_address_under_the_name() {
    let Named {
        first,
        second,
        baton,
        ..
    } = named(&[2, 3], "").await;
    let (a, b) = (first.addr.to_string(), second.addr.to_string());
    wait_members(baton.admin, &[(a.clone(), "up"), (b.clone(), "up")]).await;
    let v = status(baton.admin).await;
    let from = format!("{HOST}:{}", first.addr.port());
    for m in v["pools"][0]["backends"].as_array().into_iter().flatten() {
        assert_eq!(m["name"], "app", "{m}");
        assert_eq!(m["resolved_from"], from.as_str(), "{m}");
    }
    assert_eq!(v["pools"][0]["named"][0]["query"], from.as_str());
    let text = client::metrics(baton.admin).await;
    for address in [&a, &b] {
        let series =
            format!("baton_backend_state{{pool=\"app\",backend=\"app@{address}\",state=\"up\"}} 1");
        assert!(text.contains(&series), "{series} in\n{text}");
    }
    // One member by its label, which a reload keeps; percent-encoded, as
    // a client that escapes a path segment sends it.
    let path = format!("/backends/app%40{}/drain", a.replace(':', "%3A"));
    let one = client::call(baton.admin, "POST", &path, None)
        .await
        .expect("drain one member");
    assert_eq!(one.status, 200, "{}", one.body);
    wait_members(baton.admin, &[(a.clone(), "out"), (b.clone(), "up")]).await;
    baton.reload_ok().await;
    baton.settled().await;
    wait_members(baton.admin, &[(a.clone(), "out"), (b.clone(), "up")]).await;
    let gone = client::call(baton.admin, "POST", "/backends/app@127.0.0.9:1/drain", None)
        .await
        .expect("unknown member");
    assert_eq!(gone.status, 404, "{}", gone.body);
    // The name reaches every member, and `baton backend` says each (it
    // printed the first alone).
    let out = std::process::Command::new(support::daemon::BIN)
        .args(["backend", "drain", "app", "-c"])
        .arg(&baton.config)
        .output()
        .expect("run baton backend");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{out:?}");
    for member in [&a, &b] {
        assert!(
            said.contains(&format!("backend app@{member} (")),
            "{member} in {said}"
        );
    }
    wait_members(baton.admin, &[(a.clone(), "out"), (b.clone(), "out")]).await;
    // And stays so across a reload, for the name as for its members.
    baton.reload_ok().await;
    baton.settled().await;
    wait_members(baton.admin, &[(a.clone(), "out"), (b.clone(), "out")]).await;
    assert_eq!(
        status(baton.admin).await["pools"][0]["named"][0]["admin"],
        "draining"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_down_at_first_start_leaves_the_name_waiting_and_the_rest_serving() {
    let dns = DnsServer::start().await;
    dns.set_mode(Mode::ServFail);
    let (first, _second) = two_hosts().await;
    let other = HttpBackend::start("b").await;
    let spec = named_spec(&dns, first.addr.port(), "")
        .pool("other", &[other.addr])
        .http("side", "other");
    let baton = Baton::spawn(spec, &[]);
    support::eventually("readyz names the pool waiting for DNS", || async {
        client::get(baton.admin, "/readyz")
            .await
            .is_ok_and(|a| a.status == 503 && a.body.contains("waiting for DNS: app"))
    })
    .await;
    let side = client::get(baton.addr("side"), "/x")
        .await
        .expect("other pool");
    assert_eq!(side.status, 200);
    let app = client::get(baton.addr("web"), "/x").await.expect("app");
    assert_eq!(app.status, 503, "no member yet");
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    dns.set_mode(Mode::Answer);
    baton.wait_ready().await;
    let app = client::get(baton.addr("web"), "/x").await.expect("app");
    assert_eq!((app.status, app.body.as_str()), (200, "a /x\n"));
}

/// A pool with a healthy backend is ready though a name of its own has no
/// answer yet (DNS down, a mistyped host name): DESIGN's readiness is a
/// healthy backend in every pool, and the name's wait shows in `/status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_a_healthy_backend_is_ready_while_its_name_waits_for_dns() {
    let dns = DnsServer::start().await;
    dns.set_mode(Mode::ServFail);
    let other = HttpBackend::start("b").await;
    let spec = Spec::new()
        .section(&format!(
            "[resolver]\nnameservers = [\"{}\"]\ntimeout = \"300ms\"\n\n[[pools]]\nname = \"app\"\nresolve_interval = \"200ms\"\nbackends = [{{ name = \"app\", address = \"{HOST}:1\" }}, {{ name = \"ip\", address = \"{}\" }}]\n",
            dns.addr, other.addr
        ))
        .http("web", "app");
    let baton = Baton::start(spec).await;
    let ready = client::get(baton.admin, "/readyz").await.expect("readyz");
    assert_eq!(
        (ready.status, ready.body.trim()),
        (200, "{\"status\":\"ready\"}")
    );
    let app = client::get(baton.addr("web"), "/x").await.expect("app");
    assert_eq!((app.status, app.body.as_str()), (200, "b /x\n"));
    assert_eq!(
        status(baton.admin).await["pools"][0]["named"][0]["answered"],
        false,
        "{}",
        status(baton.admin).await
    );
}

/// A member the operator drained by its `name@address` stays drained when
/// its address leaves DNS and comes back (a redeploy, rotating answers),
/// in the same generation and across a reload, instead of rejoining
/// enabled and taking traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_member_whose_address_leaves_and_returns_stays_drained() {
    let Named {
        dns,
        first,
        second,
        baton,
    } = named(&[2, 3], "").await;
    let (kept, drained) = (first.addr.to_string(), second.addr.to_string());
    wait_members(
        baton.admin,
        &[(kept.clone(), "up"), (drained.clone(), "up")],
    )
    .await;
    client::drain(baton.admin, &format!("app@{drained}")).await;
    let (only_first, both) = (
        [Ipv4Addr::new(127, 0, 0, 2)],
        [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
    );
    for reload in [false, true] {
        dns.set_a(HOST, &only_first);
        wait_members(baton.admin, &[(kept.clone(), "up")]).await;
        if reload {
            baton.reload_ok().await;
            baton.settled().await;
        }
        dns.set_a(HOST, &both);
        wait_members(
            baton.admin,
            &[(kept.clone(), "up"), (drained.clone(), "out")],
        )
        .await;
        let hits = second.hits();
        for _ in 0..20 {
            let answer = client::get(baton.addr("web"), "/x").await.expect("app");
            assert_eq!(answer.status, 200);
        }
        assert_eq!(
            second.hits(),
            hits,
            "the drained member took no work (reload: {reload})"
        );
    }
    // Said each time, in case the address is a new instance's.
    let member = format!("backend=app@{drained} state=out");
    let log = baton.log();
    let said = log
        .lines()
        .filter(|l| l.contains("a member the operator set apart") && l.contains(&member))
        .count();
    assert_eq!(said, 2, "{log}");
}

/// An HTTP check of a member asks with the name the config gave (as a
/// client of the application would), not the member's address: an
/// application that checks Host (Django's ALLOWED_HOSTS) failed every
/// check, and the pool went down while its traffic was served well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_check_asks_for_the_name() {
    let backend = RawBackend::start(|seen: &Seen| {
        let asked_by_name = seen
            .head
            .to_ascii_lowercase()
            .contains(&format!("host: {HOST}:"));
        match asked_by_name {
            true => (raw_ok("up"), Then::Close),
            false => (
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".to_vec(),
                Then::Close,
            ),
        }
    })
    .await;
    let dns = DnsServer::start().await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 1)]);
    let baton = Baton::start(named_spec(&dns, backend.addr.port(), CHECKS)).await;
    wait_members(baton.admin, &[(backend.addr.to_string(), "up")]).await;
}

/// A drain said of a name DNS had given no address yet holds for the
/// members a reload's first lookup brings: they come drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_name_without_members_stays_drained_when_a_reload_finds_them() {
    let dns = DnsServer::start().await;
    dns.set_mode(Mode::ServFail);
    let (first, _second) = two_hosts().await;
    let baton = Baton::spawn(named_spec_every("10m", &dns, first.addr.port(), ""), &[]);
    support::eventually("readyz names the pool waiting for DNS", || async {
        client::get(baton.admin, "/readyz")
            .await
            .is_ok_and(|a| a.status == 503 && a.body.contains("waiting for DNS: app"))
    })
    .await;
    client::drain(baton.admin, "app").await;
    dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    dns.set_mode(Mode::Answer);
    baton.reload_ok().await;
    wait_members(baton.admin, &[(first.addr.to_string(), "out")]).await;
    let app = client::get(baton.addr("web"), "/x").await.expect("app");
    assert_eq!(app.status, 503, "its only member is drained");
    assert_eq!(first.hits(), 0);
}

#[test]
fn check_refuses_bad_names_naming_the_key_and_prints_good_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dns.toml");
    let listener = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\npool = \"app\"\n\n[[pools]]\nname = \"app\"\n";
    let run = |text: String| {
        std::fs::write(&path, text).expect("write");
        let out = std::process::Command::new(support::daemon::BIN)
            .args(["check", "-c"])
            .arg(&path)
            .output()
            .expect("run baton check");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, _, stderr) = run(format!(
        "{listener}srv = \"_http.tcp.app.internal\"\nbackends = [{{ name = \"a\", address = \"app1..internal:8080\" }}, {{ name = \"b\", address = \"app2.internal\" }}]\n"
    ));
    assert_eq!(code, Some(78), "{stderr}");
    assert!(
        stderr.contains("pools[0].srv: \"_http.tcp.app.internal\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("pools[0].backends[0].address: \"app1..internal:8080\""),
        "{stderr}"
    );
    assert!(stderr.contains("pools[0].backends[1].address: \"app2.internal\" is not an ip:port or host:port: the port is missing"), "{stderr}");
    let (code, stdout, stderr) = run(format!(
        "[resolver]\nnameservers = [\"127.0.0.1:5353\"]\n\n{listener}srv = \"_http._tcp.app.internal\"\nresolve_interval = \"10s\"\nbackends = [{{ name = \"a\", address = \"app1.internal:8080\", weight = 2 }}]\n"
    ));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("pool app backend _http._tcp.app.internal from DNS SRV _http._tcp.app.internal, resolved every 10s"), "{stdout}");
    assert!(
        stdout.contains("pool app backend a from DNS A/AAAA app1.internal:8080, weight 2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("resolver nameservers 127.0.0.1:5353, timeout 2s"),
        "{stdout}"
    );
}

/// A backend post while a first start still waits on DNS, its backends
/// not built yet, is a 503 to send again (`baton backend` does), not a 404
/// "no backend named app" for a name the config has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_post_before_the_first_lookup_ends_is_sent_again() {
    let dns = DnsServer::start().await;
    dns.set_mode(Mode::Silent);
    let (first, _second) = two_hosts().await;
    let spec = named_spec_waiting("10m", "5s", &dns, first.addr.port(), "");
    let baton = Baton::spawn(spec, &[]);
    support::eventually("the admin port answers", || async {
        client::get(baton.admin, "/healthz")
            .await
            .is_ok_and(|a| a.status == 200)
    })
    .await;
    let early = client::call(baton.admin, "POST", "/backends/app/drain", None)
        .await
        .expect("drain");
    assert_eq!(early.status, 503, "{}", early.body);
    assert!(early.body.contains("starting"), "{}", early.body);
}

/// A TLS pool whose backend is a DNS name, with no `server_name`, checks
/// the backend's certificate against that name, and its health checks
/// too: its address is in no certificate of a host that has a name, and
/// every handshake failed (as nginx's `proxy_ssl_name`, the proxied host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_backend_given_by_name_is_verified_against_that_name() {
    let dns = DnsServer::start().await;
    let ca = Authority::new();
    let identity = ca.issue("backend", &[HOST]);
    let backend = TlsBackend::start("secure", &identity).await;
    dns.set_a(HOST, &[Ipv4Addr::LOCALHOST]);
    let tls = format!("{CHECKS}\ntls = {{ ca = \"{}\" }}", ca.ca_pem().display());
    let baton = Baton::start(named_spec(&dns, backend.addr.port(), &tls)).await;
    wait_members(baton.admin, &[(backend.addr.to_string(), "up")]).await;
    let answer = client::get(baton.addr("web"), "/named")
        .await
        .expect("answered");
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, "secure /named\n"),
        "{}",
        baton.log()
    );
}

/// A host with no name server configured (`/etc/resolv.conf` empty, as
/// while a network manager brings the network up at boot; here bound over
/// in a mount namespace of baton's own) starts: the named backend has no
/// member and the rest of the pool serves, where the start used to fail
/// and take every pool down. Root only (a mount namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_a_name_server_still_starts_and_serves_addresses() {
    let Some(bound_over) = resolv_conf_bound_over("/dev/null") else {
        return;
    };
    let other = HttpBackend::start("b").await;
    let spec = Spec::new()
        .section(&format!(
            "[[pools]]\nname = \"app\"\nresolve_interval = \"200ms\"\nbackends = [{{ name = \"app\", address = \"{HOST}:1\" }}, {{ name = \"ip\", address = \"{}\" }}]\n",
            other.addr
        ))
        .http("web", "app");
    let without_resolv_conf: Vec<&str> = bound_over.iter().map(String::as_str).collect();
    let baton = Baton::spawn_under(spec, &[], &without_resolv_conf);
    support::eventually("the addresses' backend serves", || async {
        client::get(baton.addr("web"), "/x")
            .await
            .is_ok_and(|a| (a.status, a.body.as_str()) == (200, "b /x\n"))
    })
    .await;
    support::eventually("the name's failure is said", || async {
        baton.log().contains("resolv.conf")
    })
    .await;
    assert_eq!(
        members(baton.admin).await,
        [(other.addr.to_string(), "up".to_string())],
        "the name has no member"
    );
}

/// A name that never answered is asked again within a second or so, not a
/// whole `resolve_interval` on: DNS back (at boot, say) gives its pool
/// members at once, where they came up to 30 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_never_answered_is_asked_again_soon() {
    let dns = DnsServer::start().await;
    dns.set_mode(Mode::ServFail);
    let backend = HttpBackend::start("a").await;
    dns.set_a(HOST, &[Ipv4Addr::LOCALHOST]);
    let baton = Baton::spawn(named_spec_every("60s", &dns, backend.addr.port(), ""), &[]);
    support::eventually("the admin port answers", || async {
        client::get(baton.admin, "/healthz").await.is_ok()
    })
    .await;
    // Four failed tries (two at start): with a 60 s interval, only the
    // retry's pace makes them.
    let failed = "baton_dns_resolutions_total{pool=\"app\",result=\"error\"}";
    support::eventually("the name was asked again", || async {
        sample(baton.admin, failed).await >= 4.0
    })
    .await;
    dns.set_mode(Mode::Answer);
    support::eventually("the pool serves once DNS answers", || async {
        client::get(baton.addr("web"), "/x")
            .await
            .is_ok_and(|a| a.status == 200)
    })
    .await;
}

/// Under a search list (`/etc/resolv.conf`'s `search`, `ndots:1`), an A
/// query that fails for the name itself (SERVFAIL here) keeps the last
/// good set: hickory went on to the name's search forms, whose empty
/// answer it reported, and baton took that for a name without an A
/// address and put its AAAA address in the IPv4 member's place. Root
/// only (a mount namespace binds a resolv.conf of the test's, naming a
/// name server on port 53 of 127.0.0.88).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a_query_failing_under_a_search_list_keeps_the_ipv4_members() {
    under_a_search_list([127, 0, 0, 88], 1, HOST, HOST, Kept).await;
}

/// The same for a name with fewer dots than `ndots` (Kubernetes'
/// `my-svc.my-ns` under `ndots:5`), asked in its search forms first: the
/// form that holds its records failing (SERVFAIL) before the name as
/// written answered empty read as an empty answer, and the AAAA address
/// took the member's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_form_failing_before_an_empty_one_keeps_the_ipv4_members() {
    let form = "app.baton.test.example.test";
    under_a_search_list([127, 0, 0, 89], 3, form, form, Kept).await;
}

/// A search form whose name server fails (SERVFAIL) does not hide a
/// later form's answer (glibc's `res_search` goes on too): a search
/// domain that is broken for good does not keep a name from resolving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_search_form_does_not_hide_a_later_forms_answer() {
    let form = "app.baton.test.example.test";
    under_a_search_list([127, 0, 0, 90], 3, HOST, form, Answered).await;
}

/// What the members are once a name's form fails.
#[derive(Clone, Copy, PartialEq)]
enum AfterTheFailure {
    /// The last good set, still there after a dozen queries.
    Kept,
    /// The answer of a form that answers, from the start.
    Answered,
}
use AfterTheFailure::{Answered, Kept};

/// Runs baton under [`search_listed`] (`search example.test`) with
/// `HOST`'s A (127.0.0.2) and
/// AAAA (::1) records held by `holder` (one of its forms); makes A
/// queries for `failing` get SERVFAIL, and asserts the IPv4 member is
/// there a dozen queries on.
async fn under_a_search_list(
    server: [u8; 4],
    ndots: u8,
    holder: &str,
    failing: &str,
    after: AfterTheFailure,
) {
    let Some(listed) = search_listed(server, ndots, "example.test").await else {
        return;
    };
    let dns = &listed.dns;
    let backend = HttpBackend::start_on("a", "127.0.0.2:0".parse().expect("addr")).await;
    let port = backend.addr.port();
    dns.set_a(holder, &[Ipv4Addr::new(127, 0, 0, 2)]);
    dns.set_aaaa(holder, &[Ipv6Addr::LOCALHOST]);
    if after == Answered {
        dns.servfail_a_of(failing);
    }
    let baton = listed.baton(port).await;
    let ipv4 = [(SocketAddr::from(([127, 0, 0, 2], port)).to_string(), "up")];
    wait_members(baton.admin, &ipv4).await;
    dns.servfail_a_of(failing);
    dns.more_queries(12).await;
    assert_eq!(
        members(baton.admin).await,
        [(ipv4[0].0.clone(), "up".to_string())],
        "{}",
        baton.log()
    );
}

/// An IPv6-only name (no A record where it lives) beside a search form
/// whose A query fails (SERVFAIL) stands for its AAAA addresses: AAAA is
/// asked of the forms that exist without an A record. Asked of none, a
/// search domain broken for good left the name without members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_only_name_beside_a_failing_search_form_has_its_aaaa_members() {
    let Some(listed) = search_listed([127, 0, 0, 91], 3, "example.test").await else {
        return;
    };
    listed.dns.set_aaaa(HOST, &[Ipv6Addr::LOCALHOST]);
    listed.dns.servfail_a_of("app.baton.test.example.test");
    let baton = listed.baton(8080).await;
    wait_members(baton.admin, &[("[::1]:8080".to_string(), "up")]).await;
}

/// A search form whose queries are never answered (a search domain
/// forwarded to an upstream that is down) does not hide the name as
/// written: after a search form's timeout the name as written is still
/// asked, as glibc asks it (hickory's own walk went on to every form).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_form_never_answered_does_not_hide_the_name_as_written() {
    let Some(listed) = search_listed([127, 0, 0, 92], 3, "example.test").await else {
        return;
    };
    let backend = HttpBackend::start_on("a", "127.0.0.2:0".parse().expect("addr")).await;
    let port = backend.addr.port();
    listed.dns.set_a(HOST, &[Ipv4Addr::new(127, 0, 0, 2)]);
    listed.dns.silent_to("app.baton.test.example.test");
    let baton = listed.baton(port).await;
    let ipv4 = SocketAddr::from(([127, 0, 0, 2], port)).to_string();
    wait_members(baton.admin, &[(ipv4, "up")]).await;
}

/// A timeout of the name as written, asked first (it has at least
/// `ndots` dots), goes on to the search forms, as glibc does: a
/// top-level domain forwarded to a dead upstream does not hide a name
/// that lives under a search domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_of_the_name_as_written_goes_on_to_the_search_forms() {
    let Some(listed) = search_listed([127, 0, 0, 94], 1, "example.test").await else {
        return;
    };
    let backend = HttpBackend::start_on("a", "127.0.0.2:0".parse().expect("addr")).await;
    let port = backend.addr.port();
    listed.dns.silent_to(HOST);
    let form = format!("{HOST}.example.test");
    listed.dns.set_a(&form, &[Ipv4Addr::new(127, 0, 0, 2)]);
    let baton = listed.baton(port).await;
    let ipv4 = SocketAddr::from(([127, 0, 0, 2], port)).to_string();
    wait_members(baton.admin, &[(ipv4, "up")]).await;
}

/// A timeout of the form that holds the name's records (one lost
/// packet) keeps the last good set: the walk goes on to the name as
/// written alone, not to a form further down the search list, whose
/// records (a wildcard, another service) would have taken the members'
/// place for an interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_does_not_hand_the_name_to_a_later_search_form() {
    let Some(listed) = search_listed([127, 0, 0, 93], 3, "one.test two.test").await else {
        return;
    };
    let dns = &listed.dns;
    let backend = HttpBackend::start_on("a", "127.0.0.2:0".parse().expect("addr")).await;
    let port = backend.addr.port();
    let holder = format!("{HOST}.one.test");
    dns.set_a(&holder, &[Ipv4Addr::new(127, 0, 0, 2)]);
    let baton = listed.baton(port).await;
    let kept = [(SocketAddr::from(([127, 0, 0, 2], port)).to_string(), "up")];
    wait_members(baton.admin, &kept).await;
    dns.set_a(&format!("{HOST}.two.test"), &[Ipv4Addr::new(127, 0, 0, 3)]);
    dns.silent_to(&holder);
    dns.more_queries(9).await;
    assert_eq!(
        members(baton.admin).await,
        [(kept[0].0.clone(), "up".to_string())],
        "{}",
        baton.log()
    );
}

/// A resolv.conf naming a name server on port 53 of `server` (one a
/// test: they run at once), a `search` list and `ndots`, to bind over
/// the system's for baton alone, and that name server.
struct SearchListed {
    dns: DnsServer,
    wrapper: Vec<String>,
    _dir: tempfile::TempDir,
}

/// `None` (the test skips) where the file cannot be bound over the
/// system's (see [`resolv_conf_bound_over`]).
async fn search_listed(server: [u8; 4], ndots: u8, search: &str) -> Option<SearchListed> {
    let server = SocketAddr::from((server, 53));
    let resolv = format!(
        "nameserver {}\nsearch {search}\noptions ndots:{ndots}\n",
        server.ip()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("resolv.conf");
    std::fs::write(&file, resolv).expect("write resolv.conf");
    let wrapper = resolv_conf_bound_over(&file.display().to_string())?;
    Some(SearchListed {
        dns: DnsServer::start_on(server).await,
        wrapper,
        _dir: dir,
    })
}

impl SearchListed {
    /// baton under the file, its pool "app" `HOST` at `port` (resolved
    /// every 200 ms), once its admin port answers.
    async fn baton(&self, port: u16) -> Baton {
        let spec = Spec::new()
            .section(&format!(
                "[resolver]\ntimeout = \"500ms\"\n\n[[pools]]\nname = \"app\"\nresolve_interval = \"200ms\"\nbackends = [{{ name = \"app\", address = \"{HOST}:{port}\" }}]\n"
            ))
            .http("web", "app");
        let wrapper: Vec<&str> = self.wrapper.iter().map(String::as_str).collect();
        let baton = Baton::spawn_under(spec, &[], &wrapper);
        support::eventually("the admin port answers", || async {
            client::get(baton.admin, "/healthz").await.is_ok()
        })
        .await;
        baton
    }
}

/// A wrapper command that runs baton with `file` bound over
/// `/etc/resolv.conf` in a mount namespace of its own; `None` (the test
/// skips) where that cannot be done: not root, no mount namespaces, no
/// resolv.conf to bind over. Under `CI` it must be possible.
fn resolv_conf_bound_over(file: &str) -> Option<Vec<String>> {
    let namespace = ["unshare", "--mount", "--propagation", "private"];
    let probe = [
        &namespace[..],
        &["mount", "--bind", file, "/etc/resolv.conf"],
    ]
    .concat();
    let needs = "root, a mount namespace and an /etc/resolv.conf to bind over";
    if !support::possible_or_skipped(&probe, needs) {
        return None;
    }
    // The file is the script's `$0`; baton and its arguments, `$@`.
    let bind = "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"".to_string();
    let mut wrapper: Vec<String> = namespace.iter().map(|s| s.to_string()).collect();
    wrapper.extend(["sh".into(), "-c".into(), bind, file.to_string()]);
    Some(wrapper)
}
