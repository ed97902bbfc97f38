//! `baton backend ID drain|restore`: the admin API's backend calls.

use serde_json::Value;

use super::status::{admin_call, load, s};
use crate::cli::{BackendAction, BackendArgs};
use crate::config::Token;
use crate::exit::Exit;

pub fn backend(args: &BackendArgs) -> Exit {
    let c = match load(&args.config.config, Token::Read) {
        Ok(c) => c,
        Err(exit) => return exit,
    };
    let action = match args.action {
        BackendAction::Drain => "drain",
        BackendAction::Restore => "restore",
    };
    let (code, body) = match admin_call(&c, "POST", &format!("/backends/{}/{action}", args.id)) {
        Ok(r) => r,
        Err(exit) => return exit,
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
        Exit::Clean
    } else {
        eprintln!("baton: {} ({code})", s(&v["error"]));
        Exit::Failure
    }
}
