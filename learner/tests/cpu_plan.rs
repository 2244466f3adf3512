//! The CPU plan as a running `learner` keeps it: each thread's affinity, read from
//! `/proc` while it trains, is what the plan in its `config.json` says; `--actors auto`
//! starts the actor threads it decided; a narrower affinity mask (a cpuset, `taskset`)
//! is honoured; `--cpu-plan off` pins nothing. Linux only (`/proc`).
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use millrace_tests::{read_json, KillOnDrop};
use serde_json::Value;

/// A CartPole run that trains until it is killed.
fn learner(logdir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_learner"));
    c.args([
        "--no-progress",
        "--target-return",
        "1000",
        "--max-steps",
        "100000000",
    ])
    .arg("--logdir")
    .arg(logdir)
    .args(extra)
    .env("RUST_LOG", "warn")
    .env_remove("MILLRACE_INJECT_FAULT")
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

/// Waits until the run's configuration is written and its learner thread has
/// started (it takes a thread named `learner`).
fn wait_for_threads(pid: u32, logdir: &Path, actors: usize) -> BTreeMap<String, String> {
    let start = Instant::now();
    loop {
        let threads = threads(pid);
        let started = threads.contains_key("learner")
            && (0..actors).all(|i| threads.contains_key(&format!("actor-{i}")));
        if started && logdir.join("checkpoint/config.json").exists() {
            return threads;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the learner's threads did not start within 120 s: {threads:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each named thread of process `pid` and its affinity mask (`sched_getaffinity`), as
/// `taskset` writes it. The main thread goes in as `main`: its name is the binary's,
/// `learner`, which the learner thread has too. Two other threads of one name go in as
/// one entry, their masks joined by `|` where they differ (the assertions then fail
/// and show both).
fn threads(pid: u32) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        let name = if tid as u32 == pid {
            "main".to_string()
        } else {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            comm.trim().to_string()
        };
        // A thread that ended since the listing has no mask: left out.
        let Some(mask) = millrace_learner::cpu_plan::host::affinity_of(tid) else {
            continue;
        };
        let mask = millrace_learner::cpu_plan::list(&mask);
        match out.get_mut(&name) {
            Some(seen) if !seen.split('|').any(|m| m == mask) => *seen = format!("{seen}|{mask}"),
            Some(_) => {}
            None => {
                out.insert(name, mask);
            }
        }
    }
    out
}

/// A plan's CPU set as the kernel writes it.
fn list(v: &Value) -> String {
    let ids: Vec<usize> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    millrace_learner::cpu_plan::list(&ids)
}

#[test]
fn threads_run_where_the_plan_says_and_auto_starts_what_it_decided() {
    let dir = tempfile::tempdir().unwrap();
    let child = KillOnDrop::spawn(&mut learner(dir.path(), &["--actors", "auto"]));
    let logdir = dir.path();
    // The plan and the decision are in config.json, written once they are made.
    let start = Instant::now();
    while !logdir.join("checkpoint/config.json").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no config.json");
        std::thread::sleep(Duration::from_millis(50));
    }
    let config = read_json(&logdir.join("checkpoint/config.json"));
    let chosen = &config["actors"]["auto"]["chosen"];
    let count = config["actors"]["count"].as_u64().unwrap() as usize;
    assert_eq!(chosen["threads"].as_u64(), Some(count as u64), "{config}");
    assert!(chosen["learner_updates_per_s"].as_f64().unwrap() > 0.0);
    assert!(chosen["actor_steps_per_s"].as_f64().unwrap() > 0.0);
    assert!((1..=chosen["budget"].as_u64().unwrap() as usize).contains(&count));
    let threads = wait_for_threads(child.id(), logdir, count);
    let plan = &config["cpu_plan"];
    let allowed = list(&plan["allowed"]);
    if plan["learner"].as_array().unwrap().is_empty() {
        // One CPU: nothing pinned.
        assert_eq!(threads["learner"], allowed, "{threads:?}");
        return;
    }
    assert_eq!(threads["learner"], list(&plan["learner"]), "{threads:?}");
    for i in 0..count {
        assert_eq!(
            threads[&format!("actor-{i}")],
            list(&plan["actors"]),
            "{threads:?}"
        );
    }
    for service in ["main", "prefetch", "publish", "checkpoint", "eval"] {
        assert_eq!(
            threads[service],
            list(&plan["service"]),
            "{service}: {threads:?}"
        );
    }
}

#[test]
fn a_narrower_mask_is_honoured_and_off_pins_nothing() {
    let mine = millrace_learner::cpu_plan::host::affinity().unwrap();
    // Started on the first CPU alone, as `taskset -c 0` or a one-CPU cpuset would.
    let dir = tempfile::tempdir().unwrap();
    let first = mine[0];
    let mut cmd = learner(dir.path(), &[]);
    // SAFETY: between fork and exec only sched_setaffinity runs (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(first, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = KillOnDrop::spawn(&mut cmd);
    let threads = wait_for_threads(child.id(), dir.path(), 1);
    let config = read_json(&dir.path().join("checkpoint/config.json"));
    assert_eq!(config["cpu_plan"]["allowed"], serde_json::json!([first]));
    assert!(
        threads.values().all(|l| *l == first.to_string()),
        "all on CPU {first}: {threads:?}"
    );
    drop(child);

    // --cpu-plan off: every thread keeps the whole mask.
    let dir = tempfile::tempdir().unwrap();
    let child = KillOnDrop::spawn(&mut learner(dir.path(), &["--cpu-plan", "off"]));
    let threads = wait_for_threads(child.id(), dir.path(), 1);
    let whole = millrace_learner::cpu_plan::list(&mine);
    assert!(
        threads.values().all(|l| *l == whole),
        "all on {whole}: {threads:?}"
    );
    let config = read_json(&dir.path().join("checkpoint/config.json"));
    assert_eq!(config["cpu_plan"]["learner"], serde_json::json!([]));
}
