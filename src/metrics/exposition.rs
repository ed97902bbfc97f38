//! Counters that never go backwards across generations. The Prometheus
//! recorder cannot be seeded, so a generation carries a *baseline*: the
//! counter and histogram series its predecessor reported (cumulative, its
//! own plus its own predecessors'), added to ours when `/metrics` renders.
//! Everything works on the text exposition format, the one thing every
//! generation (and every binary version) agrees on. A baseline keeps only
//! the series of listeners, pools and backends the config still names
//! ([`Configured`]), so what a reload removed is not carried forever.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::BACKEND_IN_FLIGHT;

/// One carried series: its family, kind and value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Series {
    pub family: String,
    pub kind: String,
    pub value: f64,
    /// The family's help text, for a family only the baseline has.
    #[serde(default)]
    pub help: Option<String>,
}

/// Series by their full sample key (`name{labels}`).
pub type Baseline = BTreeMap<String, Series>;

/// Requests and connections in flight on backends, by pool name, then
/// backend label (as metrics name it), for those with any: what an older
/// generation still has on each, which the serving one adds to its own in
/// `/status` and `baton_backend_in_flight`, as `baton_connections_active`
/// shows theirs under `state="draining"`.
pub type InFlightOnBackends = BTreeMap<String, BTreeMap<String, u64>>;

/// Families whose values are the kernel's absolute numbers, already the
/// same in every generation: never added up.
fn carried(family: &str, kind: &str) -> bool {
    (kind == "counter" || kind == "histogram") && !family.starts_with("baton_kernel_")
}

/// The names a config gives the `listener`, `pool` and `backend` labels.
#[derive(Debug, Clone, Default)]
pub struct Configured {
    pub listeners: HashSet<String>,
    /// Backend names by pool name (a backend is named within its pool).
    pub pools: HashMap<String, HashSet<String>>,
}

impl Configured {
    /// Whether every listener, pool and backend label `key` has is one the
    /// config names (a key with none of them always is). A member resolved
    /// from DNS (`app1@10.0.0.5:8080`) counts as its name's: config names
    /// never hold an '@'.
    pub fn names(&self, key: &str) -> bool {
        let labels = labels(key);
        let label = |name: &str| label_value(&labels, name);
        let backends = label("pool").map(|p| self.pools.get(p));
        label("listener").is_none_or(|l| self.listeners.contains(l))
            && backends.is_none_or(|b| b.is_some())
            && label("backend").is_none_or(|b| {
                let name = b.rsplit_once('@').map_or(b, |(name, _)| name);
                backends.flatten().is_some_and(|names| names.contains(name))
            })
    }
}

/// The older generation's newer report (`next`), with every series its
/// earlier one (`previous`) had and this one lacks at its last value: a
/// carried series is a counter's, which only grows, so one the older
/// generation stops reporting (a DNS member it retired during the handoff,
/// which ours still has) would otherwise go backwards by all of its count
/// on a series `/metrics` still shows.
pub fn keep_dropped(next: &mut Baseline, previous: Baseline) {
    for (key, series) in previous {
        next.entry(key).or_insert(series);
    }
}

/// Drops the series of listeners, pools and backends no longer configured.
pub fn retain_configured(baseline: &mut Baseline, configured: &Configured) {
    baseline.retain(|key, _| configured.names(key));
}

/// Drops what counts nothing: a counter at zero, a histogram whose count
/// is zero (whole: its buckets and sum with it). Carried, it adds nothing
/// to a series of our own, and keeps one we do not make: an older
/// release made every listener's series for every pool at zero, which a
/// reload onto this one would otherwise carry until a restart.
pub fn drop_idle(baseline: &mut Baseline) {
    let idle_histograms: HashSet<String> = baseline
        .iter()
        .filter(|(key, s)| {
            s.kind == "histogram"
                && s.value == 0.0
                && key.starts_with(&format!("{}_count", s.family))
        })
        .map(|(key, s)| histogram_of(key, &s.family))
        .collect();
    baseline.retain(|key, s| match s.kind.as_str() {
        "histogram" => !idle_histograms.contains(&histogram_of(key, &s.family)),
        _ => s.value != 0.0,
    });
}

/// A histogram sample's family and labels but `le`: what its bucket, sum
/// and count share (`f_bucket{a="x",le="1"}` → `f{a="x"}`).
fn histogram_of(key: &str, family: &str) -> String {
    let rest = key.strip_prefix(family).unwrap_or(key);
    let labels = rest.find('{').map_or("", |at| &rest[at..]);
    let kept: Vec<String> = labels_raw(labels)
        .into_iter()
        .filter(|l| !l.starts_with("le="))
        .collect();
    if kept.is_empty() {
        family.to_string()
    } else {
        format!("{family}{{{}}}", kept.join(","))
    }
}

/// A sample's `{...}` split into its `name="value"` parts as written
/// (a comma inside a quoted value kept).
fn labels_raw(braced: &str) -> Vec<String> {
    let inner = braced
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or("");
    let mut parts = Vec::new();
    let (mut part, mut quoted, mut escaped) = (String::new(), false, false);
    for c in inner.chars() {
        match c {
            ',' if !quoted => parts.push(std::mem::take(&mut part)),
            _ => {
                if c == '"' && !escaped {
                    quoted = !quoted;
                }
                escaped = c == '\\' && !escaped;
                part.push(c);
            }
        }
    }
    if !part.is_empty() {
        parts.push(part);
    }
    parts
}

/// The members DNS gave each pool (their `backend` label, `name@address`)
/// that are in it now. The recorder cannot drop a series, so those of a
/// member gone from its pool are left out of `/metrics` and of what a
/// successor carries: with addresses that churn (autoscaling, a headless
/// service) the exposition would otherwise grow for good. An address that
/// comes back shows its series again.
#[derive(Debug, Clone, Default)]
pub struct Members(HashMap<String, HashSet<String>>);

impl Members {
    pub fn insert(&mut self, pool: &str, label: &str) {
        self.0
            .entry(pool.to_string())
            .or_default()
            .insert(label.to_string());
    }

    /// Whether `key` is no series of a member gone from its pool.
    pub fn keeps(&self, key: &str) -> bool {
        // Only a member's label holds an '@' (config names never do).
        if !key.contains('@') {
            return true;
        }
        let labels = labels(key);
        let label = |name: &str| label_value(&labels, name);
        match (label("pool"), label("backend")) {
            (Some(pool), Some(backend)) if backend.contains('@') => {
                self.0.get(pool).is_some_and(|m| m.contains(backend))
            }
            _ => true,
        }
    }
}

/// `text` without the samples of what is gone: members gone from their
/// pool (see [`Members`]), and listeners not in `listeners`, such as the
/// draining count this generation keeps for a listener a reload removed,
/// once no older generation has connections on it (the recorder cannot
/// drop a series; shown at 0 for good, it contradicted "the series of a
/// removed listener leave `/metrics`"). One pass for both.
pub fn without_gone(text: String, members: &Members, listeners: &HashSet<String>) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let key = line.rsplit_once(' ').map_or(line, |(key, _)| key);
        if line.starts_with('#') || (members.keeps(key) && listener_kept(key, listeners)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether `key` has no `listener` label, or one in `listeners`.
fn listener_kept(key: &str, listeners: &HashSet<String>) -> bool {
    !key.contains("listener=\"")
        || label_value(&labels(key), "listener").is_none_or(|l| listeners.contains(l))
}

/// The value of label `name` among `labels`.
fn label_value<'a>(labels: &'a [(&str, String)], name: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

/// The labels of a sample key (`name{a="x",b="y"}`), values unescaped.
fn labels(key: &str) -> Vec<(&str, String)> {
    let Some((_, mut rest)) = key.split_once('{') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Some((name, after)) = rest.split_once("=\"") {
        let name = name.trim_start_matches([',', ' ']);
        let mut value = String::new();
        let mut end = after.len();
        let mut chars = after.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    end = i + 1;
                    break;
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, escaped)) => value.push(escaped),
                    None => {}
                },
                _ => value.push(c),
            }
        }
        out.push((name, value));
        rest = &after[end..];
    }
    out
}

struct Family {
    name: String,
    kind: String,
    help: Option<String>,
    samples: Vec<(String, f64)>,
}

fn parse(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    let mut help: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name.to_string(), text.to_string()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let help_text = help.take().filter(|(n, _)| n == name).map(|(_, h)| h);
            families.push(Family {
                name: name.to_string(),
                kind: kind.to_string(),
                help: help_text,
                samples: Vec::new(),
            });
        } else if !line.is_empty() && !line.starts_with('#') {
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            match families.last_mut() {
                Some(f) if key.starts_with(&f.name) => f.samples.push((key.to_string(), value)),
                _ => families.push(Family {
                    name: sample_name(key).to_string(),
                    kind: "untyped".into(),
                    help: None,
                    samples: vec![(key.to_string(), value)],
                }),
            }
        }
    }
    families
}

fn sample_name(key: &str) -> &str {
    key.split_once('{').map_or(key, |(n, _)| n)
}

/// The carried series of a rendered exposition.
pub fn baseline(text: &str) -> Baseline {
    let mut out = Baseline::new();
    for f in parse(text) {
        if !carried(&f.name, &f.kind) {
            continue;
        }
        for (key, value) in f.samples {
            out.insert(
                key,
                Series {
                    family: f.name.clone(),
                    kind: f.kind.clone(),
                    help: f.help.clone(),
                    value,
                },
            );
        }
    }
    out
}

/// Our rendered exposition with `baseline` added: matching series summed,
/// series only the baseline has appended to their family (or to a new one).
pub fn merge(own: &str, baseline: &Baseline) -> String {
    let mut families = parse(own);
    let mut unmatched: BTreeMap<&str, Vec<(&str, &Series)>> = BTreeMap::new();
    let own_keys: std::collections::HashSet<String> = families
        .iter()
        .flat_map(|f| f.samples.iter().map(|(k, _)| k.clone()))
        .collect();
    for (key, series) in baseline {
        if !own_keys.contains(key) {
            unmatched
                .entry(series.family.as_str())
                .or_default()
                .push((key, series));
        }
    }
    for f in &mut families {
        if !carried(&f.name, &f.kind) {
            continue;
        }
        for (key, value) in &mut f.samples {
            if let Some(s) = baseline.get(key.as_str()) {
                *value += s.value;
            }
        }
        if let Some(extra) = unmatched.remove(f.name.as_str()) {
            let mut extra: Vec<(String, f64)> = extra
                .into_iter()
                .map(|(k, s)| (k.to_string(), s.value))
                .collect();
            in_exposition_order(&f.name, &mut extra);
            f.samples.extend(extra);
        }
    }
    // A family ours has with another kind (a later version changed it)
    // is ours alone: a second `# TYPE` line for one name makes Prometheus
    // refuse the whole scrape.
    unmatched.retain(|family, _| !families.iter().any(|f| f.name == *family));
    for (family, extra) in unmatched {
        let kind = extra
            .first()
            .map_or("counter", |(_, s)| s.kind.as_str())
            .to_string();
        let help = extra.first().and_then(|(_, s)| s.help.clone());
        let mut samples: Vec<(String, f64)> = extra
            .into_iter()
            .map(|(k, s)| (k.to_string(), s.value))
            .collect();
        in_exposition_order(family, &mut samples);
        families.push(Family {
            name: family.to_string(),
            kind,
            help,
            samples,
        });
    }
    render(&families)
}

/// `samples` of `family` in the order an exposition gives them: the
/// baseline keeps them by key, which put a histogram's `+Inf` bucket
/// first, `le="10"` before `le="2.5"`, and its `_count` before its
/// `_sum`, interleaving label sets; parsers that build a histogram as its
/// lines come (OpenMetrics' rule) took it for several broken ones. Each
/// label set's buckets by bound, then `_sum`, then `_count`.
/// Each sample's place is worked out once (it parses the labels), not at
/// every comparison.
fn in_exposition_order(family: &str, samples: &mut Vec<(String, f64)>) {
    let mut placed: Vec<_> = samples
        .drain(..)
        .map(|sample| (exposition_rank(family, &sample.0), sample))
        .collect();
    placed.sort_by(|(a, _), (b, _)| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.total_cmp(&b.2)));
    samples.extend(placed.into_iter().map(|(_, sample)| sample));
}

/// A sample's place: its labels but `le`, its suffix's rank, its bound.
fn exposition_rank(family: &str, key: &str) -> (Vec<(String, String)>, u8, f64) {
    let name = sample_name(key);
    let rank = match name.strip_prefix(family) {
        Some("_bucket") => 0,
        Some("_sum") => 1,
        Some("_count") => 2,
        _ => 0,
    };
    let mut bound = f64::NEG_INFINITY;
    let mut others = Vec::new();
    for (label, value) in labels(key) {
        if label == "le" {
            bound = match value.as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or(f64::INFINITY),
            };
        } else {
            others.push((label.to_string(), value));
        }
    }
    (others, rank, bound)
}

/// `text` with what older generations still have in flight on each
/// backend added to that backend's `baton_backend_in_flight`, for the
/// backends this generation has too (a gauge is ours alone otherwise: it
/// is never carried). A backend a reload removed shows no older work.
pub fn with_older_in_flight(text: String, older: &InFlightOnBackends) -> String {
    if older.is_empty() {
        return text;
    }
    let mut families = parse(&text);
    for f in families.iter_mut().filter(|f| f.name == BACKEND_IN_FLIGHT) {
        for (key, value) in &mut f.samples {
            let labels = labels(key);
            let held = label_value(&labels, "pool")
                .and_then(|pool| older.get(pool))
                .zip(label_value(&labels, "backend"))
                .and_then(|(backends, backend)| backends.get(backend));
            if let Some(n) = held {
                *value += *n as f64;
            }
        }
    }
    render(&families)
}

fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families {
        if let Some(h) = &f.help {
            let _ = writeln!(out, "# HELP {} {h}", f.name);
        }
        if f.kind != "untyped" {
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        }
        for (key, value) in &f.samples {
            let _ = writeln!(out, "{key} {}", number(*value));
        }
        out.push('\n');
    }
    out
}

fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "# HELP baton_requests_total Requests.\n# TYPE baton_requests_total counter\nbaton_requests_total{code=\"2xx\"} 10\nbaton_requests_total{code=\"5xx\"} 1\n\n# TYPE baton_generation gauge\nbaton_generation 1\n\n# TYPE baton_kernel_listen_drops_total counter\nbaton_kernel_listen_drops_total 7\n\n# TYPE baton_d_seconds histogram\nbaton_d_seconds_bucket{le=\"0.1\"} 3\nbaton_d_seconds_bucket{le=\"+Inf\"} 4\nbaton_d_seconds_sum 0.5\nbaton_d_seconds_count 4\n";
    const NEW: &str = "# HELP baton_requests_total Requests.\n# TYPE baton_requests_total counter\nbaton_requests_total{code=\"2xx\"} 2\n\n# TYPE baton_generation gauge\nbaton_generation 2\n\n# TYPE baton_kernel_listen_drops_total counter\nbaton_kernel_listen_drops_total 7\n";

    #[test]
    fn counters_and_histograms_add_up_and_gauges_do_not() {
        let merged = merge(NEW, &baseline(OLD));
        assert!(
            merged.contains("baton_requests_total{code=\"2xx\"} 12\n"),
            "{merged}"
        );
        assert!(
            merged.contains("baton_requests_total{code=\"5xx\"} 1\n"),
            "{merged}"
        );
        assert!(merged.contains("baton_generation 2\n"), "{merged}");
        assert!(
            merged.contains("baton_kernel_listen_drops_total 7\n"),
            "{merged}"
        );
        assert!(
            merged.contains(
                "# TYPE baton_d_seconds histogram\nbaton_d_seconds_bucket{le=\"0.1\"} 3\n\
                 baton_d_seconds_bucket{le=\"+Inf\"} 4\nbaton_d_seconds_sum 0.5\n\
                 baton_d_seconds_count 4\n"
            ),
            "{merged}"
        );
        assert!(merged.contains("# HELP baton_requests_total Requests.\n"));
    }

    /// One label set of histogram `baton_d_seconds`, in exposition order.
    fn histogram(pool: &str, counts: [u32; 3], sum: u32) -> String {
        let [a, b, all] = counts;
        format!(
            "baton_d_seconds_bucket{{pool=\"{pool}\",le=\"2.5\"}} {a}\n\
             baton_d_seconds_bucket{{pool=\"{pool}\",le=\"10\"}} {b}\n\
             baton_d_seconds_bucket{{pool=\"{pool}\",le=\"+Inf\"}} {all}\n\
             baton_d_seconds_sum{{pool=\"{pool}\"}} {sum}\n\
             baton_d_seconds_count{{pool=\"{pool}\"}} {all}\n"
        )
    }

    #[test]
    fn histogram_series_only_the_baseline_has_render_in_exposition_order() {
        let kind = "# TYPE baton_d_seconds histogram\n";
        let old = format!(
            "{kind}{}{}",
            histogram("a", [1, 2, 3], 9),
            histogram("b", [4, 5, 6], 7)
        );
        let ours = format!("{kind}{}", histogram("a", [1, 1, 1], 1));
        let merged = merge(&ours, &baseline(&old));
        let want = format!(
            "{kind}{}{}\n",
            histogram("a", [2, 3, 4], 10),
            histogram("b", [4, 5, 6], 7)
        );
        assert_eq!(merged, want);
        let alone = merge("", &baseline(&old));
        assert_eq!(alone, format!("{old}\n"));
    }

    /// What counts nothing is not carried: a counter at zero, a histogram
    /// whose count is zero, whole; a histogram that counted keeps its
    /// buckets at zero too, and a label value with a comma is one label.
    #[test]
    fn idle_series_are_not_carried() {
        let old = format!(
            "# TYPE baton_x counter\nbaton_x{{a=\"1\"}} 0\nbaton_x{{a=\"2\"}} 4\n# TYPE baton_d_seconds histogram\n{}{}{}",
            histogram("idle", [0, 0, 0], 0),
            histogram("used", [0, 2, 2], 5),
            histogram("x\\\",le=\\\"y", [0, 0, 0], 0),
        );
        let mut carried = baseline(&old);
        drop_idle(&mut carried);
        let keys: Vec<&str> = carried.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "baton_d_seconds_bucket{pool=\"used\",le=\"+Inf\"}",
                "baton_d_seconds_bucket{pool=\"used\",le=\"10\"}",
                "baton_d_seconds_bucket{pool=\"used\",le=\"2.5\"}",
                "baton_d_seconds_count{pool=\"used\"}",
                "baton_d_seconds_sum{pool=\"used\"}",
                "baton_x{a=\"2\"}",
            ]
        );
    }

    #[test]
    fn a_family_whose_kind_changed_is_typed_once() {
        let old = "# TYPE baton_x counter\nbaton_x{a=\"1\"} 5\n";
        let ours = "# TYPE baton_x gauge\nbaton_x 1\n";
        let merged = merge(ours, &baseline(old));
        assert_eq!(merged, format!("{ours}\n"));
    }

    #[test]
    fn series_of_what_the_config_no_longer_names_are_dropped() {
        let configured = Configured {
            listeners: HashSet::from(["web".to_string()]),
            pools: HashMap::from([("app".to_string(), HashSet::from(["a-0".to_string()]))]),
        };
        let keys = [
            (
                "baton_requests_total{listener=\"web\",pool=\"app\",code=\"2xx\"}",
                true,
            ),
            (
                "baton_requests_total{listener=\"old\",pool=\"app\",code=\"2xx\"}",
                false,
            ),
            (
                "baton_requests_total{listener=\"web\",pool=\"gone\",code=\"2xx\"}",
                false,
            ),
            (
                "baton_upstream_errors_total{pool=\"app\",backend=\"a-0\",kind=\"connect\"}",
                true,
            ),
            (
                "baton_upstream_errors_total{pool=\"app\",backend=\"a-1\",kind=\"connect\"}",
                false,
            ),
            (
                "baton_upstream_errors_total{pool=\"gone\",backend=\"a-0\",kind=\"connect\"}",
                false,
            ),
            (
                "baton_health_checks_total{pool=\"app\",backend=\"a-0@10.0.0.5:80\",result=\"ok\"}",
                true,
            ),
            (
                "baton_health_checks_total{pool=\"app\",backend=\"a-1@10.0.0.5:80\",result=\"ok\"}",
                false,
            ),
            ("baton_d_seconds_bucket{listener=\"web\",le=\"+Inf\"}", true),
            ("baton_reloads_total{result=\"success\"}", true),
            ("baton_generation", true),
            ("baton_x{listener=\"w\\\"eb\",pool=\"app\"}", false),
        ];
        for (key, kept) in keys {
            assert_eq!(configured.names(key), kept, "{key}");
        }
        assert_eq!(
            labels("x{a=\"1,b=\\\"2\\\"\",c=\"\"}"),
            vec![("a", "1,b=\"2\"".to_string()), ("c", String::new())]
        );
        let mut carried = baseline(OLD);
        let before = carried.len();
        retain_configured(&mut carried, &Configured::default());
        assert_eq!(carried.len(), before, "OLD has no such labels");
    }

    /// A series the older generation stops reporting keeps its last
    /// value; one it reports again takes the new value.
    #[test]
    fn a_series_the_older_generation_stops_reporting_keeps_its_count() {
        let earlier = "# TYPE baton_health_checks_total counter\nbaton_health_checks_total{pool=\"app\",backend=\"app@10.0.0.1:80\",result=\"ok\"} 100\nbaton_health_checks_total{pool=\"app\",backend=\"ip\",result=\"ok\"} 7\n\n";
        let later = "# TYPE baton_health_checks_total counter\nbaton_health_checks_total{pool=\"app\",backend=\"ip\",result=\"ok\"} 9\n\n";
        let mut next = baseline(later);
        keep_dropped(&mut next, baseline(earlier));
        let own = "# TYPE baton_health_checks_total counter\nbaton_health_checks_total{pool=\"app\",backend=\"app@10.0.0.1:80\",result=\"ok\"} 3\n\n";
        let shown = merge(own, &next);
        assert!(
            shown.contains("backend=\"app@10.0.0.1:80\",result=\"ok\"} 103\n"),
            "{shown}"
        );
        assert!(
            shown.contains("backend=\"ip\",result=\"ok\"} 9\n"),
            "{shown}"
        );
    }

    #[test]
    fn a_baseline_is_cumulative_through_generations() {
        let second = merge(NEW, &baseline(OLD));
        let third = merge("", &baseline(&second));
        assert!(
            third.contains("baton_requests_total{code=\"2xx\"} 12\n"),
            "{third}"
        );
    }

    #[test]
    fn series_of_members_gone_from_their_pool_are_left_out() {
        let text = "# TYPE baton_backend_in_flight gauge\nbaton_backend_in_flight{pool=\"app\",backend=\"app@10.0.0.1:80\"} 0\nbaton_backend_in_flight{pool=\"app\",backend=\"app@10.0.0.2:80\"} 1\nbaton_backend_in_flight{pool=\"app\",backend=\"ip\"} 2\n\n";
        let mut members = Members::default();
        members.insert("app", "app@10.0.0.2:80");
        let kept = without_gone(text.to_string(), &members, &HashSet::new());
        assert!(!kept.contains("10.0.0.1"), "{kept}");
        assert!(kept.contains("backend=\"app@10.0.0.2:80\"} 1\n"), "{kept}");
        assert!(kept.contains("backend=\"ip\"} 2\n"), "{kept}");
        assert!(kept.starts_with("# TYPE baton_backend_in_flight gauge\n"));
    }

    #[test]
    fn older_generations_work_in_flight_adds_to_the_backends_we_have() {
        let text = "# TYPE baton_backend_in_flight gauge\nbaton_backend_in_flight{pool=\"app\",backend=\"a\"} 1\nbaton_backend_in_flight{pool=\"app\",backend=\"b\"} 0\n\n# TYPE baton_generation gauge\nbaton_generation 2\n\n";
        let older = InFlightOnBackends::from([
            (
                "app".to_string(),
                BTreeMap::from([("a".to_string(), 2), ("gone".to_string(), 5)]),
            ),
            ("other".to_string(), BTreeMap::from([("b".to_string(), 7)])),
        ]);
        let shown = with_older_in_flight(text.to_string(), &older);
        assert!(
            shown.contains("baton_backend_in_flight{pool=\"app\",backend=\"a\"} 3\n"),
            "{shown}"
        );
        assert!(
            shown.contains("baton_backend_in_flight{pool=\"app\",backend=\"b\"} 0\n"),
            "{shown}"
        );
        assert!(!shown.contains("gone"), "{shown}");
        assert!(shown.contains("baton_generation 2\n"), "{shown}");
        assert_eq!(
            with_older_in_flight(text.to_string(), &InFlightOnBackends::new()),
            text
        );
    }

    #[test]
    fn series_of_listeners_not_kept_are_left_out() {
        let text = "baton_connections_active{listener=\"web\",state=\"draining\"} 0\nbaton_connections_active{listener=\"old\",state=\"draining\"} 0\nbaton_generation 2\n";
        let listeners = HashSet::from(["web".to_string()]);
        let kept = without_gone(text.to_string(), &Members::default(), &listeners);
        assert_eq!(
            kept,
            "baton_connections_active{listener=\"web\",state=\"draining\"} 0\nbaton_generation 2\n"
        );
    }
}
