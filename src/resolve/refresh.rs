//! Keeping named backends current while a generation runs: one task per
//! named backend resolves, makes the pool's members match the answer, and
//! sleeps until the records expire, clamped to [1 s, `resolve_interval`]
//! (a shorter interval is its own floor); one task per pool sweeps drained
//! members out meanwhile. A failure keeps the last good set, an answer of no address
//! for the pool's hold. The tasks stop with the generation's other
//! background work.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Failure, Resolver};
use crate::backend::members::{Joining, Resolved};
use crate::backend::named::Named;
use crate::backend::{probe, Pool};
use crate::config::DnsQuery;
use crate::lifecycle::handoff::{CarriedAddress, ResolvedCarry};
use crate::metrics;

/// How often drained members are looked for between resolutions.
const SWEEP: Duration = Duration::from_millis(250);

/// The resolver a config needs (none when no backend is named by DNS).
pub fn resolver_for(config: &crate::config::Config) -> Option<Resolver> {
    if config.pools.iter().all(|p| p.named.is_empty()) {
        return None;
    }
    Some(Resolver::new(&config.resolver))
}

/// Gives each named backend its first members before the generation
/// serves: the set an older generation carried over (so a reload while DNS
/// is down starts full), else one resolution now, bounded by the time its
/// queries in turn may take (`Resolver::answer_within`; DNS down at a
/// first start leaves the name empty, and the rest of the config serves).
/// Not waited for past `cut` (a stop during a first start): the lookups
/// go on, and their answers apply when they come.
pub async fn first_members(
    pools: &[Arc<Pool>],
    resolver: &Resolver,
    carried: &[ResolvedCarry],
    cut: impl std::future::Future<Output = ()>,
) {
    let mut lookups = tokio::task::JoinSet::new();
    for pool in pools {
        for named in &pool.named {
            let query = named.query.to_string();
            let kept = carried
                .iter()
                .find(|c| c.pool == pool.name && c.name == named.name && c.query == query);
            match kept {
                Some(c) => {
                    let resolved: Vec<Resolved> =
                        c.resolved.iter().map(|a| carried_in(a, named)).collect();
                    named.answer(resolved.clone());
                    if let Some(ms) = c.empty_ms {
                        let last = Duration::from_millis(c.empty_last_ms.unwrap_or(0));
                        named.empty_earlier(Duration::from_millis(ms), last);
                    }
                    let gone = still_gone(&c.serving, &resolved);
                    if !gone.is_empty() {
                        // A move in progress: the members still serving
                        // join too (first, as they came first), then vanish
                        // from the answer as they had (their hold counted
                        // from when they did), and retire once it is over
                        // and another can take work.
                        let mut all: Vec<Resolved> =
                            gone.iter().map(|a| carried_in(a, named)).collect();
                        all.extend(resolved.iter().cloned());
                        pool.apply(named, &all, Joining::AtStart);
                    }
                    pool.apply(named, &resolved, Joining::AtStart);
                    for gone in gone {
                        let gone_for = Duration::from_millis(gone.gone_ms);
                        pool.gone_earlier(named, gone.address, gone_for);
                    }
                }
                None => {
                    let (pool, named) = (Arc::clone(pool), Arc::clone(named));
                    let resolver = resolver.clone();
                    lookups.spawn(async move {
                        let bound = resolver.answer_within(&named.query);
                        let first = async {
                            let next = once(&pool, &named, &resolver, Joining::AtStart, None).await;
                            named.ask_again_at(tokio::time::Instant::now() + next);
                        };
                        if tokio::time::timeout(bound, first).await.is_err() {
                            tracing::warn!(pool = %pool.name, backend = %named.name, "no DNS answer at start; the name has no backends until one comes");
                        }
                    });
                }
            }
        }
    }
    let all_in = async { while lookups.join_next().await.is_some() {} };
    // In this order: lookups all answered are waited for no longer.
    let stopped = tokio::select! {
        biased;
        () = all_in => false,
        () = cut => true,
    };
    if stopped {
        tracing::info!(
            running = lookups.len(),
            "stop signal during start-up: not waiting for the first DNS answers; those still to come apply when they do"
        );
        lookups.detach_all();
    }
}

/// Starts re-resolving every named backend, and sweeping each pool that
/// has any; stops when `stop` is cancelled.
pub fn spawn_all(pools: &[Arc<Pool>], resolver: &Resolver, stop: &CancellationToken) {
    for pool in pools {
        if !pool.named.is_empty() {
            tokio::spawn(sweeping(Arc::clone(pool), stop.clone()));
        }
        for named in &pool.named {
            tokio::spawn(run(
                Arc::clone(pool),
                Arc::clone(named),
                resolver.clone(),
                stop.clone(),
            ));
        }
    }
}

/// The last good answers, and the members still serving from earlier
/// ones, for the next generation.
pub fn carry_out(pools: &[Arc<Pool>]) -> Vec<ResolvedCarry> {
    pools
        .iter()
        .flat_map(|p| p.named.iter().map(move |n| (p, n)))
        .filter_map(|(p, n)| {
            let empty = n.empty_for(p.obsolete_hold());
            n.last().map(|resolved| ResolvedCarry {
                pool: p.name.clone(),
                name: n.name.clone(),
                query: n.query.to_string(),
                resolved: resolved
                    .into_iter()
                    .map(|r| carried_out(r, Duration::ZERO))
                    .collect(),
                serving: p
                    .still_serving(n)
                    .into_iter()
                    .map(|(r, gone_for)| carried_out(r, gone_for))
                    .collect(),
                empty_ms: empty.map(|(run, _)| millis(run)),
                empty_last_ms: empty.map(|(_, last)| millis(last)),
            })
        })
        .collect()
}

/// The members still serving from earlier answers that the last answer
/// does not hold. One it holds again (it came back just as the old
/// generation handed over) is a member once, as the answer has it, not
/// twice (twice the weight, and one of them retired as gone).
fn still_gone<'a>(serving: &'a [CarriedAddress], resolved: &[Resolved]) -> Vec<&'a CarriedAddress> {
    serving
        .iter()
        .filter(|s| !resolved.iter().any(|r| r.address == s.address))
        .collect()
}

/// An address the old generation handed over, for `named` as this
/// generation's config has it: a host name's members take the weight
/// configured now (a reload that changed it while DNS is down must not
/// keep the old one until DNS answers); an SRV record's stays its own.
fn carried_in(a: &CarriedAddress, named: &Named) -> Resolved {
    let weight = match named.query {
        DnsQuery::Host { .. } => named.weight,
        DnsQuery::Srv(_) => a.weight,
    };
    Resolved {
        address: a.address,
        weight,
        from: a.from.clone(),
    }
}

fn carried_out(r: Resolved, gone_for: Duration) -> CarriedAddress {
    CarriedAddress {
        address: r.address,
        weight: r.weight,
        from: r.from,
        gone_ms: millis(gone_for),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn run(pool: Arc<Pool>, named: Arc<Named>, resolver: Resolver, stop: CancellationToken) {
    if let Some(at) = named.take_ask_again_at() {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(at) => {}
        }
    }
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = once(&pool, &named, &resolver, Joining::Serving, Some(&stop)) => next,
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// Sweeps `pool` between resolutions: once a pool, not once a name (a
/// pool of 500 names swept itself 2,000 times a second, each sweep a walk
/// of every member).
async fn sweeping(pool: Arc<Pool>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SWEEP) => pool.sweep(),
        }
    }
}

/// Resolves `named` once and applies the answer to its pool, starting
/// health checks of members that join (with `checks`, while serving).
/// Returns when to resolve again.
async fn once(
    pool: &Pool,
    named: &Named,
    resolver: &Resolver,
    joining: Joining,
    checks: Option<&CancellationToken>,
) -> Duration {
    let interval = pool.resolve_interval;
    match resolver.resolve(named).await {
        Ok(answer) => {
            taken(pool, named, &answer);
            let joined = pool.apply(named, &answer.resolved, joining);
            if let Some(stop) = checks {
                for member in &joined {
                    probe::spawn_member(pool, member, stop);
                }
            }
            answer
                .valid_for
                .clamp(interval.min(Duration::from_secs(1)), interval)
        }
        Err(failure) => after_failure(pool, named, &failure),
    }
}

/// Keeps `answer` as the name's last good one, counted and said: whole,
/// it ends a run of failures; with an SRV target's failure in it, it goes
/// on (warned once).
fn taken(pool: &Pool, named: &Named, answer: &super::Answer) {
    match &answer.partly_failed {
        None => {
            metrics::dns_resolution(&pool.name, "ok");
            if named.answer(answer.resolved.clone()) {
                tracing::info!(pool = %pool.name, backend = %named.name, "DNS answers again");
            }
        }
        Some(failure) => {
            metrics::dns_resolution(&pool.name, failure.result());
            named.keep(answer.resolved.clone());
            if named.failed() {
                tracing::warn!(pool = %pool.name, backend = %named.name, query = %named.query, cause = %failure, "DNS failed for some SRV targets; keeping their last good addresses and following the others");
            }
        }
    }
}

/// Counts and says a resolution that gave no set (once per outage), holds
/// or retires the members after an answer of no address, and returns when
/// to ask again: a name without members (it never answered, or its answer
/// was no address for the hold) has no set to keep, so it is asked again
/// soon, not a whole interval on, and its backends serve seconds after DNS
/// gives them (at boot, say), not up to 30 s later.
fn after_failure(pool: &Pool, named: &Named, failure: &Failure) -> Duration {
    metrics::dns_resolution(&pool.name, failure.result());
    let no_address = matches!(failure, Failure::Empty(_));
    // Of an answer of no address, not when it emptied the name already
    // (carried empty by every reload, which would say it again each
    // time). A name that never answered is said of (a typo must not be
    // silent).
    let kept = named.kept();
    let emptied = kept == Some(0);
    if named.failed() && !(emptied && no_address) {
        let kept = kept.unwrap_or(0);
        if no_address {
            tracing::warn!(pool = %pool.name, backend = %named.name, query = %named.query, cause = %failure, kept, hold_s = pool.obsolete_hold().as_secs_f64(), "DNS says the name has no address; keeping the last good set for the hold, then its members drain");
        } else {
            tracing::warn!(pool = %pool.name, backend = %named.name, query = %named.query, cause = %failure, kept, "DNS resolution failed; keeping the last good set");
        }
    }
    if no_address {
        retire_once_empty_for_the_hold(pool, named);
    }
    if named.kept().unwrap_or(0) > 0 {
        pool.resolve_interval
    } else {
        pool.resolve_interval.min(super::ASK_AGAIN_SOON)
    }
}

/// DNS says `named` has no address (NXDOMAIN, no records, SRV's target
/// "."): its last good set is kept for the pool's hold (an answer cut
/// short once, a zone being reloaded), then its members retire. Kept for
/// good, they sent work on to addresses the name no longer gives (a
/// Kubernetes service scaled to zero, whose pods' addresses go to
/// others); HAProxy's `hold nx` bounds it too. A failure (SERVFAIL, no
/// answer) says nothing of the name and keeps the set.
fn retire_once_empty_for_the_hold(pool: &Pool, named: &Named) {
    let empty_for = named.answered_empty(pool.obsolete_hold());
    if empty_for < pool.obsolete_hold() || named.kept().unwrap_or(0) == 0 {
        return;
    }
    named.emptied();
    let retired = pool.retire_all_of(named);
    tracing::warn!(pool = %pool.name, backend = %named.name, query = %named.query, empty_s = empty_for.as_secs_f64(), retired, "DNS has said for the hold that the name has no address; draining its members");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(address: &str, gone_ms: u64) -> CarriedAddress {
        CarriedAddress {
            address: address.parse().expect("address"),
            weight: 1,
            from: "app.test:80".into(),
            gone_ms,
        }
    }

    #[test]
    fn a_serving_address_back_in_the_answer_is_not_carried_as_gone() {
        let serving = [carried("10.0.0.1:80", 300), carried("10.0.0.2:80", 100)];
        let resolved = [Resolved {
            address: "10.0.0.2:80".parse().expect("address"),
            weight: 1,
            from: "app.test:80".into(),
        }];
        let gone: Vec<_> = still_gone(&serving, &resolved)
            .iter()
            .map(|a| a.address.to_string())
            .collect();
        assert_eq!(gone, ["10.0.0.1:80"]);
    }
}
