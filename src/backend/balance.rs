//! Choosing one backend: smooth weighted round robin (nginx's), least
//! in-flight per weight, or the better of two weighted random choices.
//! Functions over the pool's backends and a small pick state, so each
//! strategy is testable without sockets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Backend;
use crate::config::Balance;
use crate::splitmix::mix;
use crate::workers::PerWorker;
use crossbeam_utils::CachePadded;

/// Per-pool state the strategies keep between picks, one for each worker
/// on a cache line of its own: each worker balances its own requests, as
/// each nginx worker does (without a `zone`). One for every worker bounced
/// its lock between their cores at every pick; a load spread over the
/// workers is spread the same over the backends.
pub struct PickState {
    per_worker: PerWorker<WorkerPicks>,
}

struct WorkerPicks {
    /// Smooth round robin's current weights, by backend position.
    current: Mutex<Weights>,
    /// Drives the random choices.
    ticket: AtomicU64,
}

impl PickState {
    /// Worker N starts where a shared state would be after N picks, so the
    /// first requests of different workers go to different backends (two
    /// at once on a fresh pool of two reach both; later, two workers'
    /// picks may meet on one backend, each worker's own round still exact),
    /// and its tickets start apart from every other worker's.
    pub fn new(backends: &[Arc<Backend>], workers: usize) -> PickState {
        PickState {
            per_worker: PerWorker::new(workers, |worker| {
                let picks = WorkerPicks {
                    current: Mutex::new(Weights::zero(backends.len())),
                    ticket: AtomicU64::new(worker as u64 * ((1 << 32) + 1)),
                };
                for _ in 0..worker {
                    smooth_weighted(backends, 0..backends.len(), &picks);
                }
                picks
            }),
        }
    }
}

/// Smooth round robin's weights, by backend position, in cache-padded
/// blocks: every pick writes them, and two workers' weights on one line
/// would send it from core to core (whatever the allocator).
struct Weights(Vec<CachePadded<[i64; PER_BLOCK]>>);

/// How many weights one block holds (128 bytes: `CachePadded`'s size on
/// x86-64).
const PER_BLOCK: usize = 16;

impl Weights {
    fn zero(backends: usize) -> Weights {
        Weights(
            (0..backends.div_ceil(PER_BLOCK))
                .map(|_| CachePadded::new([0; PER_BLOCK]))
                .collect(),
        )
    }
}

impl std::ops::Index<usize> for Weights {
    type Output = i64;

    fn index(&self, backend: usize) -> &i64 {
        &self.0[backend / PER_BLOCK][backend % PER_BLOCK]
    }
}

impl std::ops::IndexMut<usize> for Weights {
    fn index_mut(&mut self, backend: usize) -> &mut i64 {
        &mut self.0[backend / PER_BLOCK][backend % PER_BLOCK]
    }
}

/// Position in `backends` of the chosen one among those `eligible`. It runs
/// per request, so candidates are walked as an iterator, never collected.
pub fn choose(
    balance: Balance,
    backends: &[Arc<Backend>],
    state: &PickState,
    eligible: impl Fn(&Backend) -> bool,
) -> Option<usize> {
    let candidates = (0..backends.len()).filter(|&i| eligible(&backends[i]));
    let state = state.per_worker.mine();
    match balance {
        Balance::RoundRobin => smooth_weighted(backends, candidates, state),
        Balance::LeastConn => {
            // The least loaded; among several (idle backends, at low load
            // most of all) weights decide, in smooth round robin as nginx
            // does: in turn, a weight-1 canary beside a weight-99 backend
            // took half of the work whenever both were idle. One alone at
            // the floor (the rule under load) is taken at once.
            let (least, floor, tied) = floor_of(backends, candidates.clone())?;
            if tied == 1 {
                return Some(least);
            }
            // Loads read again may have moved (none left at the floor):
            // the least loaded of the first reading.
            let at_floor = candidates.filter(|&i| load(&backends[i]) == floor);
            smooth_weighted(backends, at_floor, state).or(Some(least))
        }
        Balance::RandomTwo => {
            // Two different backends, as the power of two choices has it:
            // drawn with replacement, both draws were the same backend as
            // often as not among two, and a loaded one took a quarter of
            // the work it should have been spared.
            let ticket = state.ticket.fetch_add(1, Ordering::Relaxed);
            let a = weighted_sample(backends, candidates.clone(), mix(ticket))?;
            let others = candidates.filter(move |&i| i != a);
            let b = weighted_sample(backends, others, mix(ticket ^ 0xdead_beef_cafe_f00d));
            least_loaded(backends, std::iter::once(a).chain(b))
        }
    }
}

/// nginx's smooth weighted round robin: each pick raises every candidate by
/// its weight, takes the highest, and lowers it by the total. Over any
/// window of total-weight picks, each gets exactly its weight, interleaved.
fn smooth_weighted(
    backends: &[Arc<Backend>],
    mut candidates: impl Iterator<Item = usize> + Clone,
    state: &WorkerPicks,
) -> Option<usize> {
    let Ok(mut current) = state.current.lock() else {
        return candidates.next();
    };
    let mut total = 0i64;
    let mut best: Option<usize> = None;
    for i in candidates {
        let w = i64::from(backends[i].weight());
        current[i] += w;
        total += w;
        if best.is_none_or(|b| current[i] > current[b]) {
            best = Some(i);
        }
    }
    if let Some(b) = best {
        current[b] -= total;
    }
    best
}

/// The candidate with the fewest in-flight per unit of weight; ties go to
/// the first in `order`.
fn least_loaded(backends: &[Arc<Backend>], order: impl Iterator<Item = usize>) -> Option<usize> {
    order.min_by_key(|&i| load(&backends[i]))
}

/// The first least loaded candidate, its load, and how many share it.
fn floor_of(
    backends: &[Arc<Backend>],
    candidates: impl Iterator<Item = usize>,
) -> Option<(usize, u64, usize)> {
    let mut best: Option<(usize, u64, usize)> = None;
    for i in candidates {
        let l = load(&backends[i]);
        best = match best {
            Some((_, floor, _)) if l < floor => Some((i, l, 1)),
            Some((first, floor, tied)) if l == floor => Some((first, floor, tied + 1)),
            Some(kept) => Some(kept),
            None => Some((i, l, 1)),
        };
    }
    best
}

/// A backend's work in flight per unit of weight (in millionths).
fn load(backend: &Backend) -> u64 {
    backend.in_flight() as u64 * 1_000_000 / u64::from(backend.weight().max(1))
}

/// A candidate drawn with probability proportional to its weight.
fn weighted_sample(
    backends: &[Arc<Backend>],
    candidates: impl Iterator<Item = usize> + Clone,
    random: u64,
) -> Option<usize> {
    let total: u64 = candidates
        .clone()
        .map(|i| u64::from(backends[i].weight()))
        .sum();
    let mut r = random % total.max(1);
    let mut first = None;
    for i in candidates {
        first.get_or_insert(i);
        let w = u64::from(backends[i].weight());
        if r < w {
            return Some(i);
        }
        r -= w;
    }
    // A backend turned unavailable mid-pick: take the first still there.
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Pool;
    use crate::config::{BackendConfig, PoolConfig};

    fn pool(balance: Balance, weights: &[u32]) -> Pool {
        pool_for(balance, weights, 1)
    }

    fn pool_for(balance: Balance, weights: &[u32], workers: usize) -> Pool {
        let backends = weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| BackendConfig {
                name: format!("b{i}"),
                address: ([127, 0, 0, 1], 9000 + i as u16).into(),
                weight,
            })
            .collect();
        Pool::new(
            &PoolConfig {
                name: "p".into(),
                balance,
                health: None,
                backends,
                max_connections_per_backend: 0,
                queue_timeout: std::time::Duration::from_secs(1),
                tls: None,
                send_proxy: None,
                named: Vec::new(),
                resolve_interval: std::time::Duration::from_secs(30),
            },
            0,
            Arc::new(std::sync::atomic::AtomicUsize::new(weights.len())),
            workers,
        )
    }

    fn shares(p: &Pool, n: usize) -> Vec<f64> {
        let mut counts = vec![0usize; p.backends().backends.len()];
        for _ in 0..n {
            let lease = p.pick(None).expect("a backend");
            counts[lease.backend().index] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn smooth_round_robin_is_exact_and_interleaved() {
        let p = pool(Balance::RoundRobin, &[1, 2, 3]);
        let order: Vec<usize> = (0..6)
            .map(|_| p.pick(None).expect("pick").backend().index)
            .collect();
        assert_eq!(order, vec![2, 1, 0, 2, 1, 2], "nginx's sequence for 1:2:3");
        let s = shares(&p, 6000);
        assert_eq!(s, vec![1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]);
    }

    #[test]
    fn smooth_round_robin_is_exact_past_sixteen_backends() {
        let mut weights = vec![1; 16];
        weights.extend([2, 3]);
        let p = pool(Balance::RoundRobin, &weights);
        let expected: Vec<f64> = weights.iter().map(|&w| f64::from(w) / 21.0).collect();
        assert_eq!(shares(&p, 2100), expected);
    }

    #[test]
    fn weights_fill_whole_cache_lines_of_their_own() {
        let mut weights = Weights::zero(17);
        let padding = std::mem::align_of::<CachePadded<[i64; PER_BLOCK]>>();
        assert!(padding >= 64);
        assert_eq!(weights.0.as_ptr() as usize % padding, 0, "starts a line");
        assert_eq!(
            std::mem::size_of_val(weights.0.as_slice()) % padding,
            0,
            "ends one"
        );
        for i in 0..17 {
            weights[i] = i as i64 + 1;
        }
        assert_eq!(weights.0[0][15], 16);
        assert_eq!(weights.0[1][0], 17);
    }

    /// Each worker keeps its own round robin, started where one shared
    /// would be after as many picks as its number: the first request on
    /// each of two workers goes to a backend of its own, and each worker's
    /// picks are exact by weight.
    #[tokio::test]
    async fn each_worker_balances_its_own_picks_from_its_own_start() {
        let p = Arc::new(pool_for(Balance::RoundRobin, &[1, 1, 2], 2));
        let workers =
            crate::workers::Workers::start(2, false, std::time::Duration::ZERO).expect("workers");
        let mut firsts = Vec::new();
        for worker in 0..2 {
            let p = Arc::clone(&p);
            let (first, shares) = workers
                .for_shard(worker)
                .spawn(async move {
                    let first = p.pick(None).expect("pick").backend().index;
                    (first, shares(&p, 4000))
                })
                .await
                .expect("worker");
            assert_eq!(shares, vec![0.25, 0.25, 0.5], "worker {worker}");
            firsts.push(first);
        }
        assert_eq!(firsts, vec![2, 0], "nginx's sequence for 1:1:2 begins 2, 0");
    }

    #[test]
    fn random_two_follows_weights_loosely() {
        let p = pool(Balance::RandomTwo, &[1, 2, 3]);
        let s = shares(&p, 10_000);
        for (got, want) in s.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
            assert!(
                (got - want).abs() < 0.02,
                "within 2 points of the weight share: {s:?}"
            );
        }
    }

    /// The two candidates are two different backends: a loaded one beside
    /// an idle one takes no new work (drawn with replacement, it took a
    /// quarter).
    #[test]
    fn random_two_compares_two_different_backends() {
        let p = pool(Balance::RandomTwo, &[1, 1]);
        let held: Vec<_> = (0..5).map(|_| p.pick(Some(1)).expect("pick")).collect();
        assert!(held.iter().all(|l| l.backend().index == 0));
        assert_eq!(shares(&p, 400), vec![0.0, 1.0]);
    }

    /// Idle backends (each pick here is let go at once) share the work
    /// by weight, as round robin does, not in turn.
    #[test]
    fn least_conn_among_idle_backends_follows_weights() {
        let p = pool(Balance::LeastConn, &[1, 3]);
        assert_eq!(shares(&p, 4000), vec![0.25, 0.75]);
    }

    #[test]
    fn least_conn_avoids_a_loaded_backend() {
        let p = pool(Balance::LeastConn, &[1, 1, 1]);
        let held: Vec<_> = (0..5).map(|_| p.pick(Some(1)).expect("pick")).collect();
        assert!(held.iter().all(|l| l.backend().index != 1));
        let mut more = Vec::new();
        for _ in 0..2 {
            let l = p.pick(None).expect("pick");
            assert_eq!(l.backend().index, 1, "the idle backend takes new work");
            more.push(l);
        }
    }

    /// A pick that found the backend available just before an operator's
    /// drain, which saw nothing in flight and said `out`, does not then
    /// send it work.
    #[test]
    fn a_place_taken_after_a_drain_said_out_is_let_go() {
        let p = pool(Balance::RoundRobin, &[1]);
        let backend = Arc::clone(&p.backends().backends[0]);
        assert!(backend.available(), "what the pick saw");
        assert_eq!(backend.drain().as_str(), "out", "nothing was in flight");
        assert!(crate::backend::Lease::within(&backend, 0).is_none());
        assert_eq!(backend.in_flight(), 0);
        assert_eq!(backend.state().as_str(), "out");
    }

    #[test]
    fn a_drained_backend_gets_nothing_and_goes_out_when_idle() {
        let p = pool(Balance::RoundRobin, &[1, 1]);
        let held = p.pick(Some(1)).expect("pick");
        assert_eq!(held.backend().index, 0);
        assert_eq!(p.backends().backends[0].drain().as_str(), "draining");
        for _ in 0..10 {
            assert_eq!(p.pick(None).expect("pick").backend().index, 1);
        }
        drop(held);
        assert_eq!(p.backends().backends[0].state().as_str(), "out");
        assert_eq!(
            p.backends().backends[0].restore().as_str(),
            "up",
            "without health checks it is back at once"
        );
        assert!(p.pick(Some(1)).is_some());
    }
}
