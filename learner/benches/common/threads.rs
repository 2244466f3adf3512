//! CPU time per thread of this process, from `/proc/self/task/*/stat` (Linux): what each
//! kind of thread (learner, sampler, publisher, actors, …) used over a window, in cores.

use std::collections::BTreeMap;
use std::time::Instant;

/// Every thread's name and CPU seconds (user + system) at one instant.
pub struct Snapshot {
    at: Instant,
    /// tid → (name, CPU seconds).
    threads: BTreeMap<u64, (String, f64)>,
}

/// Clock ticks per second, for `/proc`'s `utime` and `stime`.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// `utime + stime` in seconds from one `stat` line (fields 14 and 15, counted after the
/// parenthesised name, which may hold spaces).
fn cpu_seconds(stat: &str, ticks: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks)
}

impl Snapshot {
    pub fn now() -> Self {
        let ticks = ticks_per_s();
        let mut threads = BTreeMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for entry in dir.flatten() {
                let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                let path = entry.path();
                let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
                let cpu = std::fs::read_to_string(path.join("stat"))
                    .ok()
                    .and_then(|s| cpu_seconds(&s, ticks));
                if let Some(cpu) = cpu {
                    threads.insert(tid, (name.trim().to_string(), cpu));
                }
            }
        }
        Self {
            at: Instant::now(),
            threads,
        }
    }

    /// Cores' worth of CPU each kind of thread used between `self` and `later`, by
    /// the kind `kind` gives a thread's name (threads that ended in between are not
    /// counted; threads that started count from zero).
    pub fn cores_since(
        &self,
        later: &Snapshot,
        kind: impl Fn(&str) -> String,
    ) -> BTreeMap<String, f64> {
        let dt = (later.at - self.at).as_secs_f64().max(1e-9);
        let mut out = BTreeMap::new();
        for (tid, (name, cpu)) in &later.threads {
            let before = self.threads.get(tid).map_or(0.0, |(_, c)| *c);
            *out.entry(kind(name)).or_insert(0.0) += (cpu - before) / dt;
        }
        out
    }
}
