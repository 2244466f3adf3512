//! `docs/reference/metrics.md` held against what the processes serve and write: each of
//! its tables lists names (first column) and when they appear (the *when* column).

use std::collections::BTreeSet;
use std::process::Command;

use millrace_tests::venv_python;
use serde_json::Value;

/// The `(name, when)` rows of the table under the heading `## {section}`.
pub fn documented(section: &str) -> Vec<(String, String)> {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/reference/metrics.md"
    ))
    .expect("docs/reference/metrics.md");
    let heading = format!("## {section}");
    let rows: Vec<(String, String)> = page
        .lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            // The when column is the second last.
            let when = cells.get(cells.len().checked_sub(3)?)?;
            Some((name.to_string(), when.to_string()))
        })
        .collect();
    assert!(!rows.is_empty(), "no table under {heading:?} in metrics.md");
    rows
}

/// Whether `name` is what `pattern` documents (`<id>` stands for a number).
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once("<id>") {
        None => pattern == name,
        Some((head, tail)) => name
            .strip_prefix(head)
            .and_then(|rest| rest.strip_suffix(tail))
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// Every served name is in the section's table, and every row whose *when* is one of
/// `now` (the conditions the caller's run meets) is served.
pub fn assert_documented(section: &str, served: &BTreeSet<String>, now: &[&str]) {
    let rows = documented(section);
    let missing: Vec<&String> = served
        .iter()
        .filter(|n| !rows.iter().any(|(p, _)| matches(p, n)))
        .collect();
    assert!(
        missing.is_empty(),
        "served but not in docs/reference/metrics.md, \"{section}\": {missing:?}"
    );
    let absent: Vec<&String> = rows
        .iter()
        .filter(|(p, when)| now.contains(&when.as_str()) && !served.iter().any(|n| matches(p, n)))
        .map(|(p, _)| p)
        .collect();
    assert!(
        absent.is_empty(),
        "docs/reference/metrics.md, \"{section}\", lists these as served, but they are not: {absent:?}"
    );
}

/// The sample names of a page `prometheus_client` parsed.
pub fn sample_names(families: &serde_json::Map<String, Value>) -> BTreeSet<String> {
    families
        .values()
        .flat_map(|f| f["samples"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

/// The scalar tags in a log directory, read by TensorBoard's own event reader.
pub fn tensorboard_tags(logdir: &std::path::Path) -> BTreeSet<String> {
    let out = Command::new(venv_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../bench/check_tensorboard.py"
        ))
        .arg(logdir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "TensorBoard's reader: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn placeholders_stand_for_numbers() {
    assert!(matches("actor/<id>/version_lag", "actor/12/version_lag"));
    assert!(!matches("actor/<id>/version_lag", "actor//version_lag"));
    assert!(!matches("actor/<id>/version_lag", "actor/x/version_lag"));
    assert!(matches("perf/duty_cycle", "perf/duty_cycle"));
}
