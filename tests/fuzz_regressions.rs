//! Replays the fuzzers' inputs as ordinary tests: every seed decodes (they
//! are real configs and messages), and every hostile input in
//! `tests/fuzz/regressions/TARGET/` (hand-picked edge cases, and anything a
//! fuzzer once crashed on) is refused with an error, not a panic.

use std::path::{Path, PathBuf};

use baton::config::{parse, Overrides};
use baton::lifecycle::{control, framing, handoff};

fn inputs(dir: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz")
        .join(dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read input");
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

/// A handoff message as a channel receives it: `bytes` cut into datagrams
/// at each newline, put back together, then decoded.
fn receive(bytes: &[u8]) -> Result<handoff::Message, String> {
    let mut pieces = framing::Reassembly::default();
    let mut whole = None;
    for datagram in bytes.split(|b| *b == b'\n') {
        whole = pieces.push(datagram).map_err(|e| e.to_string())?;
    }
    let body = whole.ok_or("the message never ended")?;
    handoff::decode(&body).map_err(|e| e.to_string())
}

fn load_config(bytes: &[u8]) -> Result<baton::config::Config, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    parse(text, Path::new("fuzz.toml"), &Overrides::default()).map_err(|e| e.to_string())
}

#[test]
fn the_config_seed_loads() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/baton.toml");
    let bytes = std::fs::read(&example).expect("the example config");
    if let Err(e) = load_config(&bytes) {
        panic!("{}: {e}", example.display());
    }
}

#[test]
fn every_message_seed_decodes_as_one_or_the_other() {
    let seeds = inputs("seeds/messages");
    assert!(seeds.len() >= 4);
    for (path, bytes) in seeds {
        let handoff = receive(&bytes);
        let control = control::decode_request(&bytes);
        assert!(
            handoff.is_ok() != control.is_ok(),
            "{}: handoff {handoff:?}, control {:?}",
            path.display(),
            control.map_err(|r| r.message)
        );
    }
}

/// Hostile inputs (deep nesting, huge numbers, a future protocol version,
/// pieces of a message out of order) and whatever a fuzzer once crashed on: each is refused with an error.
#[test]
fn hostile_inputs_are_refused_not_panicked_on() {
    let configs = inputs("regressions/config");
    let messages = inputs("regressions/messages");
    assert!(!configs.is_empty() && !messages.is_empty());
    for (path, bytes) in configs {
        assert!(load_config(&bytes).is_err(), "{}", path.display());
    }
    for (path, bytes) in messages {
        assert!(handoff::decode(&bytes).is_err(), "{}", path.display());
        assert!(receive(&bytes).is_err(), "{}", path.display());
        assert!(
            control::decode_request(&bytes).is_err(),
            "{}",
            path.display()
        );
    }
}
