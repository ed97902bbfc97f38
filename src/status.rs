//! `baton status` and `baton backend`: the admin API, printed for a person.

use serde_json::Value;

use crate::admin::client::{self, AdminCallError};
use crate::cli::{BackendAction, BackendArgs, StatusArgs};
use crate::commands::UNREACHABLE;
use crate::config::{self, Overrides};
use crate::daemon::exit;

fn admin_call(config: &config::Config, method: &str, path: &str) -> Result<(u16, String), i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("baton: cannot start the runtime: {e}");
            exit::FAILURE
        })?;
    let token = config.admin.token.as_deref();
    rt.block_on(client::call(config.admin.listen, method, path, token))
        .map_err(|e| {
            eprintln!("baton: {e}");
            match e {
                AdminCallError::Unreachable { .. } => UNREACHABLE,
                AdminCallError::Failed { .. } => exit::FAILURE,
            }
        })
}

fn load(path: &std::path::Path) -> Result<config::Config, i32> {
    config::load(path, &Overrides::default()).map_err(|e| {
        eprintln!("baton: config invalid: {e}");
        exit::CONFIG
    })
}

pub fn status(args: &StatusArgs) -> i32 {
    let c = match load(&args.config.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (code, body) = match admin_call(&c, "GET", "/status") {
        Ok(r) => r,
        Err(code) => return code,
    };
    if code != 200 {
        eprintln!("baton: /status answered {code}: {body}");
        return exit::FAILURE;
    }
    if args.json {
        print!("{body}");
        return exit::OK;
    }
    match serde_json::from_str::<Value>(&body) {
        Ok(v) => {
            print!("{}", render(&v));
            exit::OK
        }
        Err(e) => {
            eprintln!("baton: malformed /status: {e}");
            exit::FAILURE
        }
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The `/status` JSON as tables.
pub fn render(v: &Value) -> String {
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
                c => format!("failed: {}", s(&c["detail"])),
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
        }
    }
    out
}

pub fn backend(args: &BackendArgs) -> i32 {
    let c = match load(&args.config.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let action = match args.action {
        BackendAction::Drain => "drain",
        BackendAction::Restore => "restore",
    };
    let (code, body) = match admin_call(&c, "POST", &format!("/backends/{}/{action}", args.id)) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    if code == 200 {
        let b = &v["backend"];
        println!(
            "backend {} ({}) in pool {} is now {}",
            s(&b["name"]),
            s(&b["index"]),
            s(&b["pool"]),
            s(&b["state"])
        );
        exit::OK
    } else {
        eprintln!("baton: {} ({code})", s(&v["error"]));
        exit::FAILURE
    }
}
