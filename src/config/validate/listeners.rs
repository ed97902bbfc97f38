//! `[[listeners]]`: names, addresses, protocols, routes and their limits.

use super::*;

/// Names baton's own sockets go by at a handoff, beside the listeners'.
const RESERVED_NAMES: [&str; 2] = ["admin", "control"];

impl Validator {
    pub(super) fn listeners(
        &mut self,
        raw: &[file::ListenerFile],
        pools: &[PoolConfig],
        admin: Option<SocketAddr>,
    ) -> Vec<ListenerConfig> {
        if raw.is_empty() {
            self.problem("listeners", "at least one [[listeners]] is needed");
        }
        let mut names = HashSet::new();
        let mut binds = HashSet::new();
        let mut out = Vec::new();
        for (i, l) in raw.iter().enumerate() {
            let key = format!("listeners[{i}]");
            let name = self.name(&format!("{key}.name"), l.name.as_deref());
            if !names.insert(name.clone()) {
                self.problem(
                    &format!("{key}.name"),
                    format!("listener \"{name}\" is defined twice"),
                );
            }
            if RESERVED_NAMES.contains(&name.as_str()) {
                self.problem(
                    &format!("{key}.name"),
                    format!("\"{name}\" names baton's own {name} socket (handed over by that name at a reload); choose another"),
                );
            }
            let bind = match l.bind.as_deref() {
                Some(text) => self.socket_addr(&format!("{key}.bind"), text),
                None => {
                    self.problem(&format!("{key}.bind"), "is required");
                    SocketAddr::from(([127, 0, 0, 1], 0))
                }
            };
            if bind.port() != 0 {
                self.bind_free(&key, bind, &mut binds, admin);
            }
            let protocol = match l.protocol.as_deref() {
                None | Some("http") => Protocol::Http,
                Some("tcp") => Protocol::Tcp,
                Some(other) => {
                    self.problem(
                        &format!("{key}.protocol"),
                        format!("\"{other}\" is not one of http, tcp"),
                    );
                    Protocol::Http
                }
            };
            let forwarded = match l.forwarded.as_deref() {
                None | Some("replace") => Forwarded::Replace,
                Some("append") => Forwarded::Append,
                Some("off") => Forwarded::Off,
                Some(other) => {
                    self.problem(
                        &format!("{key}.forwarded"),
                        format!("\"{other}\" is not one of replace, append, off"),
                    );
                    Forwarded::Replace
                }
            };
            if protocol == Protocol::Tcp {
                self.http_only_keys_unused(&key, l);
            }
            let pool = self.pool_ref(&format!("{key}.pool"), l.pool.as_deref(), pools);
            let routes = self.routes(&key, &l.routes, protocol, pools);
            out.push(ListenerConfig {
                name,
                bind,
                protocol,
                pool,
                routes,
                reuseport: self.count(&format!("{key}.reuseport"), l.reuseport, 1, 1, 64),
                backlog: self.count(&format!("{key}.backlog"), l.backlog, 1024, 1, 65535) as i32,
                // Every protocol the HTTP path speaks has its client speak
                // first; TCP mode's may not (SMTP's server greets first).
                defer_accept: l.defer_accept.unwrap_or(protocol == Protocol::Http),
                max_connections: self.count(
                    &format!("{key}.max_connections"),
                    l.max_connections,
                    crate::config::DEFAULT_MAX_CONNECTIONS,
                    1,
                    10_000_000,
                ),
                header_timeout: self.timeout(
                    &format!("{key}.header_timeout"),
                    l.header_timeout.as_ref(),
                    Duration::from_secs(10),
                ),
                idle_timeout: self.timeout(
                    &format!("{key}.idle_timeout"),
                    l.idle_timeout.as_ref(),
                    Duration::from_secs(60),
                ),
                keepalive_drain_grace: self.phase(
                    &format!("{key}.keepalive_drain_grace"),
                    l.keepalive_drain_grace.as_ref(),
                    Duration::from_secs(1),
                ),
                connect_timeout: self.timeout(
                    &format!("{key}.connect_timeout"),
                    l.connect_timeout.as_ref(),
                    Duration::from_secs(2),
                ),
                response_timeout: self.timeout(
                    &format!("{key}.response_timeout"),
                    l.response_timeout.as_ref(),
                    Duration::from_secs(60),
                ),
                forwarded,
                h2_max_concurrent_streams: self.count(
                    &format!("{key}.h2_max_concurrent_streams"),
                    l.h2_max_concurrent_streams,
                    100,
                    1,
                    10_000,
                ) as u32,
                tunnel_timeout: self.timeout(
                    &format!("{key}.tunnel_timeout"),
                    l.tunnel_timeout.as_ref(),
                    Duration::from_secs(3600),
                ),
                body_min_rate: self.body_min_rate(&key, l.body_min_rate, protocol),
                tls: self.tls(&format!("{key}.tls"), l.tls.as_ref(), protocol),
                proxy_protocol: self
                    .proxy_protocol(&format!("{key}.proxy_protocol"), l.proxy_protocol.as_ref()),
                access_log: self.access_log(&format!("{key}.access_log"), l.access_log.as_ref()),
            });
        }
        out
    }

    /// Off unless set; HTTP only (a TCP stream has no body to pace), where
    /// 0, off, is taken anywhere.
    fn body_min_rate(&mut self, key: &str, raw: Option<file::Whole>, protocol: Protocol) -> u64 {
        let key = format!("{key}.body_min_rate");
        if protocol == Protocol::Tcp && raw.is_some_and(|rate| rate.0 != 0) {
            self.problem(&key, "body_min_rate needs protocol = \"http\"");
        }
        self.count(&key, raw, 0, 0, 1 << 30) as u64
    }

    /// `path` is required: `"stdout"`, or a file (relative to the config's
    /// folder) in a folder that exists; it is opened when the generation
    /// starts, so a file baton may not write fails that start, naming it.
    fn access_log(
        &mut self,
        key: &str,
        raw: Option<&file::AccessLogFile>,
    ) -> Option<crate::access_log::Settings> {
        use crate::access_log::{sink::Destination, Format, Settings};
        let raw = raw?;
        let format = match raw.format.as_deref() {
            None | Some("json") => Format::Json,
            Some("combined") => Format::Combined,
            Some(other) => {
                self.problem(
                    &format!("{key}.format"),
                    format!("\"{other}\" is not one of json, combined"),
                );
                Format::Json
            }
        };
        let destination = match raw.path.as_deref() {
            None | Some("") => {
                self.problem(&format!("{key}.path"), "is required: a file, or \"stdout\"");
                return None;
            }
            // As containers' configs write it: opened as a file, it fails
            // where stdout is a socket (under systemd, journald's stream:
            // ENXIO), and baton did not start.
            Some("stdout" | "/dev/stdout" | "/dev/fd/1" | "/proc/self/fd/1") => Destination::Stdout,
            Some(written) => {
                let path = self.path(Some(written), written);
                self.no_nul(&format!("{key}.path"), &path);
                let standard_error = ["stderr", "/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"];
                if standard_error.contains(&written) || written.starts_with("syslog:") {
                    // Taken, as before: a config that ran must still reload.
                    self.warning(
                        &format!("{key}.path"),
                        format!(
                            "is the file {}: access lines go to a file or \"stdout\" (stderr is baton's own log)",
                            path.display()
                        ),
                    );
                }
                if written.ends_with('/') || path.is_dir() {
                    self.problem(
                        &format!("{key}.path"),
                        format!("{} is a folder: name a file in it", path.display()),
                    );
                } else if !folder_of(&path).is_some_and(Path::is_dir) {
                    self.problem(
                        &format!("{key}.path"),
                        format!("the folder of {} does not exist", path.display()),
                    );
                }
                Destination::File(path)
            }
        };
        Some(Settings {
            destination,
            format,
        })
    }

    fn routes(
        &mut self,
        key: &str,
        raw: &[file::RouteFile],
        protocol: Protocol,
        pools: &[PoolConfig],
    ) -> Vec<RouteConfig> {
        if protocol == Protocol::Tcp && !raw.is_empty() {
            self.problem(&format!("{key}.routes"), "routes need protocol = \"http\"");
        }
        let mut out = Vec::new();
        for (j, r) in raw.iter().enumerate() {
            let rkey = format!("{key}.routes[{j}]");
            if r.path_prefix.is_none() && r.host.is_none() {
                self.problem(&rkey, "needs path_prefix, host, or both");
            }
            if let Some(p) = &r.path_prefix {
                if !p.starts_with('/') {
                    self.problem(
                        &format!("{rkey}.path_prefix"),
                        format!("\"{p}\" must start with '/'"),
                    );
                } else if !p.bytes().all(super::pools::in_request_target) || p.contains('?') {
                    // Compared with the request's path as sent: a space, a
                    // '?' or a byte no target holds never matches.
                    self.problem(
                        &format!("{rkey}.path_prefix"),
                        format!("{p:?} must be a path as requests send it: visible ASCII without '?' or '#' (percent-encode the rest, a space as %20)"),
                    );
                }
            }
            let host = r.host.as_deref().map(|h| self.route_host(&rkey, h));
            let pool = self.pool_ref(&format!("{rkey}.pool"), r.pool.as_deref(), pools);
            out.push(RouteConfig {
                path_prefix: r.path_prefix.clone(),
                host,
                pool,
            });
        }
        self.shadowed_routes(key, &out);
        out
    }

    /// Routes are tried in order and the first match wins (not the
    /// longest prefix, as nginx's `location`s): a route an earlier one
    /// takes every request of never matches, which the config does not
    /// show. Warned of (a config that ran must still reload).
    fn shadowed_routes(&mut self, key: &str, routes: &[RouteConfig]) {
        for (j, later) in routes.iter().enumerate() {
            let earlier = routes[..j]
                .iter()
                .position(|earlier| covers(earlier, later));
            if let Some(i) = earlier {
                self.warning(
                    &format!("{key}.routes[{j}]"),
                    format!("never matches: routes[{i}] before it takes every request it would (the first match wins; put the narrower route first)"),
                );
            }
        }
    }
}

/// The folder `path` names its file in: `.` for a bare name (a config
/// named bare, `-c baton.toml`, gives its relative paths an empty folder,
/// which is no folder to `is_dir`).
fn folder_of(path: &Path) -> Option<&Path> {
    path.parent().map(|folder| {
        if folder.as_os_str().is_empty() {
            Path::new(".")
        } else {
            folder
        }
    })
}

/// Whether every request `later` matches, `earlier` matches too.
fn covers(earlier: &RouteConfig, later: &RouteConfig) -> bool {
    if earlier.host.is_none() && earlier.path_prefix.is_none() {
        // Refused already: it needs one of them.
        return false;
    }
    let host = earlier.host.is_none() || earlier.host == later.host;
    let path = match (&earlier.path_prefix, &later.path_prefix) {
        (None, _) => true,
        (Some(wider), Some(narrower)) => narrower.starts_with(wider.as_str()),
        (Some(_), None) => false,
    };
    host && path
}

impl Validator {
    /// The HTTP keys a `protocol = "tcp"` listener was given: a warning
    /// each, naming it (`check` printed only what a TCP listener uses, and
    /// a key that does nothing looked applied). Not refused: a config that
    /// ran must not fail its next reload over it.
    fn http_only_keys_unused(&mut self, key: &str, l: &file::ListenerFile) {
        let given = [
            ("header_timeout", l.header_timeout.is_some()),
            ("response_timeout", l.response_timeout.is_some()),
            // Over TLS it bounds, in a drain, the wait for a ClientHello;
            // with a required PROXY header, the wait for its first byte.
            (
                "keepalive_drain_grace",
                l.keepalive_drain_grace.is_some()
                    && l.tls.is_none()
                    && !l
                        .proxy_protocol
                        .as_ref()
                        .is_some_and(|p| p.required.unwrap_or(true)),
            ),
            ("forwarded", l.forwarded.is_some()),
            (
                "h2_max_concurrent_streams",
                l.h2_max_concurrent_streams.is_some(),
            ),
        ];
        for (name, _) in given.iter().filter(|(_, given)| *given) {
            self.warning(
                &format!("{key}.{name}"),
                "does nothing on a protocol = \"tcp\" listener (HTTP only)",
            );
        }
    }

    /// A route's `host` as requests are compared with it: without a port
    /// or a final dot (a request's are dropped too), in lower case. One
    /// that is neither a host name nor an IP address never matches a
    /// request: refused.
    fn route_host(&mut self, rkey: &str, written: &str) -> String {
        let port_less = strip_port(written);
        let host = port_less
            .strip_suffix('.')
            .unwrap_or(port_less)
            .to_ascii_lowercase();
        let ipv6 = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
        let ipv4 = host.parse::<std::net::Ipv4Addr>().is_ok();
        let why = if ipv4 || ipv6 {
            None
        } else {
            // One final dot at most, and no wildcard (a route's host is
            // matched whole): a second dot or a '*' is a label the name
            // cannot have. '_' as requests' Host may hold it (hosts named
            // so exist).
            super::dns::name_problem(port_less)
        };
        if let Some(why) = why {
            self.problem(
                &format!("{rkey}.host"),
                format!("\"{written}\" is not a host name or an IP address ({why}): no request's Host would match it"),
            );
        }
        host
    }

    /// A listener's `bind` (not port 0) must be no other listener's, nor
    /// the admin server's.
    fn bind_free(
        &mut self,
        key: &str,
        bind: SocketAddr,
        binds: &mut HashSet<SocketAddr>,
        admin: Option<SocketAddr>,
    ) {
        if !binds.insert(bind) {
            self.problem(
                &format!("{key}.bind"),
                format!("{bind} is already used by another listener"),
            );
        }
        if let Some(admin) = admin.filter(|&admin| overlaps(bind, admin)) {
            self.problem(
                &format!("{key}.bind"),
                format!("{bind} is already used by the admin server ({admin}: the same port on the same or every address)"),
            );
        }
    }
}

/// Whether a listener at `bind` would take `admin`'s port: the admin socket
/// is bound alone (no `SO_REUSEPORT`), so the kernel refuses a listener on
/// its port at its address or at the wildcard, or one at any address when
/// the admin's is the wildcard. Caught here, `baton check` says so; not,
/// `run` failed to bind (and so did every reload to such a config). (IPv6
/// sockets are bound `IPV6_V6ONLY`: the families never meet.)
fn overlaps(bind: SocketAddr, admin: SocketAddr) -> bool {
    bind.port() == admin.port()
        && bind.is_ipv4() == admin.is_ipv4()
        && (bind.ip() == admin.ip() || bind.ip().is_unspecified() || admin.ip().is_unspecified())
}
