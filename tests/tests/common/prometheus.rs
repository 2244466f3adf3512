//! Prometheus pages as Prometheus reads them: fetched over HTTP, parsed by the official
//! client's parser (`prometheus_client`, through `scripts/parse_metrics.py`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use millrace_tests::{venv_python, wait_until, KillOnDrop};
use serde_json::Value;

/// A process serving `--metrics-addr 127.0.0.1:0`, its log read as it runs.
pub struct Served {
    /// Killed when the test ends, also when it fails.
    pub child: KillOnDrop,
    /// The address it logged.
    pub addr: String,
    /// Every line it logged (stderr).
    pub log: Arc<Mutex<Vec<String>>>,
    /// The thread reading the log: done once the process has exited.
    pub reader: JoinHandle<()>,
}

/// Spawns `cmd` with its stderr piped and read line by line, and waits (up to 60 s)
/// for the metrics address it logs.
pub fn serving(cmd: &mut Command) -> Served {
    let mut child = KillOnDrop::spawn(cmd.stderr(Stdio::piped()));
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let log = Arc::clone(&log);
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log.lock().unwrap().push(line);
            }
        })
    };
    let mut addr = None;
    wait_until(
        "the process logs its metrics address",
        Duration::from_secs(60),
        || {
            addr = log.lock().unwrap().iter().find_map(|l| metrics_addr(l));
            addr.is_some()
        },
    );
    Served {
        child,
        addr: addr.unwrap(),
        log,
        reader,
    }
}

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
