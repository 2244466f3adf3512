//! Replay throughput with priorities against uniform, side by side in one run: inserts
//! (batches of 256 transitions, with and without actors' initial priorities), samples
//! (batches of 64 and 256) and priority updates by key (batches of 64), on a table of
//! CartPole-sized rows (16 bytes) and one of MinAtar-sized rows (400 bytes).
//!
//! `cargo bench -p millrace-replay --bench priorities [-- --secs 2 --rounds 3]`: each
//! measurement runs `--secs` seconds; the kinds alternate for `--rounds` rounds and the
//! median of each is printed, with prioritized ÷ uniform.

use std::time::{Duration, Instant};

use millrace_proto::TransitionBatch;
use millrace_replay::{PriorityConfig, RateLimiterConfig, ReplayConfig, SampleScratch, Table};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CAPACITY: usize = 1 << 20;
const INSERT_ROWS: usize = 256;

fn table(row_bytes: usize, prioritized: bool) -> Table {
    Table::new(&ReplayConfig {
        capacity: CAPACITY,
        shards: 4,
        obs_row_bytes: row_bytes,
        stack: 1,
        obs_rows_per_item: ReplayConfig::obs_rows_for(8, 3, INSERT_ROWS),
        // Neither side ever waits.
        limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e18, 256).unwrap(),
        priority: prioritized.then_some(PriorityConfig {
            alpha: 0.6,
            beta: 0.4,
        }),
    })
    .unwrap()
}

/// An actor's batch: 8 environments' chains, with priorities if asked.
fn batch(row_bytes: usize, seq: u64, priorities: bool, rng: &mut SmallRng) -> TransitionBatch {
    let envs = 8;
    let per_env = INSERT_ROWS / envs;
    let mut b = TransitionBatch::with_capacity(row_bytes, INSERT_ROWS, INSERT_ROWS + envs);
    let row = vec![7u8; row_bytes];
    for e in 0..envs {
        let base = b.obs_rows() as u32;
        for _ in 0..=per_env {
            b.push_obs_bytes(&row);
        }
        for i in 0..per_env as u32 {
            b.push_transition(base + i, (e % 2) as i64, 1.0, 0.97, base + i + 1);
        }
    }
    b.seq = seq;
    if priorities {
        b.priorities = (0..INSERT_ROWS)
            .map(|_| rng.random::<f32>() * 4.0)
            .collect();
    }
    b
}

/// Runs `op` for `secs`; returns items per second (`op` returns items done).
fn rate(secs: f64, mut op: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut items = 0;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        for _ in 0..16 {
            items += op();
        }
    }
    items as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One measurement of every operation on a table of `row_bytes` rows.
fn measure(row_bytes: usize, prioritized: bool, secs: f64) -> Vec<(String, f64)> {
    let t = table(row_bytes, prioritized);
    let mut rng = SmallRng::seed_from_u64(1);
    let batches: Vec<TransitionBatch> = (0..64)
        .map(|i| batch(row_bytes, i, prioritized, &mut rng))
        .collect();
    // Fill to capacity first: inserts then evict as in a long run.
    let mut seq = 0u64;
    while t.len() + INSERT_ROWS <= CAPACITY {
        let mut b = batches[seq as usize % batches.len()].clone();
        b.seq = seq;
        t.insert(&b).unwrap();
        seq += 1;
    }
    let mut results = Vec::new();
    let mut i = 0usize;
    let insert = rate(secs, || {
        let b = &batches[i % batches.len()];
        i += 1;
        // Round-robin over shards as actors' batches go.
        t.insert(b).unwrap();
        INSERT_ROWS
    });
    results.push(("insert 256".to_string(), insert));
    for rows in [64, 256] {
        let mut out = SampleScratch::new(rows, row_bytes);
        let sample = rate(secs, || {
            t.sample(&mut rng, &mut out.buffers()).unwrap();
            rows
        });
        results.push((format!("sample {rows}"), sample));
    }
    let mut out = SampleScratch::new(64, row_bytes);
    let mut td = vec![0f32; 64];
    let update = rate(secs, || {
        t.sample(&mut rng, &mut out.buffers()).unwrap();
        td.iter_mut().for_each(|p| *p = rng.random::<f32>() * 4.0);
        t.update_priorities(&millrace_replay::PriorityUpdate {
            keys: out.keys.to_vec(),
            priorities: td.to_vec(),
        });
        64
    });
    results.push(("sample 64 + update 64".to_string(), update));
    results
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: f64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (secs, rounds) = (flag("--secs", 1.0), flag("--rounds", 3.0) as usize);
    println!(
        "replay throughput, items/s (median of {rounds} alternating rounds of {secs} s each; table of {CAPACITY} transitions in 4 shards, full)"
    );
    println!(
        "| rows | operation | uniform | prioritized | prioritized / uniform |\n|---|---|---|---|---|"
    );
    for row_bytes in [16, 400] {
        let mut uniform: Vec<Vec<(String, f64)>> = Vec::new();
        let mut prioritized = Vec::new();
        for round in 0..rounds {
            // Alternate which goes first: a warm cache or a busy core favours neither.
            if round % 2 == 0 {
                uniform.push(measure(row_bytes, false, secs));
                prioritized.push(measure(row_bytes, true, secs));
            } else {
                prioritized.push(measure(row_bytes, true, secs));
                uniform.push(measure(row_bytes, false, secs));
            }
        }
        for (k, (name, _)) in uniform[0].iter().enumerate() {
            let u = median(uniform.iter().map(|r| r[k].1).collect());
            let p = median(prioritized.iter().map(|r| r[k].1).collect());
            println!(
                "| {row_bytes} B | {name} | {:.2} M | {:.2} M | {:.2} |",
                u / 1e6,
                p / 1e6,
                p / u
            );
        }
    }
}
