//! Prometheus pages as Prometheus reads them: fetched over HTTP, parsed by the official
//! client's parser (`prometheus_client`, through `scripts/parse_metrics.py`).

use std::process::{Command, Stdio};
use std::time::Duration;

use millrace_tests::venv_python;
use serde_json::Value;

/// The address a process logged as `metrics on http://ADDR/metrics`.
pub fn metrics_addr(line: &str) -> Option<String> {
    let at = line.find("metrics on http://")? + "metrics on http://".len();
    let rest = &line[at..];
    Some(rest[..rest.find("/metrics")?].to_string())
}

pub fn page(addr: &str) -> String {
    millrace_telemetry::check(addr, "/metrics", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("GET {addr}/metrics: {e}"))
}

/// The page parsed by `prometheus_client`: families by name.
pub fn parsed(text: &str) -> serde_json::Map<String, Value> {
    let mut child = Command::new(venv_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/parse_metrics.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client rejects the page: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["families"].as_object().unwrap().clone()
}

/// The family a sample name belongs to (`prometheus_client` names a counter's family
/// without its `_total`).
pub fn family<'a>(f: &'a serde_json::Map<String, Value>, name: &str) -> &'a Value {
    f.get(name)
        .or_else(|| f.get(name.trim_end_matches("_total")))
        .unwrap_or_else(|| panic!("no family {name} in {:?}", f.keys().collect::<Vec<_>>()))
}

/// The one sample named `name` whose labels include `labels`; its value.
pub fn value(f: &serde_json::Map<String, Value>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let fam = family(f, name);
    fam["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name && labels.iter().all(|(k, v)| s["labels"][k] == *v))
        .and_then(|s| s["value"].as_f64())
        .unwrap_or_else(|| panic!("{name}{labels:?}: no numeric sample in {fam}"))
}

pub fn kind(f: &serde_json::Map<String, Value>, name: &str) -> String {
    family(f, name)["type"].as_str().unwrap().to_string()
}
