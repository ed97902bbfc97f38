//! Shared helpers for the integration tests: real backends on 127.0.0.1,
//! the real `baton` binary, real clients. Each test binary uses a subset,
//! hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod backend;
pub mod client;
pub mod daemon;
pub mod load;
pub mod raw;
pub mod sandbox;

use std::time::Duration;

/// The bound on every wait in the tests: generous, since CI machines are noisy.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `check` every 20 ms until it holds or `TIMEOUT` passes.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}
