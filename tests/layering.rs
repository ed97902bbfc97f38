//! The layout the README promises, checked on the source itself: no two
//! top-level modules import each other, directly or round a longer loop
//! (every `crate::module` path outside test code counts), and the
//! lifecycle knows nothing of proxying.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its non-test code names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut pending = vec![src.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let Some(module) = top_module(&src, &path) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let named = graph.entry(module.clone()).or_default();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
                    .unwrap_or(rest.len());
                let target = &rest[..end];
                if !target.is_empty() && target != module {
                    named.insert(target.to_string());
                }
            }
        }
    }
    graph
}

/// `src/proxy/h1/relay.rs` → `proxy`; the crate roots have none.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    if file.extension().is_none_or(|e| e != "rs") {
        return None;
    }
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let module = first.trim_end_matches(".rs");
    (!["lib", "main", "build"].contains(&module)).then(|| module.to_string())
}

/// A loop through `start`, if there is one: the path back to it.
fn loop_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().cloned().unwrap_or_default();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                let mut found = path.clone();
                found.push(next.clone());
                return Some(found);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    assert!(graph.len() > 10, "the source was read: {:?}", graph.keys());
    let loops: Vec<String> = graph
        .keys()
        .filter_map(|m| loop_through(&graph, m))
        .map(|l| l.join(" -> "))
        .collect();
    assert!(loops.is_empty(), "import loops: {loops:#?}");
}

#[test]
fn the_lifecycle_knows_nothing_of_proxying() {
    let graph = imports();
    let lifecycle = graph.get("lifecycle").expect("a lifecycle module");
    for data_plane in ["listener", "connection", "proxy", "backend", "admin"] {
        assert!(
            !lifecycle.contains(data_plane),
            "lifecycle imports {data_plane}: {lifecycle:?}"
        );
    }
}
