//! Looking up backends named by DNS. hickory-resolver rather than the
//! system resolver on a blocking thread: `getaddrinfo` gives neither TTLs
//! (re-resolution follows them) nor SRV records, takes a thread per
//! lookup, and cannot be pointed at another name server (the tests run
//! their own). Its cache is off: baton re-resolves on its own clock and
//! keeps the last good answer itself, and a cached failure or answer would
//! only hide what the name server says now.

pub mod refresh;
mod search;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig as Servers};
use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::rdata::SRV;
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use hickory_resolver::TokioResolver;

use crate::backend::members::Resolved;
use crate::backend::named::Named;
use crate::config::{DnsQuery, ResolverConfig};
use search::{Forms, SearchList};

/// The resolver could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot use the system's resolver configuration (/etc/resolv.conf): {0}")]
    System(NetError),
    #[error("cannot build the resolver: {0}")]
    Build(NetError),
}

/// Why a resolution gave no set (the last good one stays; for `Empty`,
/// for the pool's hold).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("no records ({0})")]
    Empty(String),
    #[error("{0}")]
    Failed(String),
}

impl Failure {
    /// The `result` label of `baton_dns_resolutions_total`.
    pub fn result(&self) -> &'static str {
        match self {
            Failure::Timeout(_) => "timeout",
            Failure::Empty(_) => "empty",
            Failure::Failed(_) => "error",
        }
    }
}

/// How soon a name (or an SRV target) DNS has not yet answered for is
/// asked again (HAProxy's resolvers retry after `timeout retry`, 1 s by
/// default).
pub const ASK_AGAIN_SOON: Duration = Duration::from_secs(1);

/// What asking a name's forms for one record type found.
enum Walked {
    /// The answer of the first form holding such records.
    Found(Lookup),
    /// No form holds any: those that exist without them (NOERROR, no
    /// records), and the first failure, if a form failed.
    Missing {
        existing: Vec<Name>,
        failed: Option<Failure>,
    },
}

impl Walked {
    /// The answer found, else the failure, else no records (`none` says
    /// of what).
    fn found(self, none: impl FnOnce() -> String) -> Result<Lookup, Failure> {
        match self {
            Walked::Found(lookup) => Ok(lookup),
            Walked::Missing {
                failed: Some(failed),
                ..
            } => Err(failed),
            Walked::Missing { failed: None, .. } => Err(Failure::Empty(none())),
        }
    }
}

/// A good answer: every address, and how long the records hold.
#[derive(Debug)]
pub struct Answer {
    pub resolved: Vec<Resolved>,
    pub valid_for: Duration,
    /// Some of its lookups failed (an SRV target's): their part is the
    /// last good answer's.
    pub partly_failed: Option<Failure>,
}

/// Cheap to clone: clones share the name server connections.
#[derive(Clone)]
pub struct Resolver {
    /// Set up at the first resolution that finds it missing: one that
    /// cannot be (no /etc/resolv.conf, or none naming a server, as while a
    /// network manager brings the network up at boot) fails that
    /// resolution, as a name server that does not answer would, and the
    /// next one tries again. Failing the start instead took every pool
    /// down, those of addresses too, and a reload failed.
    asking: std::sync::Arc<std::sync::Mutex<Option<Asking>>>,
    config: ResolverConfig,
    /// How long one query waits.
    pub timeout: Duration,
}

/// Whom names are asked of, and in which forms.
#[derive(Clone)]
struct Asking {
    /// Asked one fully qualified name and one record type at a time.
    resolver: TokioResolver,
    /// Each name server alone, in order (none with one server): asked in
    /// turn after the servers together answered with a failure.
    one_by_one: Vec<TokioResolver>,
    search: SearchList,
}

impl Asking {
    /// `name`'s `kind` records, asked of the name servers together
    /// (hickory asks two at once and takes the first answer). An answer of
    /// failure (SERVFAIL: a forwarder whose own upstream is down; REFUSED:
    /// a server that serves other clients; NOTIMP) ends hickory's lookup
    /// with it, the other servers unasked: each server is then asked alone,
    /// all at once, and the first other answer taken, as glibc moves on to
    /// the next server (HAProxy waits for every server's). At once, so the
    /// second pass costs one `timeout` at most, whatever the servers.
    async fn lookup(&self, name: Name, kind: RecordType) -> Result<Lookup, NetError> {
        let together = self.resolver.lookup(name.clone(), kind).await;
        if !failed_answer(&together) || self.one_by_one.is_empty() {
            return together;
        }
        let mut alone = tokio::task::JoinSet::new();
        for server in &self.one_by_one {
            let (server, name) = (server.clone(), name.clone());
            alone.spawn(async move { server.lookup(name, kind).await });
        }
        while let Some(joined) = alone.join_next().await {
            let Ok(answer) = joined else { continue };
            let answered = match &answer {
                Ok(_) => true,
                Err(err) => matches!(err, NetError::Dns(DnsError::NoRecordsFound(_))),
            };
            if answered {
                return answer;
            }
        }
        together
    }
}

/// Whether a lookup ended at a server's answer of failure (SERVFAIL,
/// REFUSED, NOTIMP), which another server may not give.
fn failed_answer(answer: &Result<Lookup, NetError>) -> bool {
    matches!(
        answer,
        Err(NetError::Dns(DnsError::ResponseCode(
            ResponseCode::ServFail | ResponseCode::Refused | ResponseCode::NotImp
        )))
    )
}

impl Resolver {
    /// A resolver on `config`'s name servers, or /etc/resolv.conf's (read
    /// when first needed, and again after it could not be).
    pub fn new(config: &ResolverConfig) -> Resolver {
        Resolver {
            asking: std::sync::Arc::default(),
            config: config.clone(),
            timeout: config.timeout,
        }
    }

    /// The resolver and search list, set up now if they are not yet.
    fn asking(&self) -> Result<Asking, Failure> {
        let mut asking = self
            .asking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(set_up) = asking.as_ref() {
            return Ok(set_up.clone());
        }
        let resolver = Resolver::build(&self.config).map_err(|e| Failure::Failed(e.to_string()))?;
        let search = if self.config.nameservers.is_empty() {
            SearchList::system()
        } else {
            SearchList::default()
        };
        let one_by_one = Resolver::each_alone(&self.config);
        let set_up = Asking {
            resolver,
            one_by_one,
            search,
        };
        *asking = Some(set_up.clone());
        Ok(set_up)
    }

    fn build(config: &ResolverConfig) -> Result<TokioResolver, SetupError> {
        let builder = if config.nameservers.is_empty() {
            TokioResolver::builder_tokio().map_err(SetupError::System)?
        } else {
            let servers = config.nameservers.iter().map(|addr| name_server(*addr));
            TokioResolver::builder_with_config(
                Servers::from_name_servers(servers.collect()),
                TokioRuntimeProvider::default(),
            )
        };
        Resolver::finish(builder, config)
    }

    /// A resolver for each name server alone, in order, when there are
    /// several (see `Asking::lookup`); none if resolv.conf cannot be read.
    fn each_alone(config: &ResolverConfig) -> Vec<TokioResolver> {
        let servers: Vec<NameServerConfig> = if config.nameservers.is_empty() {
            match hickory_resolver::system_conf::read_system_conf() {
                Ok((system, _)) => system.name_servers().to_vec(),
                Err(_) => return Vec::new(),
            }
        } else {
            config.nameservers.iter().map(|a| name_server(*a)).collect()
        };
        if servers.len() < 2 {
            return Vec::new();
        }
        servers
            .into_iter()
            .filter_map(|server| {
                let builder = TokioResolver::builder_with_config(
                    Servers::from_name_servers(vec![server]),
                    TokioRuntimeProvider::default(),
                );
                Resolver::finish(builder, config).ok()
            })
            .collect()
    }

    /// Every resolver's options: `[resolver]`'s timeout, one attempt (a
    /// lookup is asked again at the next refresh), and no cache (a TTL is
    /// kept by the refresh itself).
    fn finish(
        mut builder: hickory_resolver::ResolverBuilder<TokioRuntimeProvider>,
        config: &ResolverConfig,
    ) -> Result<TokioResolver, SetupError> {
        let options = builder.options_mut();
        options.timeout = config.timeout;
        options.attempts = 1;
        options.cache_size = 0;
        builder.build().map_err(SetupError::Build)
    }

    /// How long a whole answer for `query` may take when every query in
    /// it answers within `timeout`: a host name's A query in each of its
    /// forms (the search list's), then its AAAA query in each; an SRV
    /// name's query in each form, then its targets' A and AAAA (at once).
    /// A server that answers nothing fails once the first form and the
    /// name as written timed out.
    pub fn answer_within(&self, query: &DnsQuery) -> Duration {
        let asking = self.asking().ok();
        let forms = |name: &str| {
            asking
                .as_ref()
                .and_then(|a| a.search.forms(name).ok())
                .map_or(1, |forms| forms.names.len())
        };
        let queries_in_turn = match query {
            DnsQuery::Host { host, .. } => 2 * forms(host),
            DnsQuery::Srv(name) => forms(name) + 2,
        };
        // A query may be asked twice: of the servers together, then of each
        // alone (see `Asking::lookup`).
        let passes = match asking.is_some_and(|a| !a.one_by_one.is_empty()) {
            true => 2,
            false => 1,
        };
        self.timeout * u32::try_from(queries_in_turn * passes).unwrap_or(u32::MAX)
    }

    /// Every address `named` stands for now.
    pub async fn resolve(&self, named: &Named) -> Result<Answer, Failure> {
        match &named.query {
            DnsQuery::Host { host, port } => {
                let from = named.query.to_string();
                self.host(host, *port, named.weight, &from).await
            }
            DnsQuery::Srv(name) => self.srv(name, named).await,
        }
    }

    async fn host(
        &self,
        host: &str,
        port: u16,
        weight: u32,
        from: &str,
    ) -> Result<Answer, Failure> {
        let (ips, valid_for) = self.addresses(host).await?;
        let mut resolved: Vec<Resolved> = Vec::new();
        for ip in ips {
            let address = SocketAddr::new(ip, port);
            if !resolved.iter().any(|r| r.address == address) {
                resolved.push(Resolved {
                    address,
                    weight,
                    from: from.to_string(),
                });
            }
        }
        Ok(Answer {
            resolved,
            valid_for,
            partly_failed: None,
        })
    }

    /// `host`'s A addresses, else (when it has none) its AAAA addresses,
    /// and how long they hold. Asked in turn, not both at once (hickory's
    /// default): a dual-stack name would make its IPv6 addresses members
    /// on a host that may not route them, and an A query that failed while
    /// AAAA answered would have replaced the IPv4 members, where a failure
    /// keeps the last good set. Only an empty A answer moves on to AAAA,
    /// of every form; after a form's failure, of the forms that exist
    /// without an A record (an IPv6-only name beside a search domain
    /// broken for good), and the failure stands if none has AAAA.
    async fn addresses(&self, host: &str) -> Result<(Vec<IpAddr>, Duration), Failure> {
        let asking = self.asking()?;
        let forms = asking.search.forms(host).map_err(Failure::Failed)?;
        let lookup = match self.walk(&asking, &forms, RecordType::A).await {
            Walked::Found(lookup) => lookup,
            Walked::Missing { failed: None, .. } => self
                .walk(&asking, &forms, RecordType::AAAA)
                .await
                .found(|| format!("no A or AAAA records for {host}"))?,
            Walked::Missing {
                failed: Some(failed),
                existing,
            } => match self
                .walk(&asking, &forms.within(existing), RecordType::AAAA)
                .await
            {
                Walked::Found(lookup) => lookup,
                Walked::Missing { .. } => return Err(failed),
            },
        };
        let ips = lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect();
        Ok((ips, until(lookup.valid_until())))
    }

    /// Asks `forms` in turn for records of `kind`, as the system's
    /// resolver asks them (glibc's `res_search`), up to the first that
    /// holds some. An empty answer or no such name goes on to the next
    /// form; so does a SERVFAIL (a search domain broken for good must not
    /// hide the name), and a timeout of a search form to the name as
    /// written alone (one in /etc/hosts, say; a lost packet must not hand
    /// the name to a form further down the list), while one of the name
    /// as written goes on to the search forms. Failures are remembered:
    /// when no form holds records, the name has failed, not answered
    /// empty (a failure keeps the last good set; hickory's own walk
    /// reported the last form's result).
    async fn walk(&self, asking: &Asking, forms: &Forms, kind: RecordType) -> Walked {
        let mut failed = None;
        let mut timed_out = false;
        let mut existing = Vec::new();
        for form in &forms.names {
            if timed_out && *form != forms.as_written {
                continue;
            }
            match asking.lookup(form.clone(), kind).await {
                Ok(lookup)
                    if lookup
                        .answers()
                        .iter()
                        .any(|r| r.data.record_type() == kind) =>
                {
                    return Walked::Found(lookup);
                }
                Ok(_) => existing.push(form.clone()),
                Err(err) => {
                    let exists = matches!(&err, NetError::Dns(DnsError::NoRecordsFound(none))
                        if none.response_code == ResponseCode::NoError);
                    match self.failure(err) {
                        Failure::Empty(_) if exists => existing.push(form.clone()),
                        Failure::Empty(_) => {}
                        Failure::Failed(why) => {
                            failed = failed.or(Some(Failure::Failed(format!("{form}: {why}"))));
                        }
                        timeout => {
                            // As glibc: a timeout in the search list ends
                            // it; one of the name as written (asked first)
                            // does not.
                            timed_out |= *form != forms.as_written;
                            failed = failed.or(Some(timeout));
                        }
                    }
                }
            }
        }
        Walked::Missing { existing, failed }
    }

    /// One member per address of each target of the SRV records of the
    /// lowest priority (higher ones are fallbacks baton does not use). A
    /// target whose lookup failed keeps its addresses of `named`'s last
    /// good answer (copied only then): the others are followed, where a
    /// whole answer failed and none was (nor served at a first start);
    /// with every target failed, the answer has.
    async fn srv(&self, name: &str, named: &Named) -> Result<Answer, Failure> {
        let asking = self.asking()?;
        let forms = asking.search.forms(name).map_err(Failure::Failed)?;
        let lookup = self
            .walk(&asking, &forms, RecordType::SRV)
            .await
            .found(|| format!("no SRV records for {name}"))?;
        let records: Vec<_> = lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(srv) => Some(srv.clone()),
                _ => None,
            })
            .collect();
        let Some(lowest) = records.iter().map(|s| s.priority).min() else {
            return Err(Failure::Empty(format!("no SRV records for {name}")));
        };
        let lowest: Vec<&SRV> = records.iter().filter(|s| s.priority == lowest).collect();
        // RFC 2782: a target of "." says the service is decidedly not
        // available at this name; it has no address to look up.
        if lowest.iter().all(|s| s.target.is_root()) {
            return Err(Failure::Empty(format!(
                "the SRV records of {name} say the service is not available there (target \".\")"
            )));
        }
        // A record of port 0 names nothing to connect to (a static
        // backend's port 0 is refused): its member would fail every
        // request its weight gave it.
        let lowest: Vec<&SRV> = lowest.into_iter().filter(|s| s.port != 0).collect();
        if lowest.is_empty() {
            return Err(Failure::Empty(format!(
                "the SRV records of {name} give port 0, where nothing can be reached"
            )));
        }
        let addresses = self.targets(&lowest, lookup.additionals()).await?;
        let mut valid_for = until(lookup.valid_until());
        let mut resolved: Vec<Resolved> = Vec::new();
        let (mut failed, mut answered) = (None, false);
        let mut last: Option<Vec<Resolved>> = None;
        for (srv, looked_up) in lowest.iter().zip(addresses) {
            let target = srv.target.to_string();
            let from = format!("{}:{}", target.trim_end_matches('.'), srv.port);
            let ips = match looked_up {
                Ok((ips, held)) => {
                    answered = true;
                    valid_for = valid_for.min(held);
                    ips
                }
                Err(failure) => {
                    failed = failed.or(Some(failure));
                    let kept: Vec<IpAddr> = last
                        .get_or_insert_with(|| named.last().unwrap_or_default())
                        .iter()
                        .filter(|r| r.from == from)
                        .map(|r| r.address.ip())
                        .collect();
                    if kept.is_empty() {
                        // Nothing known of it (a first start, a new
                        // target): asked again soon, as a name that
                        // never answered is, not a whole interval on.
                        valid_for = valid_for.min(ASK_AGAIN_SOON);
                    }
                    kept
                }
            };
            for ip in ips {
                let address = SocketAddr::new(ip, srv.port);
                if !resolved.iter().any(|r| r.address == address) {
                    resolved.push(Resolved {
                        address,
                        weight: u32::from(srv.weight).max(1),
                        from: from.clone(),
                    });
                }
            }
        }
        if let Some(failure) = failed.take_if(|_| !answered || resolved.is_empty()) {
            return Err(failure);
        }
        if resolved.is_empty() {
            return Err(Failure::Empty(format!(
                "no address for the targets of {name}"
            )));
        }
        Ok(Answer {
            resolved,
            valid_for,
            partly_failed: failed,
        })
    }

    /// The addresses of `records`' targets, in their order: those the
    /// answer's additional records give, the others looked up all at once
    /// (one after another, they would take a query's time each, two for a
    /// name with AAAA alone: more than a first start waits). A target
    /// without addresses adds none (nor does ".", RFC 2782's "not
    /// available", which is not looked up); any other failure is that
    /// target's. Fails whole only when a lookup's task could not end.
    async fn targets(
        &self,
        records: &[&SRV],
        additionals: &[Record],
    ) -> Result<Vec<Result<(Vec<IpAddr>, Duration), Failure>>, Failure> {
        let mut found = Vec::with_capacity(records.len());
        let mut asked = tokio::task::JoinSet::new();
        for (i, srv) in records.iter().enumerate() {
            if srv.target.is_root() {
                found.push(Ok((Vec::new(), Duration::MAX)));
                continue;
            }
            let target = srv.target.to_string();
            let given = given(&target, additionals);
            if given.is_empty() {
                let resolver = self.clone();
                asked.spawn(async move { (i, resolver.addresses(&target).await) });
            }
            found.push(Ok((given, Duration::MAX)));
        }
        while let Some(joined) = asked.join_next().await {
            let (i, looked_up) =
                joined.map_err(|e| Failure::Failed(format!("an SRV target's lookup: {e}")))?;
            match looked_up {
                Err(Failure::Empty(_)) => {}
                looked_up => found[i] = looked_up,
            }
        }
        Ok(found)
    }

    fn failure(&self, err: NetError) -> Failure {
        match &err {
            NetError::Timeout => Failure::Timeout(self.timeout),
            NetError::Dns(DnsError::NoRecordsFound(none))
                if matches!(
                    none.response_code,
                    ResponseCode::NoError | ResponseCode::NXDomain
                ) =>
            {
                Failure::Empty(err.to_string())
            }
            _ => Failure::Failed(err.to_string()),
        }
    }
}

/// A configured name server, asked over UDP, then TCP for an answer too
/// large for a datagram.
fn name_server(addr: SocketAddr) -> NameServerConfig {
    let mut udp = ConnectionConfig::udp();
    udp.port = addr.port();
    let mut tcp = ConnectionConfig::tcp();
    tcp.port = addr.port();
    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
}

/// `target`'s addresses among an SRV answer's additional records: its A
/// ones, else its AAAA ones, as for a looked-up name (Consul sends both).
fn given(target: &str, additionals: &[Record]) -> Vec<IpAddr> {
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = additionals
        .iter()
        .filter(|r| r.name.to_string() == target)
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .partition(IpAddr::is_ipv4);
    if v4.is_empty() {
        v6
    } else {
        v4
    }
}

/// Time left until `deadline` (zero once past).
fn until(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
