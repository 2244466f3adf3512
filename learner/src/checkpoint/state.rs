//! The run's state in `latest/`: the networks and optimizer, replay beside them, and
//! `meta.json` (specs, counters, the last evaluation); saved atomically, read back for
//! `--resume` with every size checked before anything is allocated.

use std::fs;
use std::path::{Path, PathBuf};

use millrace_proto::{EnvSpec, NetworkSpec};
use millrace_replay::Table;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::files::{
    invalid, io, plain_name, read_json, remove_unreferenced, tensor_err, write_atomic, write_json,
};
use super::Layout;
use super::{CheckpointError, FORMAT_VERSION, META, OLDEST_FORMAT, TENSORS};
use crate::evaluation::EvalRecord;
use millrace_core::dqn::dueling::DuelingHead;
use millrace_core::dqn::DqnState;
use millrace_core::handoff::Finished;

/// Everything in `latest/` besides the tensors and replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateMeta {
    pub format: u32,
    pub model_file: String,
    /// Replay's contents; when writing replay failed, the previous generation's file
    /// (with its counters), or none.
    pub replay_file: Option<String>,
    pub env: EnvSpec,
    pub network: NetworkSpec,
    pub seed: u64,
    pub updates: u64,
    pub adam_step: u64,
    pub env_steps: u64,
    pub params_version: u64,
    /// Rate limiter counters, so the replay ratio carries on where it was.
    pub replay_inserts: u64,
    pub replay_samples: u64,
    /// The most recent evaluation when this was written (of the parameters published
    /// then, usually an earlier version than these).
    pub last_eval: Option<EvalRecord>,
    /// Set when the run ended here for good (`"solved"` or `"max steps"`).
    pub run_finished: Option<Finished>,
    /// The learner's networks have a dueling head: the tensors hold its streams (the
    /// network with one more output, [`millrace_core::dqn::dueling`]); `network` is the published
    /// plain one.
    #[serde(default)]
    pub dueling: bool,
    /// CRC-32C of the model file: flipped bytes in a tensor would load silently.
    #[serde(default)]
    pub model_crc32c: Option<u32>,
    /// Which save of this directory wrote it (the standing one's plus one, from 1): part
    /// of every file name it writes, so that no save writes over a file the committed
    /// `meta.json` names, whatever its update count (0: written before generations).
    #[serde(default)]
    pub generation: u64,
}

impl StateMeta {
    /// The network the saved tensors are laid out by: `network`, or with a dueling
    /// head its learner-side form.
    pub fn learner_network(&self) -> Result<NetworkSpec, millrace_core::dqn::DuelingError> {
        match self.dueling {
            true => DuelingHead::new(&self.network, Device::Cpu).map(|h| h.internal().clone()),
            false => Ok(self.network.clone()),
        }
    }
}

impl StateMeta {
    /// What a caller knows of a state to save; [`save_state`] fills in the rest (file
    /// names, the optimizer's counters, replay's counters).
    pub fn new(
        env: EnvSpec,
        network: NetworkSpec,
        seed: u64,
        env_steps: u64,
        params_version: u64,
    ) -> Self {
        Self {
            format: FORMAT_VERSION,
            model_file: String::new(),
            replay_file: None,
            env,
            network,
            seed,
            updates: 0,
            adam_step: 0,
            env_steps,
            params_version,
            replay_inserts: 0,
            replay_samples: 0,
            last_eval: None,
            run_finished: None,
            dueling: false,
            model_crc32c: None,
            generation: 0,
        }
    }
}

/// What [`save_state`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    /// The directory it wrote to.
    pub dir: PathBuf,
    /// Why replay could not be written, when it could not (the networks and optimizer
    /// were saved all the same; `meta.json` names the previous replay file where there
    /// was one, or none).
    pub replay_error: Option<String>,
}

/// Saves the full state into `dir` (normally `latest/`, created if needed), replay
/// included when given, and removes the older generation's files. A replay that cannot
/// be written (a full disk) leaves the previous one in place, named by the new
/// `meta.json` with its own counters: a resumed run then restarts from older data
/// rather than from none.
pub fn save_state(
    dir: &Path,
    state: &DqnState,
    replay: Option<&Table>,
    mut meta: StateMeta,
) -> Result<Saved, CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    // What the standing generation's meta.json names: kept should this save fail, and
    // never written over (this generation's names differ from all of them).
    let previous: Option<StateMeta> = read_json(&dir.join(META)).ok();
    let standing: Vec<String> = previous
        .iter()
        .flat_map(|p| [Some(p.model_file.clone()), p.replay_file.clone()])
        .flatten()
        .collect();
    meta.format = FORMAT_VERSION;
    meta.updates = state.updates;
    meta.adam_step = state.adam_step;
    let named = |generation: u64, kind: &str, ext: &str| {
        format!("{kind}-{:012}-{generation:06}.{ext}", state.updates)
    };
    // The standing one's plus one; further while a generation's model file exists (a
    // save writes its model first, so a generation that wrote anything left one): a
    // meta.json that could not be read, or was edited by hand, still names nothing
    // this save writes over.
    let next = previous
        .as_ref()
        .map_or(0, |p| p.generation)
        .saturating_add(1);
    meta.generation = (next..=u64::MAX)
        .find(|&g| {
            let files = [named(g, "model", "safetensors"), named(g, "replay", "bin")];
            !files.iter().any(|f| standing.contains(f)) && !dir.join(&files[0]).exists()
        })
        .unwrap_or(u64::MAX);
    let name = |kind: &str, ext: &str| named(meta.generation, kind, ext);
    meta.model_file = name("model", "safetensors");
    // A learner with a dueling head holds more parameters than its published network.
    let held = state.online.size().get(1).copied().unwrap_or(0) as usize;
    meta.dueling = held != meta.network.layout().len;
    let model = dir.join(&meta.model_file);
    write_atomic(&model, |tmp| {
        let tensors = [&state.online, &state.target, &state.adam_m, &state.adam_v];
        let named: Vec<(&str, &Tensor)> = TENSORS.iter().copied().zip(tensors).collect();
        Tensor::write_safetensors(&named, tmp).map_err(tensor_err(tmp))?;
        meta.model_crc32c = Some(crc32c::crc32c(&std::fs::read(tmp).map_err(io(tmp))?));
        Ok(())
    })?;
    meta.replay_file = None;
    let mut replay_error = None;
    if let Some(table) = replay {
        let name = name("replay", "bin");
        // Networks and optimizer are worth keeping without replay: a resumed run then
        // refills replay from what the previous generation saved, or from empty.
        match super::replay_file::write(&dir.join(&name), table) {
            Ok((inserts, samples)) => {
                (meta.replay_inserts, meta.replay_samples) = (inserts, samples);
                meta.replay_file = Some(name);
            }
            Err(e) => {
                // The generation this one replaces (its meta.json is still the old
                // one here), for its replay file.
                let kept = previous.filter(|p| {
                    p.replay_file
                        .as_ref()
                        .is_some_and(|f| dir.join(f).is_file())
                });
                match kept {
                    Some(p) => {
                        tracing::warn!(
                            "checkpoint: replay not written ({e}); the previous replay file {} (from update {}) is kept",
                            p.replay_file.as_deref().unwrap_or_default(),
                            p.updates
                        );
                        (meta.replay_inserts, meta.replay_samples) =
                            (p.replay_inserts, p.replay_samples);
                        meta.replay_file = p.replay_file;
                    }
                    None => tracing::warn!("checkpoint without replay: {e}"),
                }
                replay_error = Some(e.to_string());
            }
        }
    }
    if let Err(e) = write_json(&dir.join(META), &meta) {
        // meta.json, the commit point, still names the standing generation: what this
        // save wrote is referenced by nothing, and a full disk must not stay full.
        for name in [Some(meta.model_file.as_str()), meta.replay_file.as_deref()]
            .into_iter()
            .flatten()
        {
            if !standing.iter().any(|s| s == name) {
                let _ = fs::remove_file(dir.join(name));
            }
        }
        return Err(e);
    }
    let keep = [Some(meta.model_file.as_str()), meta.replay_file.as_deref()];
    let keep: Vec<&str> = keep.into_iter().flatten().collect();
    remove_unreferenced(dir, &["model-", "replay-"], &keep);
    Ok(Saved {
        dir: dir.to_path_buf(),
        replay_error,
    })
}

/// Reads the `[K, P]` f32 tensors named `names` from a safetensors file, checking
/// their shapes against `network` (sizes come from a file: checked before use).
pub(super) fn read_tensors(
    meta_path: &Path,
    file: &Path,
    network: &NetworkSpec,
    names: &[&str],
) -> Result<Vec<Tensor>, CheckpointError> {
    let per_agent = network
        .checked_param_count()
        .filter(|p| {
            p.checked_mul(network.population)
                .is_some_and(|n| n <= 1 << 34)
        })
        .ok_or_else(|| invalid(meta_path, format!("implausible network {network:?}")))?;
    let shape = [network.population as i64, per_agent as i64];
    let tensors = Tensor::read_safetensors(file).map_err(tensor_err(file))?;
    let mut found: Vec<Option<Tensor>> = names.iter().map(|_| None).collect();
    for (name, t) in tensors {
        let Some(i) = names.iter().position(|n| *n == name) else {
            continue;
        };
        if t.size() != shape || t.kind() != Kind::Float {
            return Err(invalid(
                file,
                format!(
                    "{name} is {:?} {:?}, expected {shape:?} Float",
                    t.size(),
                    t.kind()
                ),
            ));
        }
        found[i] = Some(t.to_device(Device::Cpu));
    }
    found
        .into_iter()
        .zip(names)
        .map(|(t, name)| t.ok_or_else(|| invalid(file, format!("tensor {name} is missing"))))
        .collect()
}

/// Refuses metadata of another checkpoint format than this build's.
pub(super) fn check_format(meta_path: &Path, format: u32) -> Result<(), CheckpointError> {
    if (OLDEST_FORMAT..=FORMAT_VERSION).contains(&format) {
        Ok(())
    } else {
        Err(invalid(
            meta_path,
            format!("format {format} (this build reads {OLDEST_FORMAT} to {FORMAT_VERSION})"),
        ))
    }
}

/// The saved state's description alone (its root, `latest/`, or `latest/meta.json`),
/// without loading tensors: enough to tell whether the run is finished.
pub fn load_state_meta(path: &Path) -> Result<StateMeta, CheckpointError> {
    let meta_path = Layout::find(path)?.latest().join(META);
    if !meta_path.exists() {
        return Err(CheckpointError::Missing(format!(
            "{}: no latest/ state to resume from",
            path.display()
        )));
    }
    let meta: StateMeta = read_json(&meta_path)?;
    check_format(&meta_path, meta.format)?;
    check_network(&meta_path, &meta.network)?;
    Ok(meta)
}

/// Refuses a network spec from a file that nothing could be sized from safely.
pub(super) fn check_network(
    meta_path: &Path,
    network: &NetworkSpec,
) -> Result<(), CheckpointError> {
    network
        .validate()
        .map_err(|e| invalid(meta_path, format!("network: {e}")))
}

/// Loads the full state from a checkpoint (its root, `latest/`, or `latest/meta.json`),
/// checking that it is complete and self-consistent. Whether it fits the run is the
/// caller's [`check_fits`].
pub fn load_state(path: &Path) -> Result<(StateMeta, DqnState, PathBuf), CheckpointError> {
    let meta = load_state_meta(path)?;
    let dir = Layout::find(path)?.latest();
    let meta_path = dir.join(META);
    let model = dir.join(plain_name(&meta_path, &meta.model_file)?);
    let network = meta.learner_network().map_err(|e| invalid(&meta_path, e))?;
    if let Some(expected) = meta.model_crc32c {
        let got = crc32c::crc32c(&std::fs::read(&model).map_err(io(&model))?);
        if got != expected {
            return Err(invalid(
                &model,
                format!("damaged: its checksum is {got:08x}, meta.json recorded {expected:08x} (the best/ and solved/ policies, if any, are separate copies)"),
            ));
        }
    }
    let mut t = read_tensors(&meta_path, &model, &network, &TENSORS)?.into_iter();
    let mut take = || t.next().expect("one tensor per name");
    let state = DqnState {
        online: take(),
        target: take(),
        adam_m: take(),
        adam_v: take(),
        adam_step: meta.adam_step,
        updates: meta.updates,
    };
    Ok((meta, state, dir))
}

/// Checks that a loaded checkpoint can continue a run on `env` with `network`.
pub fn check_fits(
    meta: &StateMeta,
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
            "its network is {:?}, this run's is {:?} (check --hidden and --layer-norm)",
            meta.network, network
        )));
    }
    Ok(())
}

/// Refills `table` (empty) from the state in `dir` (see [`load_state`]) and restores the
/// rate limiter's counters when it then holds enough data to learn from (at least
/// `learning_starts` transitions); otherwise the limiter starts afresh, so the learner
/// waits for new data as a new run would. Sampling only ever returns stored items, so a
/// partly restored replay (a smaller one) is safe either way.
pub fn restore_replay(
    dir: &Path,
    meta: &StateMeta,
    table: &Table,
    learning_starts: u64,
) -> Result<super::replay_file::Restored, CheckpointError> {
    let Some(name) = &meta.replay_file else {
        return Ok(super::replay_file::Restored::default());
    };
    let path = dir.join(plain_name(&dir.join(META), name)?);
    if !path.is_file() {
        // Gone (deleted by hand, a half-copied directory): the networks are worth
        // resuming without it, as after a replay file that is damaged throughout.
        tracing::warn!(
            "{}: the replay file is missing; resuming with the networks and an empty replay",
            path.display()
        );
        return Ok(super::replay_file::Restored::default());
    }
    let restored = super::replay_file::load(&path, &meta.env, table)?;
    if let Some(losses) = restored.losses() {
        tracing::warn!(
            "{}: {losses}; resuming with the networks and the {} intact transitions",
            path.display(),
            restored.read + restored.skipped
        );
    }
    if restored.held as u64 >= learning_starts {
        table.restore_counters(meta.replay_inserts, meta.replay_samples);
    }
    Ok(restored)
}
