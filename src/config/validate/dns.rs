//! Names for DNS: a backend `address` that is a host name, a pool's `srv`,
//! and `[resolver]`. Only syntax is checked here: whether a name resolves
//! is the running generation's business (DNS may be down at load, and a
//! config must not be refused for that).

use super::*;

/// A backend's `address`: an IP socket address, or a host name to resolve.
pub(super) enum Target {
    Ip(SocketAddr),
    Host { host: String, port: u16 },
}

/// The shortest `resolve_interval`: a shorter one would query a name
/// server many times a second per named backend.
const MIN_RESOLVE_INTERVAL: Duration = Duration::from_millis(100);

impl Validator {
    pub(super) fn resolver(&mut self, raw: &file::ResolverFile) -> ResolverConfig {
        let mut nameservers = Vec::new();
        for (i, text) in raw.nameservers.iter().flatten().enumerate() {
            let with_port = text
                .parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, 53));
            match with_port.or_else(|_| text.parse::<SocketAddr>()) {
                Ok(addr) if addr.port() == 0 => self.problem(
                    &format!("resolver.nameservers[{i}]"),
                    format!("\"{text}\" has port 0, where no name server listens (leave the port out for 53)"),
                ),
                Ok(addr) => nameservers.push(addr),
                Err(_) => self.problem(
                    &format!("resolver.nameservers[{i}]"),
                    format!("\"{text}\" is not an address like \"10.0.0.2\", \"127.0.0.1:5353\" or \"[::1]:53\""),
                ),
            }
        }
        ResolverConfig {
            nameservers,
            timeout: self.timeout(
                "resolver.timeout",
                raw.timeout.as_ref(),
                Duration::from_secs(2),
            ),
        }
    }

    /// A backend `address`: `ip:port`, or `host:port` to resolve.
    pub(super) fn backend_target(&mut self, key: &str, text: &str) -> Target {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            if addr.port() == 0 {
                self.problem(key, format!("\"{text}\": 0 is not a port (1 to 65535)"));
            }
            return Target::Ip(addr);
        }
        match host_port(text) {
            Ok((host, port)) => Target::Host { host, port },
            Err(why) => {
                self.problem(
                    key,
                    format!("\"{text}\" is not an ip:port or host:port: {why}"),
                );
                Target::Ip(SocketAddr::from(([127, 0, 0, 1], 0)))
            }
        }
    }

    /// A pool's `srv`: `_service._proto.name`.
    pub(super) fn srv(&mut self, key: &str, text: &str) -> DnsQuery {
        if let Some(why) = srv_problem(text) {
            self.problem(
                key,
                format!("\"{text}\" is not an SRV name like \"_http._tcp.app.internal\": {why}"),
            );
        }
        DnsQuery::Srv(text.to_string())
    }

    pub(super) fn resolve_interval(
        &mut self,
        key: &str,
        value: Option<&DurationValue>,
    ) -> Duration {
        let interval = self.period(key, value, Duration::from_secs(30));
        if interval < MIN_RESOLVE_INTERVAL {
            self.problem(key, format!("must be at least {MIN_RESOLVE_INTERVAL:?}"));
            return MIN_RESOLVE_INTERVAL;
        }
        interval
    }
}

/// `app1.internal:8080` → (`app1.internal`, 8080), or why not. Names
/// may hold '_' (`my_app`, as Docker's and Compose's service names do:
/// resolvers take them, and nginx and HAProxy do too).
fn host_port(text: &str) -> Result<(String, u16), String> {
    if let Some(why) = not_host_and_port(text) {
        return Err(why);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("the port is missing".into());
    };
    let port = match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(format!("\"{port}\" is not a port (1 to 65535)")),
        Ok(p) => p,
    };
    if let Some(why) = name_problem(host) {
        return Err(why);
    }
    if host
        .trim_end_matches('.')
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "\"{host}\" is neither an IP address nor a host name"
        ));
    }
    Ok((host.to_string(), port))
}

/// The usual ways of writing something other than `host:port`, said
/// plainly: a URL's scheme or path, or an IPv6 address without brackets.
fn not_host_and_port(text: &str) -> Option<String> {
    if let Some((scheme, rest)) = text.split_once("://") {
        return Some(format!(
            "write it without \"{scheme}://\", as host:port (\"{rest}\"); a pool's `tls` says whether baton speaks TLS to it"
        ));
    }
    if text.contains('/') {
        return Some(
            "a backend is host:port, with no path (a route's prefix is not rewritten)".into(),
        );
    }
    if let Some(inside) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return Some(format!("an address needs its port: \"[{inside}]:8080\""));
    }
    if text.matches(':').count() < 2 || text.starts_with('[') {
        return None;
    }
    let (ip, port) = text.rsplit_once(':')?;
    let example = match ip.parse::<std::net::Ipv6Addr>() {
        Ok(ip) => format!("[{ip}]:{port}"),
        Err(_) if text.parse::<std::net::Ipv6Addr>().is_ok() => format!("[{text}]:8080"),
        Err(_) => "[::1]:8080".into(),
    };
    Some(format!(
        "an IPv6 address is written in brackets, then its port: \"{example}\""
    ))
}

/// Why `text` is not an SRV name (`_service._proto.name`), if it is not.
fn srv_problem(text: &str) -> Option<String> {
    let labels: Vec<&str> = text.trim_end_matches('.').split('.').collect();
    if labels.len() < 3 || !labels[0].starts_with('_') || !labels[1].starts_with('_') {
        return Some("it must start with _service._proto and name a domain".into());
    }
    name_problem(text)
}

/// Why `name` is not a DNS name (labels of 1-63 letters, digits, '_'
/// and '-', '-' not at a label's ends; 253 characters at most), if it is
/// not. '_' is taken everywhere: SRV names start with it, requests' Host
/// may hold it, and service names (`my_app`) do.
pub(super) fn name_problem(name: &str) -> Option<String> {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() || bare.len() > 253 {
        return Some("a name is 1 to 253 characters".into());
    }
    for label in bare.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Some(format!("label \"{label}\" must be 1 to 63 characters"));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if !label.chars().all(allowed) || label.starts_with('-') || label.ends_with('-') {
            return Some(format!(
                "label \"{label}\" may hold only letters, digits, '_' and inner '-'"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::tests::problems;
    use super::{host_port, srv_problem};

    #[test]
    fn host_names_need_a_port_and_valid_labels() {
        assert_eq!(
            host_port("app1.internal:8080"),
            Ok(("app1.internal".into(), 8080))
        );
        assert_eq!(
            host_port("app1.internal.:80"),
            Ok(("app1.internal.".into(), 80))
        );
        assert!(host_port("app1.internal").is_err());
        assert!(host_port("app1.internal:0").is_err());
        assert!(host_port("app1..internal:80").is_err());
        assert!(host_port("-app.internal:80").is_err());
        assert_eq!(host_port("my_app:80"), Ok(("my_app".into(), 80)));
        let said = |text: &str| host_port(text).expect_err(text);
        assert!(said("http://app1.internal:80").contains("without \"http://\""));
        assert!(said("app1.internal:80/api").contains("no path"));
        assert!(said("::1:9001").contains("\"[::1]:9001\""));
        assert!(said("fe80::1").contains("\"[fe80::1]:8080\""));
        assert!(said("a:b:c").contains("\"[::1]:8080\""));
        assert!(said("[::1]").contains("needs its port: \"[::1]:8080\""));
        assert!(host_port("300.1.1.1:80").is_err(), "not an IP, not a name");
        assert!(host_port(&format!("{}.internal:80", "a".repeat(64))).is_err());
    }

    #[test]
    fn srv_names_start_with_service_and_proto() {
        assert_eq!(srv_problem("_http._tcp.app.internal"), None);
        assert_eq!(srv_problem("_http._tcp.app.internal."), None);
        assert!(srv_problem("http._tcp.app.internal").is_some());
        assert!(srv_problem("_http._tcp").is_some());
        assert!(srv_problem("_http._tcp.app..internal").is_some());
    }

    const POOL: &str = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\npool = \"app\"\n\n[[pools]]\nname = \"app\"\n";

    #[test]
    fn bad_names_are_refused_naming_the_key() {
        let p = problems(&format!(
            "{POOL}srv = \"http.tcp.app\"\nresolve_interval = \"1ms\"\nbackends = [{{ name = \"a\", address = \"app1.internal\" }}]\n[resolver]\nnameservers = [\"dns.internal\"]\n"
        ));
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(
            p[0].starts_with("resolver.nameservers[0]: \"dns.internal\""),
            "{p:?}"
        );
        assert!(p[1].starts_with("pools[0].srv: \"http.tcp.app\""), "{p:?}");
        assert!(
            p[2].starts_with("pools[0].resolve_interval: must be at least"),
            "{p:?}"
        );
        assert!(
            p[3].starts_with("pools[0].backends[0].address: \"app1.internal\" is not an ip:port or host:port: the port is missing"),
            "{p:?}"
        );
    }

    #[test]
    fn a_pool_with_srv_needs_no_backends() {
        let text = format!("{POOL}srv = \"_http._tcp.app.internal\"\nresolve_interval = \"5s\"\n");
        let c = super::super::super::parse(
            &text,
            std::path::Path::new("x.toml"),
            &super::super::super::Overrides::default(),
        )
        .expect("valid");
        assert!(c.pools[0].backends.is_empty());
        assert_eq!(c.pools[0].named[0].name, "_http._tcp.app.internal");
        assert_eq!(c.pools[0].resolve_interval.as_secs(), 5);
    }
}
