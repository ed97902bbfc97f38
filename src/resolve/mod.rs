//! Looking up backends named by DNS. hickory-resolver rather than the
//! system resolver on a blocking thread: `getaddrinfo` gives neither TTLs
//! (re-resolution follows them) nor SRV records, takes a thread per
//! lookup, and cannot be pointed at another name server (the tests run
//! their own). Its cache is off: baton re-resolves on its own clock and
//! keeps the last good answer itself, and a cached failure or answer would
//! only hide what the name server says now.

pub mod refresh;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig as Servers,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::rdata::SRV;
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use hickory_resolver::TokioResolver;

use crate::backend::members::Resolved;
use crate::backend::named::Named;
use crate::config::{DnsQuery, ResolverConfig};

/// The resolver could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot use the system's resolver configuration (/etc/resolv.conf): {0}")]
    System(NetError),
    #[error("cannot build the resolver: {0}")]
    Build(NetError),
}

/// Why a resolution gave no set (the last good one stays).
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

/// A good answer: every address, and how long the records hold.
#[derive(Debug)]
pub struct Answer {
    pub resolved: Vec<Resolved>,
    pub valid_for: Duration,
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
    families: std::sync::Arc<std::sync::Mutex<Option<Families>>>,
    config: ResolverConfig,
    /// How long one query waits.
    pub timeout: Duration,
}

/// One hickory resolver a family.
#[derive(Clone)]
struct Families {
    /// A records (and SRV).
    ipv4: TokioResolver,
    /// AAAA records, asked only of names without an A address: a
    /// resolver of its own, as hickory's address family is a resolver's
    /// option (its `lookup_ip` is what reads /etc/hosts for every name of
    /// the search list, and an IP literal).
    ipv6: TokioResolver,
    /// The system's `ndots`, when /etc/resolv.conf gives a search list
    /// (or a domain): a name with more dots is tried as written first,
    /// then in its search forms (see [`Resolver::a_of_the_name_itself`]).
    searched_past: Option<usize>,
}

impl Resolver {
    /// A resolver on `config`'s name servers, or /etc/resolv.conf's (read
    /// when first needed, and again after it could not be).
    pub fn new(config: &ResolverConfig) -> Resolver {
        Resolver {
            families: std::sync::Arc::default(),
            config: config.clone(),
            timeout: config.timeout,
        }
    }

    /// The resolvers, set up now if they are not yet.
    fn families(&self) -> Result<Families, Failure> {
        let mut families = self
            .families
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(set_up) = families.as_ref() {
            return Ok(set_up.clone());
        }
        let family = |strategy| {
            Resolver::asking(&self.config, strategy).map_err(|e| Failure::Failed(e.to_string()))
        };
        let set_up = Families {
            ipv4: family(LookupIpStrategy::Ipv4Only)?,
            ipv6: family(LookupIpStrategy::Ipv6Only)?,
            searched_past: self.searched_past(),
        };
        *families = Some(set_up.clone());
        Ok(set_up)
    }

    /// The system's `ndots` when its resolv.conf searches (none with the
    /// config's own `nameservers`, which search nothing).
    fn searched_past(&self) -> Option<usize> {
        if !self.config.nameservers.is_empty() {
            return None;
        }
        let (servers, options) = hickory_resolver::system_conf::read_system_conf().ok()?;
        (servers.domain().is_some() || !servers.search().is_empty()).then_some(options.ndots)
    }

    /// A hickory resolver for one address family (`strategy`).
    fn asking(
        config: &ResolverConfig,
        strategy: LookupIpStrategy,
    ) -> Result<TokioResolver, SetupError> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if config.nameservers.is_empty() {
            TokioResolver::builder_tokio().map_err(SetupError::System)?
        } else {
            let servers = config.nameservers.iter().map(|addr| {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
            });
            TokioResolver::builder_with_config(
                Servers::from_name_servers(servers.collect()),
                provider,
            )
        };
        let options = builder.options_mut();
        options.timeout = config.timeout;
        options.attempts = 1;
        options.cache_size = 0;
        options.ip_strategy = strategy;
        builder.build().map_err(SetupError::Build)
    }

    /// How long a whole answer for `query` may take when every query in
    /// it answers within `timeout`: a name's A query, then (under a search
    /// list) A of the name alone, then AAAA when it has no A address;
    /// SRV's query first, then its targets' (at once).
    /// A server that answers nothing fails at its first query's timeout.
    pub fn answer_within(&self, query: &DnsQuery) -> Duration {
        // A host: A, A of the name alone (`a_of_the_name_itself`), AAAA;
        // SRV: its query, then its targets' A and AAAA.
        let queries_in_turn = match query {
            DnsQuery::Host { .. } | DnsQuery::Srv(_) => 3,
        };
        self.timeout * queries_in_turn
    }

    /// Every address `named` stands for now.
    pub async fn resolve(&self, named: &Named) -> Result<Answer, Failure> {
        match &named.query {
            DnsQuery::Host { host, port } => {
                let from = named.query.to_string();
                self.host(host, *port, named.weight, &from).await
            }
            DnsQuery::Srv(name) => self.srv(name).await,
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
        if resolved.is_empty() {
            return Err(Failure::Empty(format!("no address for {host}")));
        }
        Ok(Answer {
            resolved,
            valid_for,
        })
    }

    /// `host`'s A addresses, else (when it has none) its AAAA addresses,
    /// and how long they hold. Asked in turn, not both at once (hickory's
    /// default): a dual-stack name would make its IPv6 addresses members
    /// on a host that may not route them, and an A query that failed while
    /// AAAA answered would have replaced the IPv4 members, where a failure
    /// keeps the last good set. Only an empty A answer moves on to AAAA.
    async fn addresses(&self, host: &str) -> Result<(Vec<IpAddr>, Duration), Failure> {
        let families = self.families()?;
        match self.family(host, &families.ipv4).await {
            Ok((ips, held)) if !ips.is_empty() => Ok((ips, held)),
            Ok(_) | Err(Failure::Empty(_)) => {
                match self.a_of_the_name_itself(host, &families).await? {
                    Some(found) => Ok(found),
                    None => self.family(host, &families.ipv6).await,
                }
            }
            Err(failed) => Err(failed),
        }
    }

    /// `host`'s A addresses asked of it alone, fully qualified: `None` when
    /// it has none (no records, or no such name). Under a search list
    /// hickory tries a name with more dots than `ndots` as written first,
    /// then its search forms, after any failure, and reports the last one:
    /// an A query that failed for the name itself (a timeout, SERVFAIL)
    /// read as an empty answer, and its AAAA addresses replaced the IPv4
    /// members. Asked only then (after an empty A answer, of such a name):
    /// otherwise the name as written was the last form tried, or the only
    /// one. (A failure of a search form before the last one, for a name
    /// with fewer dots, is still hidden so.)
    async fn a_of_the_name_itself(
        &self,
        host: &str,
        families: &Families,
    ) -> Result<Option<(Vec<IpAddr>, Duration)>, Failure> {
        let dots = host.matches('.').count();
        let tried_first = families.searched_past.is_some_and(|ndots| dots + 1 > ndots);
        if host.ends_with('.') || !tried_first {
            return Ok(None);
        }
        match families
            .ipv4
            .lookup(format!("{host}."), RecordType::A)
            .await
        {
            Ok(lookup) => {
                let ips: Vec<IpAddr> = lookup
                    .answers()
                    .iter()
                    .filter_map(|r| match &r.data {
                        RData::A(a) => Some(IpAddr::V4(a.0)),
                        _ => None,
                    })
                    .collect();
                Ok((!ips.is_empty()).then(|| (ips, until(lookup.valid_until()))))
            }
            Err(err) => match self.failure(err) {
                Failure::Empty(_) => Ok(None),
                failed => Err(failed),
            },
        }
    }

    /// `host`'s addresses of one family (its resolver), and how long they
    /// hold.
    async fn family(
        &self,
        host: &str,
        resolver: &TokioResolver,
    ) -> Result<(Vec<IpAddr>, Duration), Failure> {
        let lookup = resolver
            .lookup_ip(host)
            .await
            .map_err(|e| self.failure(e))?;
        Ok((lookup.iter().collect(), until(lookup.valid_until())))
    }

    /// One member per address of each target of the SRV records of the
    /// lowest priority (higher ones are fallbacks baton does not use).
    async fn srv(&self, name: &str) -> Result<Answer, Failure> {
        let lookup = self
            .families()?
            .ipv4
            .srv_lookup(name)
            .await
            .map_err(|e| self.failure(e))?;
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
        let addresses = self.targets(&lowest, lookup.additionals()).await?;
        let mut valid_for = until(lookup.valid_until());
        let mut resolved: Vec<Resolved> = Vec::new();
        for (srv, (ips, held)) in lowest.iter().zip(addresses) {
            let target = srv.target.to_string();
            let from = format!("{}:{}", target.trim_end_matches('.'), srv.port);
            valid_for = valid_for.min(held);
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
        if resolved.is_empty() {
            return Err(Failure::Empty(format!(
                "no address for the targets of {name}"
            )));
        }
        Ok(Answer {
            resolved,
            valid_for,
        })
    }

    /// The addresses of `records`' targets, in their order: those the
    /// answer's additional records give, the others looked up all at once
    /// (one after another, they would take a query's time each, two for a
    /// name with AAAA alone: more than a first start waits). A target
    /// without addresses adds none (nor does ".", RFC 2782's "not
    /// available", which is not looked up); any other failure fails the whole
    /// answer (half an answer would drain the other half's members), and
    /// the other lookups are dropped with it.
    async fn targets(
        &self,
        records: &[&SRV],
        additionals: &[Record],
    ) -> Result<Vec<(Vec<IpAddr>, Duration)>, Failure> {
        let mut found = Vec::with_capacity(records.len());
        let mut asked = tokio::task::JoinSet::new();
        for (i, srv) in records.iter().enumerate() {
            if srv.target.is_root() {
                found.push((Vec::new(), Duration::MAX));
                continue;
            }
            let target = srv.target.to_string();
            let given = given(&target, additionals);
            if given.is_empty() {
                let resolver = self.clone();
                asked.spawn(async move { (i, resolver.addresses(&target).await) });
            }
            found.push((given, Duration::MAX));
        }
        while let Some(joined) = asked.join_next().await {
            let (i, looked_up) =
                joined.map_err(|e| Failure::Failed(format!("an SRV target's lookup: {e}")))?;
            match looked_up {
                Ok(addresses) => found[i] = addresses,
                Err(Failure::Empty(_)) => {}
                Err(failed) => return Err(failed),
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
