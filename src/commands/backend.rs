//! `baton backend drain|restore ID`: the admin API's backend calls.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use super::status::{
    admin_call, load, refused, s, sent_again_while_handed_over, HANDED_OVER_BUDGET, PAUSE,
};
use crate::cli::{BackendAction, BackendArgs};
use crate::config::Token;
use crate::exit::Exit;

/// What an id keeps as it is in a path: a name's characters and a DNS
/// member's `@`, `[`, `]` and `:`. Anything else is encoded, so a mistyped
/// id with `?`, `#` or `/` reaches the API whole and is answered "no
/// backend" by its name, not cut at that character.
const KEPT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'@')
    .remove(b'[')
    .remove(b']')
    .remove(b':');

fn in_path(id: &str) -> String {
    utf8_percent_encode(id, KEPT).to_string()
}

pub fn backend(args: &BackendArgs) -> Exit {
    let c = match load(&args.config.config, Token::Read) {
        Ok(c) => c,
        Err(exit) => return exit,
    };
    let action = match args.action {
        BackendAction::Drain => "drain",
        BackendAction::Restore => "restore",
    };
    let path = format!("/backends/{}/{action}", in_path(&args.id));
    let call = || admin_call(&c, "POST", &path);
    let (code, body) = match sent_again_while_handed_over(call, HANDED_OVER_BUDGET, PAUSE) {
        Ok(r) => r,
        Err(exit) => return exit,
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    if code == 200 {
        match v["members"].as_array() {
            // A DNS name: every member it has, each by its label.
            Some(members) if !members.is_empty() => members.iter().for_each(say_state),
            Some(_) => say!(
                "backend {} in pool {} has no address from DNS yet: its members will be {} as they come",
                s(&v["backend"]["name"]),
                s(&v["backend"]["pool"]),
                s(&v["backend"]["state"])
            ),
            None => say_state(&v["backend"]),
        }
        Exit::Clean
    } else {
        eprintln!("baton: {}", refused("POST", &path, code, &body));
        Exit::Failure
    }
}

/// One backend's line: its name (a member's `name@address`), index, pool
/// and state now.
fn say_state(b: &Value) {
    let name = match &b["resolved_from"] {
        Value::Null => s(&b["name"]),
        _ => format!("{}@{}", s(&b["name"]), s(&b["address"])),
    };
    say!(
        "backend {name} ({}) in pool {} is now {}",
        s(&b["index"]),
        s(&b["pool"]),
        s(&b["state"])
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An id goes whole into the path: a member's label as it is, and a
    /// mistyped `?`, `#` or `/` encoded rather than ending the segment.
    #[test]
    fn an_id_reaches_the_path_whole() {
        assert_eq!(in_path("app@[2001:db8::1]:8080"), "app@[2001:db8::1]:8080");
        assert_eq!(in_path("web-1.a_b"), "web-1.a_b");
        assert_eq!(in_path("a?b#c/d e"), "a%3Fb%23c%2Fd%20e");
    }

    #[test]
    fn a_503_is_sent_again_until_served_within_the_budget() {
        let mut answers = vec![
            (200, "ok".to_string()),
            (503, String::new()),
            (503, String::new()),
        ];
        let mut calls = 0;
        let got = sent_again_while_handed_over(
            || {
                calls += 1;
                Ok(answers.pop().expect("an answer"))
            },
            Duration::from_secs(5),
            Duration::from_millis(1),
        );
        assert_eq!(got, Ok((200, "ok".to_string())));
        assert_eq!(calls, 3);
    }

    #[test]
    fn a_503_past_the_budget_is_the_answer() {
        let mut calls = 0;
        let got = sent_again_while_handed_over(
            || {
                calls += 1;
                Ok((503, "handed over".to_string()))
            },
            Duration::from_millis(200),
            Duration::from_millis(50),
        );
        assert_eq!(got, Ok((503, "handed over".to_string())));
        assert!(calls <= 5, "at most one call a pause: {calls} calls");
    }

    #[test]
    fn other_answers_and_failures_are_not_sent_again() {
        let mut calls = 0;
        let got = sent_again_while_handed_over(
            || {
                calls += 1;
                Ok((404, String::new()))
            },
            Duration::from_secs(5),
            Duration::from_millis(1),
        );
        assert_eq!(got, Ok((404, String::new())));
        let unreachable = sent_again_while_handed_over(
            || Err(Exit::Unreachable),
            Duration::from_secs(5),
            Duration::from_millis(1),
        );
        assert_eq!(unreachable, Err(Exit::Unreachable));
        assert_eq!(calls, 1);
    }
}
