//! `baton status` and `baton backend`: the admin API, printed for a person.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::admin::client::{self, AdminCallError};
use crate::cli::StatusArgs;
use crate::config::{AdminConfig, Token};
use crate::exit::Exit;

/// One admin API call (`baton status`, `baton backend`): its status and
/// body, or how the command ends.
pub(super) fn admin_call(
    admin: &AdminConfig,
    method: &str,
    path: &str,
) -> Result<(u16, String), Exit> {
    let rt = super::runtime(1)?;
    let token = admin
        .token
        .as_deref()
        .zip(admin.token_file.as_deref())
        .map(|(secret, file)| client::Token { secret, file });
    rt.block_on(client::call(&admin.listen, method, path, token))
        .map_err(|e| {
            eprintln!("baton: {e}");
            match e {
                AdminCallError::Unreachable { .. } => {
                    eprintln!("baton: is baton running (systemctl status baton), and is this config's admin.listen the running daemon's?");
                    Exit::Unreachable
                }
                // As `baton reload` refused by the control socket's mode.
                AdminCallError::NotOurs { .. }
                | AdminCallError::HeldByAnother { .. }
                | AdminCallError::HolderUnknown { .. } => Exit::Unreachable,
                AdminCallError::Failed { .. } => Exit::Failure,
            }
        })
}

/// How long a call answered 503 is sent again. A generation that has
/// handed its backends' states to a reload's new one (or, asked for
/// `/status`, that drains after one) answers 503 "send it again" until the
/// new one takes admin requests: a moment, at most the new one's wait for
/// the old one's first report (2 s). A deploy script racing `systemctl
/// reload` should not fail on it.
pub(super) const HANDED_OVER_BUDGET: Duration = Duration::from_secs(5);
pub(super) const PAUSE: Duration = Duration::from_millis(100);

/// Makes `call` (a new connection each time), again after `pause` while it
/// is answered 503, until `budget` has passed.
pub(super) fn sent_again_while_handed_over(
    mut call: impl FnMut() -> Result<(u16, String), Exit>,
    budget: Duration,
    pause: Duration,
) -> Result<(u16, String), Exit> {
    let deadline = Instant::now() + budget;
    loop {
        let answer = call()?;
        if answer.0 != 503 || Instant::now() + pause > deadline {
            return Ok(answer);
        }
        std::thread::sleep(pause);
    }
}

/// What the admin API said when it refused `method path` with `code`: its
/// JSON error's words, else its body as it came.
pub(super) fn refused(method: &str, path: &str, code: u16, body: &str) -> String {
    let said = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string());
    let said = if said.is_empty() {
        "no reason given".to_string()
    } else {
        said
    };
    format!("the admin API refused {method} {path} ({code}): {said}")
}

/// The part of the config a command reads only to find the daemon: its
/// `[admin]` section, so the rest being broken (while the daemon serves)
/// does not stop `status` or `backend`; the token file only if `token`
/// says it is needed.
pub(super) fn load(path: &std::path::Path, token: Token) -> Result<AdminConfig, Exit> {
    crate::config::load_admin(path, token).map_err(|err| {
        eprintln!("baton: {}", err.said());
        Exit::Config
    })
}

pub fn status(args: &StatusArgs) -> Exit {
    let c = match load(&args.config.config, Token::Unread) {
        Ok(c) => c,
        Err(exit) => return exit,
    };
    let call = || admin_call(&c, "GET", "/status");
    let (code, body) = match sent_again_while_handed_over(call, HANDED_OVER_BUDGET, PAUSE) {
        Ok(r) => r,
        Err(exit) => return exit,
    };
    if code != 200 {
        eprintln!("baton: {}", refused("GET", "/status", code, &body));
        return Exit::Failure;
    }
    if args.json {
        say_text!("{body}");
        return Exit::Clean;
    }
    match serde_json::from_str::<Value>(&body) {
        Ok(v) => {
            say_text!("{}", render(&v, std::time::SystemTime::now()));
            Exit::Clean
        }
        Err(e) => {
            eprintln!("baton: malformed /status: {e}");
            Exit::Failure
        }
    }
}

pub(super) fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The `/status` JSON as tables, as of `now`.
pub fn render(v: &Value, now: std::time::SystemTime) -> String {
    let mut out = format!("baton {} (commit {})\n", s(&v["version"]), s(&v["commit"]));
    out.push_str(&format!(
        "{:<6} {:<8} {:<9} {:>9}  {}\n",
        "GEN", "PID", "STATE", "IN_FLIGHT", "DRAIN_LEFT"
    ));
    for g in v["generations"].as_array().into_iter().flatten() {
        let left = g["drain_seconds_left"]
            .as_f64()
            .map_or("-".to_string(), |l| format!("{l:.1}s"));
        out.push_str(&format!(
            "{:<6} {:<8} {:<9} {:>9}  {}\n",
            s(&g["number"]),
            s(&g["pid"]),
            s(&g["state"]),
            s(&g["in_flight"]),
            left
        ));
    }
    out.push_str(&format!(
        "\n{:<16} {:<8} {:<24} {:>6} {:>7}\n",
        "LISTENER", "PROTOCOL", "BIND", "ACTIVE", "BACKLOG"
    ));
    for l in v["listeners"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<16} {:<8} {:<24} {:>6} {:>7}\n",
            s(&l["name"]),
            s(&l["protocol"]),
            s(&l["bind"]),
            s(&l["active"]),
            s(&l["backlog"])
        ));
    }
    let k = &v["kernel"];
    out.push_str(&format!(
        "kernel (this network namespace): listen overflows {}, listen drops {}, migrated requests {} ok / {} failed\n",
        s(&k["listen_overflows"]),
        s(&k["listen_drops"]),
        s(&k["migrate_req_success"]),
        s(&k["migrate_req_failure"])
    ));
    for p in v["pools"].as_array().into_iter().flatten() {
        let total = p["backends"].as_array().map_or(0, Vec::len);
        out.push_str(&format!(
            "\npool {} ({}/{total} up)\n",
            s(&p["name"]),
            s(&p["healthy"])
        ));
        out.push_str(&format!(
            "  {:>3} {:<16} {:<22} {:>6} {:<9} {:>9}  {}\n",
            "IDX", "BACKEND", "ADDRESS", "WEIGHT", "STATE", "IN_FLIGHT", "LAST_CHECK"
        ));
        for b in p["backends"].as_array().into_iter().flatten() {
            let check = match &b["last_check"] {
                Value::Null => "-".to_string(),
                c if c["ok"] == Value::Bool(true) => "ok".to_string(),
                // A daemon's detail may quote a backend's words.
                c => format!("failed: {}", crate::telemetry::printable(&s(&c["detail"]))),
            };
            out.push_str(&format!(
                "  {:>3} {:<16} {:<22} {:>6} {:<9} {:>9}  {}\n",
                s(&b["index"]),
                s(&b["name"]),
                s(&b["address"]),
                s(&b["weight"]),
                s(&b["state"]),
                s(&b["in_flight"]),
                check
            ));
            if let Some(line) = last_error(&b["last_error"], now) {
                out.push_str(&line);
            }
        }
    }
    out
}

/// A backend's last failure under its row, with how long ago: what a
/// request met (a pool without checks shows `up` and `-` while every
/// request to it fails; one that traffic took down shows its last check
/// `ok`), which `/status` has beside `last_check`.
fn last_error(e: &Value, now: std::time::SystemTime) -> Option<String> {
    let at = e["at"].as_f64()?;
    let now = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(at, |d| d.as_secs_f64());
    let ago =
        humantime::format_duration(std::time::Duration::from_secs((now - at).max(0.0) as u64));
    // A daemon's detail may quote a backend's words.
    let detail = s(&e["detail"]);
    let detail = crate::telemetry::printable(&detail);
    Some(format!("      last error {ago} ago: {detail}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend's last failure is shown under its row, with its age;
    /// one with none has no such line.
    #[test]
    fn a_backends_last_error_shows_under_its_row() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let backend = |name: &str, error: Value| {
            serde_json::json!({"index": 0, "name": name, "address": "127.0.0.1:1",
                "weight": 1, "state": "up", "in_flight": 0, "last_check": null,
                "last_error": error})
        };
        let status = serde_json::json!({"pools": [{"name": "app", "healthy": 2, "backends": [
            backend("a", serde_json::json!({"at": 999_988.5, "detail": "backend a unreachable: refused"})),
            backend("b", Value::Null),
        ]}]});
        let shown = render(&status, now);
        assert!(
            shown.contains("\n      last error 11s ago: backend a unreachable: refused\n"),
            "{shown}"
        );
        assert_eq!(shown.matches("last error").count(), 1, "{shown}");
    }
}
