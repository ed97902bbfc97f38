//! Choosing one backend among candidates: pure functions over a snapshot, so
//! each strategy is testable without sockets. `ticket` is a per-pool counter
//! that drives round robin and seeds the random choice.

use std::sync::Arc;

use super::Backend;
use crate::config::Balance;

/// Index into `candidates` of the chosen backend.
pub fn choose(balance: Balance, candidates: &[&Arc<Backend>], ticket: usize) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let n = candidates.len();
    Some(match balance {
        Balance::RoundRobin => ticket % n,
        Balance::LeastConn => least_loaded(candidates, (0..n).map(|i| (ticket + i) % n)),
        Balance::RandomTwo => {
            let a = mix(ticket as u64) as usize % n;
            let b = mix(ticket as u64 ^ 0x9e37_79b9_7f4a_7c15) as usize % n;
            least_loaded(candidates, [a, b].into_iter())
        }
    })
}

/// The candidate with the fewest in-flight per unit of weight; ties go to
/// the first in `order` (which rotates, so ties spread).
fn least_loaded(candidates: &[&Arc<Backend>], order: impl Iterator<Item = usize>) -> usize {
    let load =
        |i: usize| candidates[i].in_flight() as u64 * 1000 / u64::from(candidates[i].weight.max(1));
    order.min_by_key(|&i| load(i)).unwrap_or(0)
}

/// splitmix64: a cheap, well-spread hash for the two random choices.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
