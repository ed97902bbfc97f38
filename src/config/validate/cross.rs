//! Checks across sections: settings each section takes alone, which
//! together would not do what they say.

use super::*;

impl Validator {
    /// A listener's `keepalive_drain_grace` at or past a drain's budget
    /// closes no idle keep-alive connection before the drain's deadline:
    /// each is cut there, counted as forced, and every stop exits 3. A
    /// warning: a config that ran must still reload.
    pub(super) fn grace_within_drains(
        &mut self,
        listeners: &[ListenerConfig],
        drains: [(Duration, &str); 2],
    ) {
        for (i, l) in listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| grace_matters(l))
        {
            let grace = l.keepalive_drain_grace;
            let over = drains
                .iter()
                .find(|(budget, _)| !budget.is_zero() && grace >= *budget);
            if let Some((budget, from)) = over {
                self.warning(
                    &format!("listeners[{i}].keepalive_drain_grace"),
                    format!(
                        "{} is not shorter than {from} ({}): the connections it would close as idle are cut at the drain's deadline instead, counted as forced",
                        humantime::format_duration(grace),
                        humantime::format_duration(*budget)
                    ),
                );
            }
        }
    }

    /// A listener whose pool (its own, or a route's) has a backend at the
    /// listener's own address would send each request back to itself,
    /// until `max_connections` runs out.
    pub(super) fn no_listener_is_its_own_backend(
        &mut self,
        listeners: &[ListenerConfig],
        pools: &[PoolConfig],
    ) {
        for (i, l) in listeners.iter().enumerate() {
            let mut used: Vec<usize> = l.routes.iter().map(|r| r.pool).collect();
            used.push(l.pool);
            used.sort_unstable();
            used.dedup();
            for pool in used.iter().filter_map(|p| pools.get(*p)) {
                for b in pool.backends.iter().filter(|b| reaches(l.bind, b.address)) {
                    self.problem(
                        &format!("listeners[{i}]"),
                        format!(
                            "pool \"{}\" has backend \"{}\" at {}, this listener's own address: each request would come back to baton",
                            pool.name, b.name, b.address
                        ),
                    );
                }
            }
        }
    }

    /// A pool no listener or route sends work to is still checked, and
    /// `/readyz` still waits for a healthy backend of it: one left in the
    /// file after its routes went would make the node unready (a
    /// balancer in front takes it out) when its backends are retired.
    /// A warning: such a config ran.
    pub(super) fn every_pool_used(&mut self, listeners: &[ListenerConfig], pools: &[PoolConfig]) {
        for (i, pool) in pools.iter().enumerate() {
            let used = listeners
                .iter()
                .any(|l| l.pool == i || l.routes.iter().any(|r| r.pool == i));
            if !used {
                self.warning(
                    &format!("pools[{i}]"),
                    format!(
                        "\"{}\" is used by no listener or route: it is still health-checked, and /readyz still waits for a healthy backend of it; remove it if it is retired",
                        pool.name
                    ),
                );
            }
        }
    }

    /// Listeners that log to one destination in two formats mix JSON and
    /// combined lines in one file, which no log tool reads whole (and a
    /// combined line names no listener). A warning: such a config ran.
    pub(super) fn one_format_a_destination(&mut self, listeners: &[ListenerConfig]) {
        let mut first: Vec<(usize, &crate::access_log::Settings)> = Vec::new();
        for (i, l) in listeners.iter().enumerate() {
            let Some(settings) = &l.access_log else {
                continue;
            };
            match first.iter().find(|(_, s)| s.destination == settings.destination) {
                Some((j, s)) if s.format != settings.format => self.warning(
                    &format!("listeners[{i}].access_log.format"),
                    format!(
                        "\"{}\" differs from listeners[{j}]'s \"{}\", which logs to {} too: one file would mix two formats",
                        settings.format.as_str(),
                        s.format.as_str(),
                        settings.destination
                    ),
                ),
                Some(_) => {}
                None => first.push((i, settings)),
            }
        }
    }
}

/// Whether a listener's drains close connections at its grace: HTTP's
/// idle ones, a TLS handshake's silent ones, a required PROXY header's
/// (a plain TCP listener's connections are its tunnels).
fn grace_matters(l: &ListenerConfig) -> bool {
    l.protocol == Protocol::Http
        || l.tls.is_some()
        || l.proxy_protocol.as_ref().is_some_and(|p| p.required)
}

/// Whether a connection to `backend` reaches a listener bound on `bind`
/// (of the same family: IPv6 listeners are bound IPv6-only, so another
/// program may hold the other family's address).
fn reaches(bind: SocketAddr, backend: SocketAddr) -> bool {
    let (listening, to) = (bind.ip(), backend.ip().to_canonical());
    bind.port() == backend.port()
        && listening.is_ipv4() == to.is_ipv4()
        && (listening == to
            || (listening.is_unspecified() && (to.is_loopback() || to.is_unspecified())))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{problems, warned_once, warnings};
    use super::*;

    /// A listener on 127.0.0.1:8080 before pool `app`, with `keys` added
    /// to it and `top` before it.
    fn config(top: &str, keys: &str, backend: &str) -> String {
        format!(
            "{top}\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\npool = \"app\"\n{keys}\n\n[[pools]]\nname = \"app\"\nbackends = [{{ name = \"a\", address = \"{backend}\" }}]\n"
        )
    }

    #[test]
    fn a_drain_grace_past_a_drain_budget_is_warned_of() {
        let grace = "listeners[0].keepalive_drain_grace";
        warned_once(
            &warnings(&config(
                "[shutdown]\ndrain_timeout = \"10s\"",
                "keepalive_drain_grace = \"30s\"",
                "127.0.0.1:9001",
            )),
            grace,
            "shutdown.drain_timeout (10s)",
        );
        warned_once(
            &warnings(&config(
                "[reload]\ndrain_timeout = \"2s\"",
                "keepalive_drain_grace = \"5s\"",
                "127.0.0.1:9001",
            )),
            grace,
            "reload.drain_timeout (2s)",
        );
        assert!(warnings(&config(
            "",
            "keepalive_drain_grace = \"5s\"",
            "127.0.0.1:9001"
        ))
        .is_empty());
    }

    /// Two listeners logging to one file in two formats are warned of;
    /// in one format, or to two files, they are not.
    #[test]
    fn one_destination_in_two_formats_is_warned_of() {
        let two = |first: &str, second: &str, file: &str| {
            format!(
                "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:8080\"\npool = \"app\"\naccess_log = {{ path = \"access.log\", format = \"{first}\" }}\n\n[[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:8081\"\npool = \"app\"\naccess_log = {{ path = \"{file}\", format = \"{second}\" }}\n\n[[pools]]\nname = \"app\"\nbackends = [{{ name = \"a\", address = \"127.0.0.1:9001\" }}]\n"
            )
        };
        let mixed = warnings(&two("json", "combined", "access.log"));
        assert_eq!(mixed.len(), 1, "{mixed:?}");
        assert!(
            mixed[0].starts_with(
                "listeners[1].access_log.format: \"combined\" differs from listeners[0]'s \"json\""
            ),
            "{mixed:?}"
        );
        assert!(warnings(&two("json", "json", "access.log")).is_empty());
        assert!(warnings(&two("json", "combined", "other.log")).is_empty());
    }

    /// A pool that no listener or route uses is warned of; one a route
    /// uses is not.
    #[test]
    fn a_pool_nothing_uses_is_warned_of() {
        let spare = "\n[[pools]]\nname = \"old\"\nbackends = [{ name = \"o\", address = \"127.0.0.1:9009\" }]\n";
        let unused = warnings(&(config("", "", "127.0.0.1:9001") + spare));
        warned_once(
            &unused,
            "pools[1]",
            "\"old\" is used by no listener or route",
        );
        let routed = config(
            "",
            "routes = [{ path_prefix = \"/x\", pool = \"old\" }]",
            "127.0.0.1:9001",
        ) + spare;
        assert!(warnings(&routed).is_empty(), "{:?}", warnings(&routed));
    }

    #[test]
    fn a_listener_that_is_its_own_backend_is_refused() {
        let own = "this listener's own address";
        let found = problems(&config("", "", "127.0.0.1:8080"));
        assert!(
            found.len() == 1 && found[0].starts_with("listeners[0]") && found[0].contains(own),
            "{found:?}"
        );
        let routed = config(
            "",
            "routes = [{ path_prefix = \"/x\", pool = \"loop\" }]",
            "127.0.0.1:9001",
        ) + "\n[[pools]]\nname = \"loop\"\nbackends = [{ name = \"l\", address = \"127.0.0.1:8080\" }]\n";
        let found = problems(&routed);
        assert!(
            found.len() == 1 && found[0].contains("pool \"loop\"") && found[0].contains(own),
            "{found:?}"
        );
        let wildcard = config("", "", "127.0.0.1:8080")
            .replace("127.0.0.1:8080\"\npool", "0.0.0.0:8080\"\npool");
        assert_eq!(
            problems(&wildcard).len(),
            1,
            "a wildcard bind takes loopback's connections"
        );
        assert!(warnings(&config("", "", "127.0.0.1:8081")).is_empty());
    }

    #[test]
    fn a_backend_reaches_a_listener_on_its_address_or_a_wildcard() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("address");
        assert!(reaches(at("127.0.0.1:80"), at("127.0.0.1:80")));
        assert!(reaches(at("0.0.0.0:80"), at("127.0.0.1:80")));
        assert!(reaches(at("[::]:80"), at("[::1]:80")));
        assert!(!reaches(at("127.0.0.1:80"), at("127.0.0.1:81")));
        assert!(!reaches(at("127.0.0.1:80"), at("127.0.0.2:80")));
        assert!(
            !reaches(at("0.0.0.0:80"), at("10.0.0.5:80")),
            "another host, maybe"
        );
        assert!(reaches(at("127.0.0.1:80"), at("[::ffff:127.0.0.1]:80")));
        assert!(
            !reaches(at("0.0.0.0:80"), at("[::1]:80")),
            "IPv6-only listeners"
        );
        assert!(!reaches(at("[::]:80"), at("127.0.0.1:80")));
    }
}
