//! One `match` over the admin paths, each answered by a small function.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

use super::AdminState;
use crate::lifecycle::Phase;

type Reply = Response<Full<Bytes>>;

pub fn respond<B>(state: &AdminState, req: Request<B>) -> Reply {
    let path = req.uri().path();
    let is_get = req.method() == Method::GET || req.method() == Method::HEAD;
    if state.config.liveness_paths.iter().any(|p| p == path) {
        return if is_get {
            json_reply(StatusCode::OK, json!({"status": "alive"}))
        } else {
            not_allowed()
        };
    }
    if state.config.readiness_paths.iter().any(|p| p == path) {
        return if is_get {
            readiness(state)
        } else {
            not_allowed()
        };
    }
    match path {
        "/status" if is_get => status(state),
        "/metrics" if is_get => metrics(state),
        "/status" | "/metrics" => not_allowed(),
        _ => json_reply(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no admin endpoint {path}")}),
        ),
    }
}

fn readiness(state: &AdminState) -> Reply {
    let phase = state.phase.borrow().clone();
    match phase {
        Phase::Active => json_reply(StatusCode::OK, json!({"status": "ready"})),
        // An old generation handed over: the host is still ready (the new
        // generation serves), and a probe answered here says so.
        Phase::Draining => json_reply(
            StatusCode::OK,
            json!({"status": "ready", "generation": "draining"}),
        ),
        Phase::Stopping => json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining"}),
        ),
        Phase::Starting { waiting_on } => json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "starting", "waiting_on": waiting_on}),
        ),
    }
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn status(state: &AdminState) -> Reply {
    let topology = state.topology();
    let g = &state.generation;
    let in_flight: usize = topology.listeners.iter().map(|l| l.stats.active()).sum();
    let deadline = state.drain_deadline.read().ok().and_then(|d| *d).map(unix);
    let generation = json!({
        "number": g.number,
        "pid": g.pid,
        "state": state.phase.borrow().as_str(),
        "started_at": unix(g.started_at),
        "in_flight": in_flight,
        "drain_deadline": deadline,
    });
    let listeners: Vec<Value> = topology
        .listeners
        .iter()
        .map(|l| json!({"name": l.name, "bind": l.bind.to_string(), "protocol": l.protocol.as_str(), "active": l.stats.active()}))
        .collect();
    let pools: Vec<Value> = topology
        .pools
        .iter()
        .map(|p| {
            let backends: Vec<Value> = p
                .backends
                .iter()
                .map(|b| json!({"index": b.index, "name": b.name, "address": b.address.to_string(), "weight": b.weight, "state": "up", "in_flight": b.in_flight()}))
                .collect();
            json!({"name": p.name, "backends": backends})
        })
        .collect();
    json_reply(
        StatusCode::OK,
        json!({
            "version": crate::VERSION,
            "commit": crate::COMMIT,
            "generations": [generation],
            "listeners": listeners,
            "pools": pools,
        }),
    )
}

fn metrics(state: &AdminState) -> Reply {
    let text = state
        .metrics
        .as_ref()
        .map(|h| h.render())
        .unwrap_or_default();
    let mut reply = Response::new(Full::new(Bytes::from(text)));
    reply.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    reply
}

fn not_allowed() -> Reply {
    json_reply(
        StatusCode::METHOD_NOT_ALLOWED,
        json!({"error": "method not allowed"}),
    )
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
