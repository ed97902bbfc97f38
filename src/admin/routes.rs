//! One `match` over the admin paths, each answered by a small function.
//! Every answer is JSON except `/metrics` (Prometheus text).

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

use super::generations::unix;
use super::{AdminShared, Topology};
use crate::backend::named::Named;
use crate::backend::{AdminState, Backend, Pool};
use crate::config::AdminListen;
use crate::lifecycle::{Check, Phase};
use crate::metrics::exposition::InFlightOnBackends;
use crate::metrics::kernel;

type Reply = Response<Full<Bytes>>;

pub async fn respond<B>(state: &Arc<AdminShared>, req: Request<B>) -> Reply {
    let path = req.uri().path();
    let is_get = req.method() == Method::GET || req.method() == Method::HEAD;
    if state.config.liveness_paths.iter().any(|p| p == path) {
        return if is_get {
            json_reply(StatusCode::OK, json!({"status": "alive"}))
        } else {
            not_allowed(READS)
        };
    }
    if state.config.readiness_paths.iter().any(|p| p == path) {
        return if is_get {
            readiness(state)
        } else {
            not_allowed(READS)
        };
    }
    if let Some(host) = rebound(state, &req) {
        return error(
            StatusCode::FORBIDDEN,
            format!("refused: Host {host}, a DNS name, asks a loopback admin (a web page whose name was rebound to it); ask for 127.0.0.1, localhost or this host's name"),
        );
    }
    if let Some(rest) = path.strip_prefix("/backends/") {
        return backend_action(state, &req, rest);
    }
    match path {
        "/status" | "/metrics" if is_get && drains_after_a_reload(state) => handed_over(),
        "/status" if is_get => status(state),
        "/metrics" if is_get => metrics(state).await,
        "/status" | "/metrics" => not_allowed(READS),
        _ => error(StatusCode::NOT_FOUND, format!("no admin endpoint {path}")),
    }
}

/// Whether this generation drains after handing over to a newer one: it
/// knows nothing of the serving one, which its reports go to. Its `/status`
/// named no serving generation, and its `/metrics` lacked the newer one's
/// counts (a step back to a scraper), on a connection it took before its
/// admin stopped and was asked on after.
fn drains_after_a_reload(state: &AdminShared) -> bool {
    matches!(*state.phase.borrow(), Phase::Draining { .. })
}

/// "Send it again": a new connection reaches the serving generation.
fn handed_over() -> Reply {
    let mut refused = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "this generation has handed over to a newer one: send it again (a new connection reaches the serving generation)".into(),
    );
    refused
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    refused
}

/// Why a pool has no backend that can take work: none healthy, and how
/// many of them the operator drained (healthy or not, they take none).
fn unavailable(backends: &[Arc<Backend>]) -> String {
    let total = backends.len();
    let drained = backends
        .iter()
        .filter(|b| b.admin() != AdminState::Enabled)
        .count();
    match drained {
        0 => format!("0/{total} backends healthy"),
        _ => format!("0/{total} backends healthy ({drained} drained by the operator)"),
    }
}

/// One check per pool: does it have a backend that can take work? A name
/// DNS has not answered for yet says why a pool has none, but does not
/// hold back one that has (a mistyped host name beside healthy addresses
/// would keep the host out of its load balancer for good).
fn pool_checks(topology: &Topology) -> Vec<Check> {
    topology
        .pools
        .iter()
        .map(|p| {
            let up = p.healthy_count();
            let waiting = p.waiting_for_dns();
            let detail = if !waiting.is_empty() {
                Some(format!("waiting for DNS: {}", waiting.join(", ")))
            } else {
                (up == 0).then(|| unavailable(&p.backends().backends))
            };
            Check {
                name: format!("pool {}", p.name),
                ok: up > 0,
                detail,
            }
        })
        .collect()
}

/// One check per worker thread that has stopped running: its shards'
/// connections wait, though the admin (on another thread) answers.
fn worker_checks(stuck: &crate::workers::Stuck) -> Vec<Check> {
    stuck
        .now()
        .into_iter()
        .map(|(worker, seconds)| Check {
            name: format!("worker {worker}"),
            ok: false,
            detail: Some(format!(
                "has not run for {seconds}s: connections on its shards wait"
            )),
        })
        .collect()
}

fn readiness(state: &AdminShared) -> Reply {
    let phase = state.phase.borrow().clone();
    let mut checks = pool_checks(&state.topology());
    checks.extend(worker_checks(&state.stuck_workers));
    match phase {
        // An old generation handed over answers a probe that reached it
        // (on a connection taken before its admin stop) from its own
        // pools, most often the serving one's too: a 200 whatever its
        // pools would flip a host that is out of service in for a moment
        // at every reload. (A reload that changed the pools can still
        // differ there: this one's view is its config's, frozen once its
        // checks stop.)
        Phase::Active | Phase::Draining { .. } => {
            let (status, mut body) = if checks.iter().all(|c| c.ok) {
                (StatusCode::OK, json!({"status": "ready"}))
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"status": "unhealthy", "waiting_on": checks}),
                )
            };
            if matches!(phase, Phase::Draining { .. }) {
                body["generation"] = json!("draining");
            }
            json_reply(status, body)
        }
        Phase::Stopping { .. } => json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining"}),
        ),
        Phase::Starting { mut waiting_on } => {
            waiting_on.extend(checks);
            json_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "starting", "waiting_on": waiting_on}),
            )
        }
    }
}

/// A backend as `/status` shows it; `older` is what older generations
/// still draining have in flight (its `in_flight` counts theirs too).
fn backend_json(b: &Backend, older: &InFlightOnBackends) -> Value {
    let older_in_flight = older
        .get(&b.pool)
        .and_then(|backends| backends.get(&b.label))
        .copied()
        .unwrap_or(0);
    let last = b
        .last_check()
        .map(|c| json!({"at": unix(c.at), "ok": c.ok, "detail": c.detail}));
    let error = b
        .last_error()
        .map(|e| json!({"at": unix(e.at), "detail": e.detail}));
    json!({
        "index": b.index,
        "name": b.name,
        "pool": b.pool,
        "address": b.address.to_string(),
        "resolved_from": b.resolved_from,
        "weight": b.weight(),
        "state": b.state().as_str(),
        "in_flight": b.in_flight() as u64 + older_in_flight,
        "last_check": last,
        "last_error": error,
        "consecutive_failures": b.consecutive_failures(),
    })
}

fn pool_json(p: &Pool, older: &InFlightOnBackends) -> Value {
    let backends: Vec<Value> = p
        .backends()
        .backends
        .iter()
        .map(|b| backend_json(b, older))
        .collect();
    let named: Vec<Value> = p
        .named
        .iter()
        .map(|n| {
            json!({
                "name": n.name,
                "query": n.query.to_string(),
                "answered": n.answered(),
                "admin": n.admin().as_str(),
            })
        })
        .collect();
    json!({"name": p.name, "healthy": p.healthy_count(), "backends": backends, "named": named})
}

fn status(state: &AdminShared) -> Reply {
    let topology = state.topology();
    let now = unix(SystemTime::now());
    let generations: Vec<Value> = state
        .generations()
        .iter()
        .map(|g| {
            json!({
                "number": g.number,
                "pid": g.pid,
                "state": g.state,
                "started_at": g.started_at,
                "in_flight": g.in_flight,
                "active": g.active,
                "drain_deadline": g.drain_deadline,
                "drain_seconds_left": g.drain_deadline.map(|d| (d - now).max(0.0)),
            })
        })
        .collect();
    let listeners: Vec<Value> = topology
        .listeners
        .iter()
        .map(|l| {
            json!({"name": l.name, "bind": l.bind.to_string(), "protocol": l.protocol.as_str(), "active": l.stats.active(), "backlog": l.backlog()})
        })
        .collect();
    let older = state.in_flight_of_older();
    let pools: Vec<Value> = topology
        .pools
        .iter()
        .map(|p| pool_json(p, &older))
        .collect();
    // `null` when they cannot be read now (see `kernel::netstat`).
    let kernel = kernel::netstat().map(|n| {
        json!({
            "listen_overflows": n.listen_overflows,
            "listen_drops": n.listen_drops,
            "migrate_req_success": n.migrate_success,
            "migrate_req_failure": n.migrate_failure,
        })
    });
    json_reply(
        StatusCode::OK,
        json!({
            "version": crate::VERSION,
            "commit": crate::COMMIT,
            "generations": generations,
            "kernel": kernel,
            "listeners": listeners,
            "pools": pools,
        }),
    )
}

/// Rendered on the admin's render thread, one at a time (`render`).
async fn metrics(state: &Arc<AdminShared>) -> Reply {
    let Some(text) = state.rendering.render(Arc::clone(state)).await else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the metrics could not be rendered (the render failed, or its thread is gone)".into(),
        );
    };
    let mut reply = Response::new(Full::new(Bytes::from(text)));
    reply.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    reply
}

/// `POST /backends/{id}/drain|restore`, `{id}` the global index, the name,
/// or a DNS member's `name@address`.
fn backend_action<B>(state: &AdminShared, req: &Request<B>, rest: &str) -> Reply {
    let Some((id, action)) = rest.rsplit_once('/') else {
        return error(
            StatusCode::NOT_FOUND,
            "use /backends/{id}/drain or /backends/{id}/restore".into(),
        );
    };
    if action != "drain" && action != "restore" {
        return error(
            StatusCode::NOT_FOUND,
            format!("no backend action \"{action}\""),
        );
    }
    if req.method() != Method::POST {
        return not_allowed("POST");
    }
    if let Some(origin) = from_a_web_page(req) {
        return error(
            StatusCode::FORBIDDEN,
            format!("refused: sent by a web page ({origin}); call the admin API from a program (curl, baton backend), not a browser"),
        );
    }
    if let Some(token) = &state.config.token {
        if !authorized(req, token) {
            let mut refused = error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token".into(),
            );
            // RFC 9110 §11.6.1: a 401 says which scheme it wants.
            refused
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return refused;
        }
    }
    // Held until the change is made: see `AdminShared::handed_over`.
    let handed_over = state
        .handed_over
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *handed_over {
        return self::handed_over();
    }
    let topology = state.topology();
    if topology.pools.is_empty() && !state.configured.pools.is_empty() {
        // A first start still looking its backends up: the id may well be
        // one the config names (`baton backend` sends a 503 again).
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: the backends are not built yet (DNS lookups first); send it again in a moment".into(),
        );
    }
    let lookup = |t: &Topology| find_backends(t, id).or_else(|e| decoded(t, id, e));
    let found = match lookup(&topology) {
        Ok(found) => found,
        Err((status, message)) => return error(status, message),
    };
    let drain = action == "drain";
    let word = if drain {
        AdminState::Draining
    } else {
        AdminState::Enabled
    };
    let found = match &found.named {
        Some((pool, named)) => Found {
            backends: pool.say_of_name(named, word),
            ..found
        },
        None => found,
    };
    for backend in &found.backends {
        // A name's members were told under its pool's lock.
        let new_state = match (&found.named, drain) {
            (Some(_), _) => backend.state(),
            (None, true) => backend.drain(),
            (None, false) => backend.restore(),
        };
        tracing::info!(backend = %backend.label, action, state = new_state.as_str(), "admin backend action");
    }
    let older = state.in_flight_of_older();
    let members: Vec<Value> = found
        .backends
        .iter()
        .map(|b| backend_json(b, &older))
        .collect();
    // A name DNS has given no address yet: the word is kept for its members.
    let first = members.first().cloned().unwrap_or_else(
        || json!({"name": id, "pool": found.pool, "index": null, "state": word.as_str()}),
    );
    let mut body = json!({"backend": first});
    if found.named.is_some() {
        body["members"] = Value::Array(members);
    }
    json_reply(StatusCode::OK, body)
}

/// The backends an admin `{id}` names: one by index, one DNS member by
/// `name@address` (its label, which stays from one generation to the next
/// where its index may not), or every backend of a name (a name DNS
/// resolves names each member, and those to come).
struct Found {
    pool: String,
    backends: Vec<Arc<Backend>>,
    /// The name and its pool, when `id` names a name.
    named: Option<(Arc<Pool>, Arc<Named>)>,
}

impl Found {
    fn one(backend: Arc<Backend>) -> Found {
        Found {
            pool: backend.pool.clone(),
            backends: vec![backend],
            named: None,
        }
    }
}

/// The backends `id` names once percent-decoded, when it names none as it
/// is: clients encode a path segment's `@`, `[`, `]` and `:` (Go's
/// `url.PathEscape`, Python's `quote(id, safe="")`). As it is first: an
/// unnamed backend at a link-local IPv6 address is named with its `%`
/// scope (`[fe80::1%12]:8080`). `unfound` is the answer as it was.
fn decoded(
    topology: &Topology,
    id: &str,
    unfound: (StatusCode, String),
) -> Result<Found, (StatusCode, String)> {
    match percent_encoding::percent_decode_str(id).decode_utf8() {
        Ok(plain) if plain != id => find_backends(topology, &plain),
        _ => Err(unfound),
    }
}

fn find_backends(topology: &Topology, id: &str) -> Result<Found, (StatusCode, String)> {
    let all = || {
        topology
            .pools
            .iter()
            .flat_map(|p| p.backends().backends.clone())
    };
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        if id.len() > 1 && id.starts_with('0') {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("backend index \"{id}\" has a leading zero"),
            ));
        }
        let found = id
            .parse::<usize>()
            .ok()
            .and_then(|i| all().find(|b| b.index == i));
        return found
            .map(Found::one)
            .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no backend with index {id}")));
    }
    if id.contains('@') {
        return all()
            .find(|b| b.label == id)
            .map(Found::one)
            .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no backend member \"{id}\"")));
    }
    let named = topology
        .pools
        .iter()
        .find_map(|p| p.named.iter().find(|n| n.name == id).map(|n| (p, n)));
    if let Some((pool, named)) = named {
        return Ok(Found {
            pool: pool.name.clone(),
            backends: pool
                .backends()
                .backends
                .iter()
                .filter(|b| b.name == id)
                .cloned()
                .collect(),
            named: Some((Arc::clone(pool), Arc::clone(named))),
        });
    }
    all()
        .find(|b| b.name == id)
        .map(Found::one)
        .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no backend named \"{id}\"")))
}

/// The `Host` of a request to a loopback admin that names a host of the
/// public DNS: a browser's, for a page whose DNS name was rebound to
/// 127.0.0.1 (its script may then read `/status` and `/metrics`, as of
/// its own origin: backends' addresses, names, pids). Such a name has a
/// dot; a program asks for an IP address, `localhost`, a name of one
/// label (`/etc/hosts`'), or this host's own name (an SSH tunnel, a
/// port-forward, a proxy's `proxy_pass http://127.0.0.1:9901` too).
/// Probes are not asked: they say nothing, and a checker may name the host
/// as it likes.
fn rebound<B>(state: &AdminShared, req: &Request<B>) -> Option<String> {
    let AdminListen::Tcp(at) = state.config.listen else {
        return None;
    };
    if !at.ip().is_loopback() {
        return None;
    }
    let host = req.headers().get(http::header::HOST)?;
    let host = String::from_utf8_lossy(host.as_bytes()).into_owned();
    let name = crate::config::strip_port(&host)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    // A final dot names the same host.
    let name = name.strip_suffix('.').unwrap_or(&name);
    // `.localhost` and `.localdomain` are no names of the public DNS
    // (Fedora's /etc/hosts has `localhost.localdomain`,
    // `localhost4.localdomain4` and `localhost6.localdomain6`).
    let top = name.rsplit('.').next().unwrap_or_default();
    let local = !name.contains('.')
        || top == "localhost"
        || ["localdomain", "localdomain4", "localdomain6"].contains(&top)
        || name.parse::<std::net::IpAddr>().is_ok()
        || std::fs::read_to_string("/proc/sys/kernel/hostname")
            .is_ok_and(|own| own.trim().eq_ignore_ascii_case(name));
    (!local).then_some(host)
}

/// Where a web page sent a request from, if a browser sent it: a browser
/// adds `Origin` to every POST (and `Sec-Fetch-Site` other than `none`
/// to anything a page, not the user, asked for), and any page it shows can
/// post a bodiless form to a loopback address or, by DNS rebinding, to any
/// address it reaches: without this a page could drain every backend of an
/// admin without a token. No program the API is for (curl, `baton backend`,
/// an orchestrator) sends either.
fn from_a_web_page<B>(req: &Request<B>) -> Option<String> {
    let said = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    if let Some(origin) = said("origin") {
        return Some(format!("Origin: {origin}"));
    }
    said("sec-fetch-site")
        .filter(|site| !site.eq_ignore_ascii_case("none"))
        .map(|site| format!("Sec-Fetch-Site: {site}"))
}

/// Compares the bearer token in constant time (no early exit on the first
/// differing byte), so timing does not reveal a prefix. The scheme's name
/// is case-insensitive (RFC 9110 §11.1: `bearer x` is `Bearer x`).
fn authorized<B>(req: &Request<B>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, given)| given.trim_start_matches(' '))
    else {
        return false;
    };
    let (a, b) = (given.as_bytes(), token.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff));
    }
    diff == 0
}

/// The methods the probes, `/status` and `/metrics` take.
const READS: &str = "GET, HEAD";

/// 405, with the `Allow` field RFC 9110 §15.5.6 asks for: the methods
/// the endpoint takes.
fn not_allowed(allow: &'static str) -> Reply {
    let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed".into());
    reply
        .headers_mut()
        .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    reply
}

/// The answer to every request from a peer that may not call the API on
/// its Unix socket (see `Accepted::answer`).
pub fn refused_peer(uid: u32) -> Reply {
    error(
        StatusCode::FORBIDDEN,
        format!("uid {uid} may not call baton's admin API: on its Unix socket only root and baton's own user may"),
    )
}

fn error(status: StatusCode, message: String) -> Reply {
    json_reply(status, json!({"error": message}))
}

fn json_reply(status: StatusCode, body: Value) -> Reply {
    let mut text = body.to_string();
    text.push('\n');
    let mut reply = Response::new(Full::new(Bytes::from(text)));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

#[cfg(test)]
mod tests {
    use super::authorized;

    fn with(authorization: &str) -> hyper::Request<()> {
        hyper::Request::builder()
            .header(hyper::header::AUTHORIZATION, authorization)
            .body(())
            .expect("request")
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_exact() {
        for good in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
            assert!(authorized(&with(good), "s3cret"), "{good}");
        }
        for bad in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Basic s3cret",
            "Bearers3cret",
            "s3cret",
        ] {
            assert!(!authorized(&with(bad), "s3cret"), "{bad}");
        }
    }
}
