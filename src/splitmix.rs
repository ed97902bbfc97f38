//! splitmix64: a cheap, well-spread mixer, where baton spreads things out
//! without an RNG dependency (backends picked at random, health checks and
//! drain closes scattered in time).

use std::sync::atomic::{AtomicU64, Ordering};

/// The sequence's step (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// `x` mixed: nearby inputs give unrelated outputs.
pub fn mix(x: u64) -> u64 {
    let mut x = x.wrapping_add(GAMMA);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The next number of the sequence `state` keeps (each user keeps its own).
pub fn next(state: &AtomicU64) -> u64 {
    mix(state.fetch_add(GAMMA, Ordering::Relaxed))
}

/// A number in [0, 1) from `x`'s top 53 bits.
pub fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_a_spread() {
        // splitmix64's published first output for seed 0.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        let state = AtomicU64::new(1);
        let draws: Vec<f64> = (0..1000).map(|_| unit(next(&state))).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let low = draws.iter().filter(|d| **d < 0.5).count();
        assert!((400..600).contains(&low), "{low} of 1000 below one half");
    }
}
