//! `[[pools]]`: names, balance, health checks and backends.

use super::dns::Target;
use super::*;

/// The shortest `health.interval` taken.
const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A `backends` entry, validated.
enum Entry {
    Ip(BackendConfig),
    Named(NamedConfig),
}

impl Validator {
    /// `tcp_only`: the pools only TCP listeners use (their health check
    /// connects unless it says otherwise).
    pub(super) fn pools(
        &mut self,
        raw: &[file::PoolFile],
        tcp_only: &HashSet<String>,
    ) -> Vec<PoolConfig> {
        let mut pools = Vec::new();
        let mut pool_names = HashSet::new();
        let mut backend_names = HashSet::new();
        for (i, p) in raw.iter().enumerate() {
            let key = format!("pools[{i}]");
            let name = self.name(&format!("{key}.name"), p.name.as_deref());
            if !pool_names.insert(name.clone()) {
                self.problem(
                    &format!("{key}.name"),
                    format!("pool \"{name}\" is defined twice"),
                );
            }
            let balance = match p.balance.as_deref() {
                None | Some("round_robin") => Balance::RoundRobin,
                Some("least_conn") => Balance::LeastConn,
                Some("random_two") => Balance::RandomTwo,
                Some(other) => {
                    self.problem(
                        &format!("{key}.balance"),
                        format!("\"{other}\" is not one of round_robin, least_conn, random_two"),
                    );
                    Balance::RoundRobin
                }
            };
            // A `path` (or `host`) written asks for an HTTP check, as it
            // did before the kind followed the listeners.
            let http_written = p
                .health
                .as_ref()
                .is_some_and(|h| h.path.is_some() || h.host.is_some());
            let unset_kind = if tcp_only.contains(&name) && !http_written {
                HealthKind::Tcp
            } else {
                HealthKind::Http
            };
            let health = p
                .health
                .as_ref()
                .map(|h| self.health(&format!("{key}.health"), h, unset_kind));
            let mut named = Vec::new();
            if let Some(text) = p.srv.as_deref() {
                let query = self.srv(&format!("{key}.srv"), text);
                self.unique_backend(&mut backend_names, &format!("{key}.srv"), text);
                named.push(NamedConfig {
                    name: text.to_string(),
                    query,
                    weight: 1,
                });
            }
            let resolve_interval = self.resolve_interval(
                &format!("{key}.resolve_interval"),
                p.resolve_interval.as_ref(),
            );
            if p.backends.is_empty() && p.srv.is_none() {
                self.problem(
                    &format!("{key}.backends"),
                    "needs at least one backend (or srv)",
                );
            }
            let mut backends = Vec::new();
            for (j, b) in p.backends.iter().enumerate() {
                let bkey = format!("{key}.backends[{j}]");
                let entry = self.backend(&bkey, b);
                let name = match &entry {
                    Entry::Ip(b) => &b.name,
                    Entry::Named(n) => &n.name,
                };
                // An address that did not parse stands as 127.0.0.1:0 (its
                // own problem said): no name to hold against another's.
                let unparsed = matches!(&entry, Entry::Ip(b) if b.address.port() == 0);
                if b.name.is_some() {
                    self.unique_backend(&mut backend_names, &format!("{bkey}.name"), name);
                } else if !unparsed && !backend_names.insert(name.clone()) {
                    // Named after its address: the operator wrote no name.
                    self.problem(
                        &format!("{bkey}.address"),
                        format!("\"{name}\" is also another backend's name or unnamed address: backend names are global (the admin API uses them), so give each of the two a name of its own"),
                    );
                }
                match entry {
                    Entry::Ip(b) => backends.push(b),
                    Entry::Named(n) => named.push(n),
                }
            }
            self.unused_pool_keys(&key, p, named.is_empty());
            let tls = self.upstream_tls(&format!("{key}.tls"), p.tls.as_ref());
            let send_proxy = self.send_proxy(&format!("{key}.send_proxy"), p.send_proxy.as_deref());
            pools.push(PoolConfig {
                tls,
                send_proxy,
                name,
                balance,
                health,
                backends,
                named,
                resolve_interval,
                max_connections_per_backend: self.count(
                    &format!("{key}.max_connections_per_backend"),
                    p.max_connections_per_backend,
                    0,
                    0,
                    1_000_000,
                ),
                queue_timeout: self.timeout(
                    &format!("{key}.queue_timeout"),
                    p.queue_timeout.as_ref(),
                    Duration::from_secs(5),
                ),
            });
        }
        pools
    }

    /// Keys that do nothing as the pool is written, each a warning (not
    /// refused: a config that ran must still reload): a `queue_timeout`
    /// with no cap to queue behind, a `resolve_interval` with no name to
    /// resolve.
    fn unused_pool_keys(&mut self, key: &str, p: &file::PoolFile, no_names: bool) {
        let uncapped = p.max_connections_per_backend.is_none_or(|cap| cap.0 == 0);
        if p.queue_timeout.is_some() && uncapped {
            self.warning(
                &format!("{key}.queue_timeout"),
                "does nothing: work waits in line only behind max_connections_per_backend (0 or unset: no cap)",
            );
        }
        if p.resolve_interval.is_some() && no_names {
            self.warning(
                &format!("{key}.resolve_interval"),
                "does nothing: no backend has a host name for its address, and there is no srv",
            );
        }
    }

    /// Backend names are global (the admin API uses them).
    fn unique_backend(&mut self, names: &mut HashSet<String>, key: &str, name: &str) {
        if !names.insert(name.to_string()) {
            self.problem(
                key,
                format!("backend \"{name}\" is defined twice (names are global: the admin API uses them)"),
            );
        }
    }

    /// A backend's own name. Not all digits: the backend API takes a
    /// backend's index or its name in one place (`/backends/{id}`), and
    /// reads digits as an index, so `drain 1` would drain whichever
    /// backend is at index 1, not the one named "1".
    fn backend_name(&mut self, key: &str, name: &str) -> String {
        if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
            self.problem(
                key,
                format!(
                    "\"{name}\" is all digits, which the backend API reads as an index \
                     (/backends/{{id}} takes an index or a name): add a letter"
                ),
            );
            return name.to_string();
        }
        self.name(key, Some(name))
    }

    /// One `backends` entry: an IP backend, or one named by DNS.
    fn backend(&mut self, key: &str, raw: &file::BackendFile) -> Entry {
        let target = match raw.address.as_deref() {
            Some(text) => self.backend_target(&format!("{key}.address"), text),
            None => {
                self.problem(&format!("{key}.address"), "is required");
                Target::Ip(SocketAddr::from(([127, 0, 0, 1], 0)))
            }
        };
        let name = match raw.name.as_deref() {
            Some(n) => self.backend_name(&format!("{key}.name"), n),
            None => raw.address.clone().unwrap_or_default(),
        };
        let weight = self.count(&format!("{key}.weight"), raw.weight, 1, 1, 1000) as u32;
        match target {
            Target::Ip(address) => Entry::Ip(BackendConfig {
                name: if raw.name.is_some() {
                    name
                } else {
                    address.to_string()
                },
                address,
                weight,
            }),
            Target::Host { host, port } => Entry::Named(NamedConfig {
                name,
                query: DnsQuery::Host { host, port },
                weight,
            }),
        }
    }

    /// `unset`: the kind of a check that names none.
    fn health(&mut self, key: &str, raw: &file::HealthFile, unset: HealthKind) -> HealthConfig {
        let kind = match raw.kind.as_deref() {
            None => unset,
            Some("http") => HealthKind::Http,
            Some("tcp") => HealthKind::Tcp,
            Some(other) => {
                self.problem(
                    &format!("{key}.kind"),
                    format!("\"{other}\" is not one of http, tcp"),
                );
                HealthKind::Http
            }
        };
        let path = raw.path.clone().unwrap_or_else(|| "/health".to_string());
        let host = self.check_host(key, raw.host.as_deref(), kind);
        if kind == HealthKind::Tcp {
            if raw.path.is_some() {
                // Taken before: a config that ran must still reload.
                self.warning(
                    &format!("{key}.path"),
                    "does nothing: a tcp check only connects (kind = \"http\" asks the path)",
                );
            }
        } else if !path.starts_with('/') {
            self.problem(
                &format!("{key}.path"),
                format!("\"{path}\" must start with '/'"),
            );
        } else if !path.bytes().all(in_request_target) {
            // Written into the check's request line as it is: a space
            // breaks the line, a CR LF adds fields, and every backend then
            // answers 400 and is taken for down.
            self.problem(
                &format!("{key}.path"),
                format!("{path:?} must be a request target: visible ASCII without '#' (percent-encode the rest, a space as %20)"),
            );
        }
        let interval_key = format!("{key}.interval");
        let interval = self.period(&interval_key, raw.interval.as_ref(), Duration::from_secs(2));
        // Each check is a new connection to every backend, from every
        // generation: "1ms" would be a thousand a second each.
        if interval < MIN_CHECK_INTERVAL {
            self.problem(
                &interval_key,
                format!("must be at least {MIN_CHECK_INTERVAL:?}"),
            );
        }
        let timeout_key = format!("{key}.timeout");
        let timeout = self.timeout(&timeout_key, raw.timeout.as_ref(), Duration::from_secs(1));
        let fall = self.count(&format!("{key}.fall"), raw.fall, 3, 1, 100) as u32;
        // A backend's checks run one after another: one that hangs is
        // asked again `timeout` later than `interval` says.
        if timeout > interval {
            self.warning(
                &timeout_key,
                format!(
                    "{timeout:?} is longer than interval ({interval:?}): a backend that hangs is checked every {:?} and goes down only after {:?} (fall x (interval + timeout))",
                    interval + timeout,
                    (interval + timeout) * fall,
                ),
            );
        }
        HealthConfig {
            kind,
            path,
            host,
            interval,
            timeout,
            rise: self.count(&format!("{key}.rise"), raw.rise, 2, 1, 100) as u32,
            fall,
        }
    }

    /// `health.host`: a name (or address) and an optional port, written
    /// into the check's `Host` field as it is; only an `http` check asks.
    fn check_host(&mut self, key: &str, host: Option<&str>, kind: HealthKind) -> Option<String> {
        let host = host?;
        let key = format!("{key}.host");
        if kind == HealthKind::Tcp {
            self.problem(&key, "is for an http check: a tcp check only connects");
        } else if host.is_empty()
            || host.contains(['/', '?', '#', '@'])
            || ::http::uri::Authority::try_from(host).is_err()
        {
            self.problem(
                &key,
                format!("{host:?} is not a host name, with a port or without (e.g. \"app.example.com\")"),
            );
        }
        Some(host.to_string())
    }

    pub(super) fn pool_ref(
        &mut self,
        key: &str,
        name: Option<&str>,
        pools: &[PoolConfig],
    ) -> usize {
        let Some(name) = name else {
            self.problem(key, "is required");
            return 0;
        };
        if let Some(i) = pools.iter().position(|p| p.name == name) {
            return i;
        }
        let hint = pools
            .iter()
            .map(|p| (strsim::levenshtein(&p.name, name), &p.name))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, n)| format!("; did you mean \"{n}\"?"))
            .unwrap_or_default();
        self.problem(key, format!("no pool named \"{name}\"{hint}"));
        0
    }
}

/// A byte an origin-form request target may hold as written (RFC 9112
/// §3.2.1: no space, no control, no fragment).
pub(super) fn in_request_target(byte: u8) -> bool {
    byte.is_ascii_graphic() && byte != b'#'
}
