//! A small DNS server on 127.0.0.1 (UDP) whose answers a test changes
//! while baton runs: A and AAAA records, SRV records (with their targets'
//! A and AAAA records as additionals, or without, as many recursive
//! resolvers answer), SERVFAIL (to every query or to A queries only),
//! silence (the resolver times out; to every query or one name's), empty NOERROR answers, and answers
//! that take a while. Messages are built and parsed with hickory-proto.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// How the server answers every query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// From its records (NOERROR, empty when it has none of that type).
    Answer,
    /// SERVFAIL to everything.
    ServFail,
    /// SERVFAIL to A queries, the rest answered from the records.
    ServFailA,
    /// No answer at all.
    Silent,
    /// NOERROR with no records, whatever it holds.
    Empty,
}

/// One SRV record: priority, weight, port, target.
pub type SrvRecord = (u16, u16, u16, &'static str);

struct Zone {
    mode: Mode,
    ttl: u32,
    /// How long each answer takes (each on its own: queries at once are
    /// answered at once).
    delay: Duration,
    /// Whether an SRV answer carries its targets' addresses.
    additionals: bool,
    /// A name whose A queries get SERVFAIL (the rest answered).
    servfail_a_of: Option<String>,
    /// A name whose queries get no answer at all (the rest answered).
    silent_to: Option<String>,
    a: HashMap<String, Vec<Ipv4Addr>>,
    aaaa: HashMap<String, Vec<Ipv6Addr>>,
    srv: HashMap<String, Vec<SrvRecord>>,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    /// Queries received, answered or not.
    queries: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `App1.Test.` → `app1.test`: how names are keyed here.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsServer {
    pub async fn start() -> DnsServer {
        DnsServer::start_on("127.0.0.1:0".parse().expect("address")).await
    }

    /// One at `addr` (port 53 of a loopback address, for a resolv.conf).
    pub async fn start_on(addr: std::net::SocketAddr) -> DnsServer {
        let socket = UdpSocket::bind(addr).await.expect("bind dns");
        let addr = socket.local_addr().expect("dns addr");
        let zone = Arc::new(Mutex::new(Zone {
            mode: Mode::Answer,
            ttl: 1,
            delay: Duration::ZERO,
            additionals: true,
            servfail_a_of: None,
            silent_to: None,
            a: HashMap::new(),
            aaaa: HashMap::new(),
            srv: HashMap::new(),
        }));
        let queries = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        tokio::spawn(serve(
            Arc::new(socket),
            Arc::clone(&zone),
            Arc::clone(&queries),
            stop.clone(),
        ));
        DnsServer {
            addr,
            zone,
            queries,
            stop,
        }
    }

    fn edit(&self, change: impl FnOnce(&mut Zone)) {
        change(&mut self.zone.lock().expect("zone"));
    }

    pub fn set_a(&self, name: &str, ips: &[Ipv4Addr]) {
        self.edit(|z| {
            z.a.insert(key(name), ips.to_vec());
        });
    }

    pub fn set_aaaa(&self, name: &str, ips: &[Ipv6Addr]) {
        self.edit(|z| {
            z.aaaa.insert(key(name), ips.to_vec());
        });
    }

    pub fn set_srv(&self, name: &str, records: &[SrvRecord]) {
        self.edit(|z| {
            z.srv.insert(key(name), records.to_vec());
        });
    }

    pub fn set_mode(&self, mode: Mode) {
        self.edit(|z| z.mode = mode);
    }

    /// A queries for `name` alone get SERVFAIL from now on (its other
    /// forms, under a search list, are answered).
    pub fn servfail_a_of(&self, name: &str) {
        self.edit(|z| z.servfail_a_of = Some(key(name)));
    }

    /// Queries for `name` get no answer from now on (the others do).
    pub fn silent_to(&self, name: &str) {
        self.edit(|z| z.silent_to = Some(key(name)));
    }

    /// Records answered from now on hold for `ttl` seconds (1 until set).
    pub fn set_ttl(&self, ttl: u32) {
        self.edit(|z| z.ttl = ttl);
    }

    /// Every answer from now on comes `delay` after its query.
    pub fn set_delay(&self, delay: Duration) {
        self.edit(|z| z.delay = delay);
    }

    /// SRV answers from now on leave their targets' addresses out: the
    /// resolver asks for each target.
    pub fn leave_out_additionals(&self) {
        self.edit(|z| z.additionals = false);
    }

    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    /// Waits until `n` more queries have come in (the resolver tried `n`
    /// more times), bounded like every wait.
    pub async fn more_queries(&self, n: u64) {
        let target = self.queries() + n;
        super::eventually(&format!("{n} more DNS queries"), || async move {
            self.queries() >= target
        })
        .await;
    }
}

async fn serve(
    socket: Arc<UdpSocket>,
    zone: Arc<Mutex<Zone>>,
    queries: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = tokio::select! {
            () = stop.cancelled() => return,
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        queries.fetch_add(1, Ordering::Relaxed);
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let (reply, delay) = match zone.lock() {
            Ok(z) => (answer(&z, &query), z.delay),
            Err(_) => (None, Duration::ZERO),
        };
        let Some(bytes) = reply.and_then(|m| m.to_vec().ok()) else {
            continue;
        };
        if delay.is_zero() {
            let _ = socket.send_to(&bytes, peer).await;
        } else {
            let socket = Arc::clone(&socket);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = socket.send_to(&bytes, peer).await;
            });
        }
    }
}

/// The reply to `query` as the zone stands, or `None` to stay silent.
fn answer(zone: &Zone, query: &Message) -> Option<Message> {
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_queries(query.queries.iter().cloned());
    match zone.mode {
        Mode::Silent => return None,
        Mode::ServFail => {
            reply.metadata.response_code = ResponseCode::ServFail;
            return Some(reply);
        }
        Mode::Empty => return Some(reply),
        Mode::Answer | Mode::ServFailA => {}
    }
    let Some(q) = query.queries.first() else {
        return Some(reply);
    };
    let name = key(&q.name().to_string());
    if zone.silent_to.as_deref() == Some(&name) {
        return None;
    }
    let failing_a = zone.mode == Mode::ServFailA || zone.servfail_a_of.as_deref() == Some(&name);
    if failing_a && q.query_type() == RecordType::A {
        reply.metadata.response_code = ResponseCode::ServFail;
        return Some(reply);
    }
    match q.query_type() {
        RecordType::A => {
            for ip in zone.a.get(&name).into_iter().flatten() {
                reply.add_answer(Record::from_rdata(
                    q.name().clone(),
                    zone.ttl,
                    RData::A(A(*ip)),
                ));
            }
        }
        RecordType::AAAA => {
            for ip in zone.aaaa.get(&name).into_iter().flatten() {
                reply.add_answer(Record::from_rdata(
                    q.name().clone(),
                    zone.ttl,
                    RData::AAAA(AAAA(*ip)),
                ));
            }
        }
        RecordType::SRV => {
            for &(priority, weight, port, target) in zone.srv.get(&name).into_iter().flatten() {
                // Made fully qualified, but for a target of "." (the root).
                let fqdn = match target {
                    "." => ".".to_string(),
                    name => format!("{name}."),
                };
                let target_name = Name::from_str(&fqdn).expect("target name");
                let srv = SRV::new(priority, weight, port, target_name.clone());
                reply.add_answer(Record::from_rdata(
                    q.name().clone(),
                    zone.ttl,
                    RData::SRV(srv),
                ));
                if !zone.additionals {
                    continue;
                }
                for ip in zone.a.get(&key(target)).into_iter().flatten() {
                    reply.add_additional(Record::from_rdata(
                        target_name.clone(),
                        zone.ttl,
                        RData::A(A(*ip)),
                    ));
                }
                for ip in zone.aaaa.get(&key(target)).into_iter().flatten() {
                    reply.add_additional(Record::from_rdata(
                        target_name.clone(),
                        zone.ttl,
                        RData::AAAA(AAAA(*ip)),
                    ));
                }
            }
        }
        _ => {}
    }
    Some(reply)
}
