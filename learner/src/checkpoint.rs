//! Checkpoints: online and target networks and Adam's moments in safetensors, counters
//! and specs in `meta.json`, written atomically.
//!
//! Layout of a checkpoint directory:
//! `model-<updates>.safetensors` (tensors `online`, `target`, `adam_m`, `adam_v`, each
//! `[K, P]` f32), `replay-<updates>.bin` (replay's contents: length-prefixed
//! `(shard, TransitionBatch)` records in the wire codec) and `meta.json`, which names
//! both and holds the counters (the rate limiter's among them). Each file is written to
//! a temporary name, synced and renamed; `meta.json` is renamed last and is the commit
//! point, so a crash at any moment leaves the previous checkpoint intact.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use millrace_proto::codec::{self, MAX_FRAME_CEILING};
use millrace_proto::{EnvSpec, NetworkSpec, TransitionBatch};
use millrace_replay::Table;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::dqn::DqnState;

/// Bumped when the layout changes incompatibly.
pub const FORMAT_VERSION: u32 = 1;
const META: &str = "meta.json";
/// `meta.json` is small; refuse to read anything larger (it may not be ours).
const MAX_META_BYTES: u64 = 1 << 20;
const TENSORS: [&str; 4] = ["online", "target", "adam_m", "adam_v"];

/// Everything in a checkpoint besides the tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub format: u32,
    pub model_file: String,
    pub env: EnvSpec,
    pub network: NetworkSpec,
    pub updates: u64,
    pub adam_step: u64,
    pub env_steps: u64,
    pub params_version: u64,
    /// Rate limiter counters, so the replay ratio carries on where it was.
    pub replay_inserts: u64,
    pub replay_samples: u64,
    /// Replay's contents; none in checkpoints from before replay was saved.
    #[serde(default)]
    pub replay_file: Option<String>,
    pub seed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a millrace checkpoint: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Tensor {
        path: PathBuf,
        source: tch::TchError,
    },
    #[error("checkpoint does not match this run: {0}")]
    Mismatch(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename).
fn write_atomic(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let result = write(&tmp)
        .and_then(|()| {
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(io(&tmp))
        })
        .and_then(|()| fs::rename(&tmp, path).map_err(io(path)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Make the rename itself durable before anything refers to the new name.
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Saves a checkpoint into `dir` (created if needed) and removes older model files.
pub fn save(
    dir: &Path,
    state: &DqnState,
    replay: Option<&Table>,
    mut meta: CheckpointMeta,
) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    meta.format = FORMAT_VERSION;
    meta.updates = state.updates;
    meta.adam_step = state.adam_step;
    meta.model_file = format!("model-{:012}.safetensors", state.updates);
    let model = dir.join(&meta.model_file);
    write_atomic(&model, |tmp| {
        let tensors = [&state.online, &state.target, &state.adam_m, &state.adam_v];
        let named: Vec<(&str, &Tensor)> = TENSORS.iter().copied().zip(tensors).collect();
        Tensor::write_safetensors(&named, tmp).map_err(|source| CheckpointError::Tensor {
            path: tmp.to_path_buf(),
            source,
        })
    })?;
    meta.replay_file = None;
    if let Some(table) = replay {
        let name = format!("replay-{:012}.bin", state.updates);
        let path = dir.join(&name);
        let written = write_atomic(&path, |tmp| {
            let mut out = BufWriter::new(File::create(tmp).map_err(io(tmp))?);
            let mut result = Ok(());
            let (inserts, samples) = table.snapshot(|shard, batch| {
                if result.is_ok() {
                    result = codec::encode(&(shard as u32, batch), MAX_FRAME_CEILING)
                        .map_err(|e| CheckpointError::Invalid {
                            path: tmp.to_path_buf(),
                            reason: e.to_string(),
                        })
                        .and_then(|frame| out.write_all(&frame).map_err(io(tmp)));
                }
            });
            result?;
            // The counters as of the end of the copy (see `Table::snapshot`).
            (meta.replay_inserts, meta.replay_samples) = (inserts, samples);
            out.flush().map_err(io(tmp))
        });
        // Networks and optimizer are worth keeping without replay: a resumed run then
        // refills replay from empty, its limiter starting afresh.
        match written {
            Ok(()) => meta.replay_file = Some(name),
            Err(e) => tracing::warn!("checkpoint without replay: {e}"),
        }
    }
    let meta_path = dir.join(META);
    write_atomic(&meta_path, |tmp| {
        let text = serde_json::to_vec_pretty(&meta).map_err(|e| CheckpointError::Invalid {
            path: tmp.to_path_buf(),
            reason: e.to_string(),
        })?;
        File::create(tmp)
            .and_then(|mut f| f.write_all(&text))
            .map_err(io(tmp))
    })?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    // Older model and replay files are unreferenced now; failing to remove one is
    // harmless.
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let old_model = name.starts_with("model-")
                && name.ends_with(".safetensors")
                && name != meta.model_file;
            let old_replay = name.starts_with("replay-")
                && name.ends_with(".bin")
                && Some(&name) != meta.replay_file.as_ref();
            if old_model || old_replay {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    Ok(dir.to_path_buf())
}

/// Refills `table` (empty, of the checkpointed run's shape) from the checkpoint's replay
/// file and restores the rate limiter's counters; returns the transitions restored.
/// Without a replay file (older checkpoints) the table stays empty and the limiter
/// starts afresh, so that it never lets the learner sample data that is not there.
pub fn load_replay(
    dir: &Path,
    meta: &CheckpointMeta,
    table: &Table,
) -> Result<usize, CheckpointError> {
    let Some(name) = &meta.replay_file else {
        return Ok(0);
    };
    let dir = if dir.is_dir() {
        dir
    } else {
        dir.parent().unwrap_or(Path::new("."))
    };
    let path = dir.join(plain_name(dir, name)?);
    let invalid = |reason: String| CheckpointError::Invalid {
        path: path.clone(),
        reason,
    };
    let mut input = BufReader::new(File::open(&path).map_err(io(&path))?);
    let mut restored = 0;
    loop {
        let mut header = [0u8; codec::HEADER_BYTES];
        let got = read_up_to(&mut input, &mut header).map_err(io(&path))?;
        if got == 0 {
            break;
        }
        if got < header.len() {
            return Err(invalid(format!("truncated record header ({got} bytes)")));
        }
        // Lengths come from a file: checked against the limit before allocating.
        let len =
            codec::payload_len(header, MAX_FRAME_CEILING).map_err(|e| invalid(e.to_string()))?;
        let mut payload = vec![0u8; len];
        input.read_exact(&mut payload).map_err(io(&path))?;
        let (shard, batch): (u32, TransitionBatch) =
            codec::decode(&payload).map_err(|e| invalid(e.to_string()))?;
        batch
            .check_values(meta.env.num_actions)
            .map_err(|e| invalid(e.to_string()))?;
        match table.restore(shard as usize, &batch) {
            Ok(()) => restored += batch.len(),
            // A smaller replay (or shards) than the checkpointed run's: keep what fits.
            Err(millrace_replay::ReplayError::TooLarge(e)) => {
                tracing::warn!("replay checkpoint: skipped a batch: {e}");
            }
            Err(e) => return Err(invalid(e.to_string())),
        }
    }
    table.restore_counters(meta.replay_inserts, meta.replay_samples);
    Ok(restored)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// `name` if it names a file directly inside `dir` (it comes from `meta.json`).
fn plain_name<'a>(dir: &Path, name: &'a str) -> Result<&'a str, CheckpointError> {
    if Path::new(name).components().count() == 1 && !name.starts_with('.') {
        Ok(name)
    } else {
        Err(CheckpointError::Invalid {
            path: dir.join(META),
            reason: format!("file {name:?} is not a plain name"),
        })
    }
}

/// Loads a checkpoint from its directory (or its `meta.json`), checking that it is
/// complete and self-consistent. Whether it fits the run is the caller's [`check_fits`].
pub fn load(path: &Path) -> Result<(CheckpointMeta, DqnState), CheckpointError> {
    let dir = if path.is_dir() {
        path.to_path_buf()
    } else if path.file_name() == Some(META.as_ref()) {
        path.parent().unwrap_or(Path::new(".")).to_path_buf()
    } else {
        return Err(CheckpointError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "expected a checkpoint directory or its meta.json",
            ),
        });
    };
    let meta_path = dir.join(META);
    let invalid = |path: &Path, reason: String| CheckpointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let len = fs::metadata(&meta_path).map_err(io(&meta_path))?.len();
    if len > MAX_META_BYTES {
        return Err(invalid(
            &meta_path,
            format!("{len} bytes is too large for metadata"),
        ));
    }
    let text = fs::read(&meta_path).map_err(io(&meta_path))?;
    let meta: CheckpointMeta =
        serde_json::from_slice(&text).map_err(|e| invalid(&meta_path, e.to_string()))?;
    if meta.format != FORMAT_VERSION {
        return Err(invalid(
            &meta_path,
            format!("format {} (this build reads {FORMAT_VERSION})", meta.format),
        ));
    }
    let file_name = Path::new(&meta.model_file);
    if file_name.components().count() != 1 {
        return Err(invalid(
            &meta_path,
            format!("model file {:?} is not a plain name", meta.model_file),
        ));
    }
    let model = dir.join(file_name);
    let tensors = Tensor::read_safetensors(&model).map_err(|source| CheckpointError::Tensor {
        path: model.clone(),
        source,
    })?;
    // Sizes come from a file: check them before computing anything from them.
    let per_agent = meta
        .network
        .checked_param_count()
        .filter(|p| {
            p.checked_mul(meta.network.population)
                .is_some_and(|n| n <= 1 << 34)
        })
        .ok_or_else(|| {
            invalid(
                &meta_path,
                format!("implausible network {:?}", meta.network),
            )
        })?;
    let shape = [meta.network.population as i64, per_agent as i64];
    let mut found: Vec<Option<Tensor>> = vec![None, None, None, None];
    for (name, t) in tensors {
        let Some(i) = TENSORS.iter().position(|n| *n == name) else {
            continue;
        };
        if t.size() != shape || t.kind() != Kind::Float {
            return Err(invalid(
                &model,
                format!(
                    "{name} is {:?} {:?}, expected {shape:?} Float",
                    t.size(),
                    t.kind()
                ),
            ));
        }
        found[i] = Some(t.to_device(Device::Cpu));
    }
    let mut take = |i: usize| {
        found[i]
            .take()
            .ok_or_else(|| invalid(&model, format!("tensor {} is missing", TENSORS[i])))
    };
    let state = DqnState {
        online: take(0)?,
        target: take(1)?,
        adam_m: take(2)?,
        adam_v: take(3)?,
        adam_step: meta.adam_step,
        updates: meta.updates,
    };
    Ok((meta, state))
}

/// Checks that a loaded checkpoint can continue a run on `env` with `network`.
pub fn check_fits(
    meta: &CheckpointMeta,
    env: &EnvSpec,
    network: &NetworkSpec,
) -> Result<(), CheckpointError> {
    if meta.env.id != env.id {
        return Err(CheckpointError::Mismatch(format!(
            "it was trained on {}, this run is {}",
            meta.env.id, env.id
        )));
    }
    if &meta.network != network {
        return Err(CheckpointError::Mismatch(format!(
            "its network is {:?}, this run's is {:?} (check --hidden)",
            meta.network, network
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dqn::{Dqn, DqnConfig, TargetUpdate};

    fn setup() -> (EnvSpec, NetworkSpec, Dqn) {
        let env = millrace_actor::env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&env.obs, &[16], 2, 1).unwrap();
        let cfg = DqnConfig {
            lr: 1e-3,
            target: TargetUpdate::Hard { period: 2 },
            ..DqnConfig::default()
        };
        let mut dqn = Dqn::new(net.clone(), cfg, Device::Cpu, 0);
        let batch = crate::dqn::Batch {
            obs2: Tensor::ones([1, 8, 4], (Kind::Float, Device::Cpu)),
            actions: Tensor::ones([1, 4, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([1, 4, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 4, 1], (Kind::Float, Device::Cpu)),
        };
        for _ in 0..3 {
            dqn.update(&batch);
        }
        (env, net, dqn)
    }

    fn meta(env: &EnvSpec, net: &NetworkSpec) -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT_VERSION,
            model_file: String::new(),
            env: env.clone(),
            network: net.clone(),
            updates: 3,
            adam_step: 3,
            env_steps: 1234,
            params_version: 7,
            replay_inserts: 1000,
            replay_samples: 500,
            replay_file: None,
            seed: 9,
        }
    }

    #[test]
    fn round_trip_restores_every_tensor_and_counter() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let state = dqn.state();
        save(dir.path(), &state, None, meta(&env, &net)).unwrap();
        let (m, loaded) = load(dir.path()).unwrap();
        assert_eq!(m.env_steps, 1234);
        assert_eq!(m.replay_samples, 500);
        assert_eq!((loaded.updates, loaded.adam_step), (3, 3));
        assert!(loaded.online.equal(&state.online));
        assert!(loaded.target.equal(&state.target));
        assert!(loaded.adam_m.equal(&state.adam_m));
        assert!(loaded.adam_v.equal(&state.adam_v));
        assert!(
            !state.online.equal(&state.target),
            "target lags the online net"
        );
        check_fits(&m, &env, &net).unwrap();
        // Loading through meta.json works too.
        assert!(load(&dir.path().join("meta.json")).is_ok());
    }

    #[test]
    fn a_second_save_replaces_the_first_and_leaves_no_temporaries() {
        let (env, net, mut dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        dqn.sync_target();
        let batch = crate::dqn::Batch {
            obs2: Tensor::ones([1, 2, 4], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([1, 1, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([1, 1, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 1, 1], (Kind::Float, Device::Cpu)),
        };
        dqn.update(&batch);
        save(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["meta.json", "model-000000000004.safetensors"]);
        assert_eq!(load(dir.path()).unwrap().1.updates, 4);
    }

    fn replay_table(shards: usize) -> Table {
        use millrace_replay::{RateLimiterConfig, ReplayConfig};
        Table::new(&ReplayConfig {
            capacity: 1000,
            shards,
            obs_row_bytes: 16,
            obs_rows_per_item: 1.5,
            limiter: RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 1e9, 8).unwrap(),
        })
    }

    #[test]
    fn replay_and_its_counters_survive_a_checkpoint() {
        use rand::SeedableRng;
        let (env, net, dqn) = setup();
        let table = replay_table(3);
        for seq in 0..7u64 {
            let mut b = TransitionBatch::with_capacity(16, 5, 6);
            for i in 0..6 {
                b.push_obs_f32(&[(seq * 10 + i) as f32, 0.0, 0.0, 0.0]);
            }
            for i in 0..5u32 {
                b.push_transition(i, i64::from(i % 2), seq as f32, 0.99, i + 1);
            }
            (b.actor_id, b.seq, b.version) = (1, seq, seq);
            table.insert(&b).unwrap();
        }
        let mut rows = [0u8; 16 * 8];
        let mut next = [0u8; 16 * 8];
        let (mut a, mut r, mut d) = ([0i64; 8], [0f32; 8], [0f32; 8]);
        let mut out = millrace_replay::SampleBuffers {
            obs: &mut rows,
            next_obs: &mut next,
            actions: &mut a,
            rewards: &mut r,
            discounts: &mut d,
        };
        table
            .sample(&mut rand::rngs::SmallRng::seed_from_u64(0), &mut out)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (m, _) = load(dir.path()).unwrap();
        assert_eq!((m.replay_inserts, m.replay_samples), (35, 8));

        let restored = replay_table(3);
        assert_eq!(load_replay(dir.path(), &m, &restored).unwrap(), 35);
        assert_eq!(restored.shard_lens(), table.shard_lens());
        let (s0, s1) = (table.stats(), restored.stats());
        assert_eq!(
            (s1.inserted, s1.sampled, s1.size, s1.obs_rows),
            (s0.inserted, s0.sampled, s0.size, s0.obs_rows)
        );
        let all = |t: &Table| {
            let mut v = Vec::new();
            t.snapshot(|shard, b| v.push((shard, b)));
            v
        };
        assert_eq!(all(&table), all(&restored));

        // A run with fewer shards takes everything (shards map modulo its count).
        let two = replay_table(2);
        assert_eq!(load_replay(dir.path(), &m, &two).unwrap(), 35);
        assert_eq!(two.len(), 35);
        // A damaged file: truncated, or a length prefix over the limit.
        let file = dir.path().join(m.replay_file.as_ref().unwrap());
        let bytes = fs::read(&file).unwrap();
        fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        assert!(load_replay(dir.path(), &m, &replay_table(3)).is_err());
        fs::write(&file, [&bytes[..], &[1, 0]].concat()).unwrap();
        assert!(
            load_replay(dir.path(), &m, &replay_table(3)).is_err(),
            "a partial header at the end"
        );
        fs::write(&file, [0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
        assert!(matches!(
            load_replay(dir.path(), &m, &replay_table(3)),
            Err(CheckpointError::Invalid { .. })
        ));
        // A second save replaces the replay file too.
        let mut dqn = dqn;
        dqn.sync_target();
        let mut state = dqn.state();
        state.updates += 1;
        save(dir.path(), &state, Some(&table), meta(&env, &net)).unwrap();
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("replay-"))
            .collect();
        assert_eq!(names, ["replay-000000000004.bin"]);
    }

    #[test]
    fn mismatched_or_damaged_checkpoints_are_clear_errors() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        let (m, _) = load(dir.path()).unwrap();

        let other_env = millrace_actor::env::spec("Acrobot-v1").unwrap();
        let err = check_fits(&m, &other_env, &net).unwrap_err().to_string();
        assert!(
            err.contains("CartPole-v1") && err.contains("Acrobot-v1"),
            "{err}"
        );
        let bigger = NetworkSpec::mlp(&env.obs, &[32], 2, 1).unwrap();
        assert!(check_fits(&m, &env, &bigger).is_err());

        let model = dir.path().join(&m.model_file);
        fs::write(&model, b"garbage").unwrap();
        assert!(matches!(
            load(dir.path()),
            Err(CheckpointError::Tensor { .. })
        ));

        fs::write(dir.path().join("meta.json"), b"{\"format\": 1}").unwrap();
        assert!(matches!(
            load(dir.path()),
            Err(CheckpointError::Invalid { .. })
        ));

        let missing = dir.path().join("nope");
        assert!(matches!(load(&missing), Err(CheckpointError::Io { .. })));
    }
}
