//! The config loader on arbitrary text: any input is a `Config` or a
//! `ConfigError` naming the problem, never a panic.
#![no_main]

use std::path::Path;

use baton::config::{parse, Overrides};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Err(err) = parse(text, Path::new("fuzz.toml"), &Overrides::default()) {
        // Rendering the error walks every problem it lists.
        let _ = err.to_string();
    }
});
