//! Checkpoints: what a run keeps, so that what it reports is what it saved.
//!
//! Layout of a run's checkpoint directory (`<logdir>/checkpoint/`):
//! - `config.json`: the run's effective configuration, every setting;
//! - `latest/`: the full state for `--resume`: `model-<updates>.safetensors` (tensors
//!   `online`, `target`, `adam_m`, `adam_v`, each `[K, P]` f32), `replay-<updates>.bin`
//!   (replay's contents, see [`replay_file`]) and `meta.json` (specs, counters, the rate
//!   limiter's among them, and the last evaluation);
//! - `best/`: the parameters of the evaluation with the highest mean return so far
//!   (the earliest on ties), exactly as they were played: `policy-<version>.safetensors`
//!   (`online`, `[K, P]`) and `meta.json` (version, env steps, updates, the evaluation's
//!   mean and spread);
//! - `solved/`: likewise, for the parameters that reached the target and were confirmed
//!   on fresh episodes (both evaluations in `meta.json`), once the run is solved.
//!
//! Every file is written to a temporary name, synced and renamed; `meta.json` is renamed
//! last and is each directory's commit point, so a crash at any moment leaves the
//! previous checkpoint intact.

pub mod files;
pub mod replay_file;
pub mod writer;

use std::fs;
use std::path::{Path, PathBuf};

use millrace_proto::{EnvConfig, EnvSpec, NetworkSpec};
use millrace_replay::Table;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

pub use files::CheckpointError;
use files::{
    invalid, io, plain_name, read_json, remove_unreferenced, tensor_err, write_atomic, write_json,
};
use millrace_core::dqn::dueling::DuelingHead;

use crate::evaluation::EvalRecord;
use millrace_core::dqn::DqnState;

/// Bumped when the layout changes incompatibly (1: one flat directory; 2: `latest/`,
/// `best/`, `solved/`).
pub const FORMAT_VERSION: u32 = 2;
const META: &str = "meta.json";
const TENSORS: [&str; 4] = ["online", "target", "adam_m", "adam_v"];

/// A saved policy in a checkpoint directory, named as its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    Latest,
    Best,
    Solved,
}

impl Which {
    pub const ALL: [Which; 3] = [Which::Latest, Which::Best, Which::Solved];

    /// Its directory's name, and how users spell it (`--which`).
    pub fn name(self) -> &'static str {
        match self {
            Which::Latest => "latest",
            Which::Best => "best",
            Which::Solved => "solved",
        }
    }
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a run's checkpoints live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn latest(&self) -> PathBuf {
        self.dir(Which::Latest)
    }

    pub fn best(&self) -> PathBuf {
        self.dir(Which::Best)
    }

    pub fn solved(&self) -> PathBuf {
        self.dir(Which::Solved)
    }

    pub fn config(&self) -> PathBuf {
        self.root.join("config.json")
    }

    pub fn dir(&self, which: Which) -> PathBuf {
        self.root.join(which.name())
    }

    /// The layout a user's path refers to: a checkpoint root, one of its
    /// `latest/`, `best/` or `solved/` directories, or a `meta.json` in one.
    pub fn find(path: &Path) -> Result<Self, CheckpointError> {
        let dir = if path.file_name() == Some(META.as_ref()) {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            path.to_path_buf()
        };
        if Which::ALL
            .iter()
            .any(|w| dir.join(w.name()).join(META).exists())
        {
            return Ok(Self::new(dir));
        }
        let named = dir
            .file_name()
            .is_some_and(|n| Which::ALL.iter().any(|w| n == w.name()));
        if named && dir.join(META).exists() {
            return Ok(Self::new(dir.parent().unwrap_or(Path::new("."))));
        }
        if dir.join(META).exists() {
            // A directory of the older flat format, or something else entirely.
            let format = read_json::<serde_json::Value>(&dir.join(META))
                .ok()
                .and_then(|v| v.get("format").and_then(serde_json::Value::as_u64));
            return Err(invalid(
                &dir.join(META),
                match format {
                    Some(f) if f == u64::from(FORMAT_VERSION) => format!(
                        "a {FORMAT_VERSION} checkpoint's files, but not in latest/, best/ or solved/"
                    ),
                    Some(f) => format!("checkpoint format {f} (this build reads {FORMAT_VERSION})"),
                    None => "no checkpoint format".into(),
                },
            ));
        }
        Err(CheckpointError::Missing(format!(
            "{}: no checkpoint here (expected latest/meta.json, best/ or solved/)",
            path.display()
        )))
    }
}

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
    /// Set when the run ended here for good ("solved" or "max steps").
    pub run_finished: Option<String>,
    /// The learner's networks have a dueling head: the tensors hold its streams (the
    /// network with one more output, [`millrace_core::dqn::dueling`]); `network` is the published
    /// plain one.
    #[serde(default)]
    pub dueling: bool,
}

impl StateMeta {
    /// The network the saved tensors are laid out by: `network`, or with a dueling
    /// head its learner-side form.
    pub fn learner_network(&self) -> Result<NetworkSpec, String> {
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
        }
    }
}

/// `best/` or `solved/`: the exact parameters an evaluation played.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyMeta {
    pub format: u32,
    /// Best or solved.
    pub which: Which,
    pub policy_file: String,
    pub env: EnvSpec,
    pub network: NetworkSpec,
    pub seed: u64,
    pub params_version: u64,
    pub env_steps: u64,
    pub updates: u64,
    /// The evaluation that put these parameters here.
    pub eval: EvalRecord,
    /// For `solved/`: the second evaluation, on fresh episodes, that confirmed it.
    pub confirm: Option<EvalRecord>,
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
    meta.format = FORMAT_VERSION;
    meta.updates = state.updates;
    meta.adam_step = state.adam_step;
    meta.model_file = format!("model-{:012}.safetensors", state.updates);
    // A learner with a dueling head holds more parameters than its published network.
    let held = state.online.size().get(1).copied().unwrap_or(0) as usize;
    meta.dueling = held != meta.network.layout().len;
    let model = dir.join(&meta.model_file);
    write_atomic(&model, |tmp| {
        let tensors = [&state.online, &state.target, &state.adam_m, &state.adam_v];
        let named: Vec<(&str, &Tensor)> = TENSORS.iter().copied().zip(tensors).collect();
        Tensor::write_safetensors(&named, tmp).map_err(tensor_err(tmp))
    })?;
    meta.replay_file = None;
    let mut replay_error = None;
    if let Some(table) = replay {
        let name = format!("replay-{:012}.bin", state.updates);
        // Networks and optimizer are worth keeping without replay: a resumed run then
        // refills replay from what the previous generation saved, or from empty.
        match replay_file::write(&dir.join(&name), table) {
            Ok((inserts, samples)) => {
                (meta.replay_inserts, meta.replay_samples) = (inserts, samples);
                meta.replay_file = Some(name);
            }
            Err(e) => {
                // The generation this one replaces (its meta.json is still the old
                // one here), for its replay file.
                let previous: Option<StateMeta> = read_json(&dir.join(META)).ok();
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
    write_json(&dir.join(META), &meta)?;
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
fn read_tensors(
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
fn check_format(meta_path: &Path, format: u32) -> Result<(), CheckpointError> {
    if format == FORMAT_VERSION {
        Ok(())
    } else {
        Err(invalid(
            meta_path,
            format!("format {format} (this build reads {FORMAT_VERSION})"),
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
fn check_network(meta_path: &Path, network: &NetworkSpec) -> Result<(), CheckpointError> {
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
) -> Result<replay_file::Restored, CheckpointError> {
    let Some(name) = &meta.replay_file else {
        return Ok(replay_file::Restored::default());
    };
    let path = dir.join(plain_name(&dir.join(META), name)?);
    let restored = replay_file::load(&path, meta.env.num_actions, table)?;
    if restored.held as u64 >= learning_starts {
        table.restore_counters(meta.replay_inserts, meta.replay_samples);
    }
    Ok(restored)
}

/// Saves the parameters an evaluation played as `best/` or `solved/` (`dir`).
pub fn save_policy(
    dir: &Path,
    online: &[f32],
    mut meta: PolicyMeta,
) -> Result<(), CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    meta.format = FORMAT_VERSION;
    meta.policy_file = format!("policy-{:012}.safetensors", meta.params_version);
    let k = meta.network.population.max(1) as i64;
    let tensor = Tensor::from_slice(online).view([k, -1]);
    write_atomic(&dir.join(&meta.policy_file), |tmp| {
        Tensor::write_safetensors(&[("online", &tensor)], tmp).map_err(tensor_err(tmp))
    })?;
    write_json(&dir.join(META), &meta)?;
    remove_unreferenced(dir, &["policy-"], &[meta.policy_file.as_str()]);
    Ok(())
}

/// Whose policy is saved: a run's (or a population agent's) checkpoint layout,
/// environment, network and seed.
#[derive(Clone, Copy, Debug)]
pub struct PolicyOwner<'a> {
    pub layout: &'a Layout,
    pub env: &'a EnvSpec,
    pub network: &'a NetworkSpec,
    pub seed: u64,
}

/// Saves the parameters an evaluation played (`eval`, and its confirmation if any) as
/// `owner`'s `best/` or `solved/`.
pub fn save_evaluated(
    owner: &PolicyOwner<'_>,
    which: Which,
    params: &millrace_proto::Params,
    eval: &EvalRecord,
    confirm: Option<&EvalRecord>,
) -> Result<(), CheckpointError> {
    let meta = PolicyMeta {
        format: FORMAT_VERSION,
        which,
        policy_file: String::new(),
        env: owner.env.clone(),
        network: owner.network.clone(),
        seed: owner.seed,
        params_version: params.version,
        env_steps: params.env_steps,
        updates: params.updates,
        eval: eval.clone(),
        confirm: confirm.cloned(),
    };
    save_policy(&owner.layout.dir(which), &params.data, meta)
}

/// The evaluation behind the policy saved as `which` in `layout`, if one is there.
pub fn saved_eval(layout: &Layout, which: Which) -> Result<Option<EvalRecord>, CheckpointError> {
    let meta = layout.dir(which).join(META);
    if !meta.exists() {
        return Ok(None);
    }
    let m: PolicyMeta = read_json(&meta)?;
    check_format(&meta, m.format)?;
    Ok(Some(m.eval))
}

/// How the run in `layout` built its environment, from its `config.json` (`None` if
/// that is missing, unreadable, or names another environment).
fn run_env_config(layout: &Layout) -> Option<EnvConfig> {
    #[derive(Deserialize)]
    struct Partial {
        env: EnvConfig,
    }
    read_json::<Partial>(&layout.config()).ok().map(|p| p.env)
}

/// The learning rate the run saved in `path` used after `env_steps` env steps, by the
/// `--lr` and schedule in its `config.json` (`None` when that is missing or unreadable).
pub fn saved_learning_rate(path: &Path, env_steps: u64) -> Option<f64> {
    #[derive(Deserialize)]
    struct Dqn {
        lr: f64,
        #[serde(default)]
        lr_decay: Option<millrace_core::dqn::schedules::LrDecay>,
    }
    #[derive(Deserialize)]
    struct Partial {
        dqn: Dqn,
    }
    let layout = Layout::find(path).ok()?;
    let dqn = read_json::<Partial>(&layout.config()).ok()?.dqn;
    Some(dqn.lr * dqn.lr_decay.map_or(1.0, |d| d.scale_at(env_steps)))
}

/// A saved policy, read back.
#[derive(Clone, Debug)]
pub struct SavedPolicy {
    pub which: Which,
    pub dir: PathBuf,
    pub env: EnvSpec,
    /// How to build the environment (a bridged one's module and arguments), from the
    /// run's `config.json`; the id alone where that is missing.
    pub env_config: EnvConfig,
    pub network: NetworkSpec,
    pub params_version: u64,
    pub env_steps: u64,
    pub updates: u64,
    pub eval: Option<EvalRecord>,
    pub confirm: Option<EvalRecord>,
    /// Online parameters, `[K, P]` row-major.
    pub online: Vec<f32>,
}

/// Loads a saved policy from a checkpoint: `which`, or by default the first of solved,
/// best and latest that exists.
pub fn load_policy(path: &Path, which: Option<Which>) -> Result<SavedPolicy, CheckpointError> {
    let layout = Layout::find(path)?;
    let which = match which {
        Some(w) => w,
        None => [Which::Solved, Which::Best, Which::Latest]
            .into_iter()
            .find(|w| layout.dir(*w).join(META).exists())
            .ok_or_else(|| {
                CheckpointError::Missing(format!("{}: no saved policy", path.display()))
            })?,
    };
    let dir = layout.dir(which);
    let meta_path = dir.join(META);
    if !meta_path.exists() {
        let hint = match which {
            Which::Solved => " (the run was not solved)",
            _ => "",
        };
        return Err(CheckpointError::Missing(format!(
            "{}: no {which} policy{hint}",
            layout.root.display()
        )));
    }
    // Latest: the learner's tensors, folded into the published network if need be.
    let mut learner_network = None;
    let (env, network, version, steps, updates, eval, confirm, file) = match which {
        Which::Latest => {
            let m: StateMeta = read_json(&meta_path)?;
            check_format(&meta_path, m.format)?;
            check_network(&meta_path, &m.network)?;
            let file = plain_name(&meta_path, &m.model_file)?.to_string();
            if m.dueling {
                learner_network = Some(m.learner_network().map_err(|e| invalid(&meta_path, e))?);
            }
            (
                m.env,
                m.network,
                m.params_version,
                m.env_steps,
                m.updates,
                m.last_eval,
                None,
                file,
            )
        }
        Which::Best | Which::Solved => {
            let m: PolicyMeta = read_json(&meta_path)?;
            check_format(&meta_path, m.format)?;
            check_network(&meta_path, &m.network)?;
            let file = plain_name(&meta_path, &m.policy_file)?.to_string();
            (
                m.env,
                m.network,
                m.params_version,
                m.env_steps,
                m.updates,
                Some(m.eval),
                m.confirm,
                file,
            )
        }
    };
    // Both file kinds hold the online network as `online`.
    let held = learner_network.as_ref().unwrap_or(&network);
    let mut online = read_tensors(&meta_path, &dir.join(file), held, &["online"])?.remove(0);
    if learner_network.is_some() {
        let head = DuelingHead::new(&network, Device::Cpu).map_err(|e| invalid(&meta_path, e))?;
        online = head.fold(&online);
    }
    let online = online.contiguous().view([-1]);
    let online = Vec::<f32>::try_from(&online).map_err(tensor_err(&dir))?;
    let env_config = run_env_config(&layout)
        .filter(|c| c.id == env.id)
        .unwrap_or_else(|| EnvConfig::new(env.id.clone()));
    Ok(SavedPolicy {
        which,
        dir,
        env,
        env_config,
        network,
        params_version: version,
        env_steps: steps,
        updates,
        eval,
        confirm,
        online,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_core::dqn::{Dqn, DqnConfig, TargetUpdate};
    use millrace_proto::TransitionBatch;
    use millrace_replay::{ItemKey, RateLimiterConfig, ReplayConfig, SampleBuffers};
    use rand::SeedableRng;

    fn setup() -> (EnvSpec, NetworkSpec, Dqn) {
        let env = millrace_actor::env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&env.obs, &[16], 2, 1).unwrap();
        let cfg = DqnConfig {
            lr: 1e-3,
            target: TargetUpdate::Hard { period: 2 },
            ..DqnConfig::default()
        };
        let mut dqn = Dqn::new(net.clone(), cfg, Device::Cpu, 0);
        let batch = millrace_core::dqn::Batch {
            obs2: Tensor::ones([1, 8, 4], (Kind::Float, Device::Cpu)),
            actions: Tensor::ones([1, 4, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([1, 4, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 4, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        for _ in 0..3 {
            let _ = dqn.update(&batch);
        }
        (env, net, dqn)
    }

    fn meta(env: &EnvSpec, net: &NetworkSpec) -> StateMeta {
        StateMeta {
            format: FORMAT_VERSION,
            model_file: String::new(),
            replay_file: None,
            env: env.clone(),
            network: net.clone(),
            seed: 9,
            updates: 3,
            adam_step: 3,
            env_steps: 1234,
            params_version: 7,
            replay_inserts: 1000,
            replay_samples: 500,
            last_eval: None,
            run_finished: None,
            dueling: false,
        }
    }

    #[test]
    fn a_dueling_learner_resumes_and_its_latest_policy_is_the_published_network() {
        let (env, net, _) = setup();
        let cfg = DqnConfig {
            dueling: true,
            ..DqnConfig::default()
        };
        let dqn = Dqn::new(net.clone(), cfg.clone(), Device::Cpu, 3);
        let dir = tempfile::tempdir().unwrap();
        save_state(
            &dir.path().join("latest"),
            &dqn.state(),
            None,
            meta(&env, &net),
        )
        .unwrap();
        let (m, state, _) = load_state(dir.path()).unwrap();
        assert!(m.dueling, "the learner's layout is recorded");
        assert_eq!(m.network, net, "the published network");
        let resumed = Dqn::from_state(net.clone(), cfg, Device::Cpu, state);
        assert_eq!(resumed.online_params(), dqn.online_params());
        let latest = load_policy(dir.path(), Some(Which::Latest)).unwrap();
        assert_eq!(
            latest.online,
            dqn.online_params(),
            "folded to the plain network"
        );
        assert_eq!(latest.online.len(), net.layout().len);
    }

    fn record(version: u64, mean: f32) -> EvalRecord {
        EvalRecord {
            params_version: version,
            env_steps: 100 * version,
            updates: 10 * version,
            episodes: 100,
            seed: 1,
            mean,
            std: 2.0,
            stderr: 0.2,
            min: mean - 5.0,
            max: mean + 1.0,
        }
    }

    #[test]
    fn round_trip_restores_every_tensor_and_counter() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        let state = dqn.state();
        let mut m = meta(&env, &net);
        m.last_eval = Some(record(5, 200.0));
        save_state(&layout.latest(), &state, None, m).unwrap();
        // The root, latest/ and latest/meta.json all name the same state.
        for path in [
            dir.path().to_path_buf(),
            layout.latest(),
            layout.latest().join("meta.json"),
        ] {
            let (m, loaded, at) = load_state(&path).unwrap();
            assert_eq!(at, layout.latest());
            assert_eq!((m.env_steps, m.replay_samples), (1234, 500));
            assert_eq!(m.last_eval.as_ref().unwrap().mean, 200.0);
            assert_eq!((loaded.updates, loaded.adam_step), (3, 3));
            assert!(loaded.online.equal(&state.online));
            assert!(loaded.target.equal(&state.target));
            assert!(loaded.adam_m.equal(&state.adam_m));
            assert!(loaded.adam_v.equal(&state.adam_v));
            check_fits(&m, &env, &net).unwrap();
        }
        assert!(
            !state.online.equal(&state.target),
            "target lags the online net"
        );
    }

    #[test]
    fn a_second_save_replaces_the_first_and_leaves_no_temporaries() {
        let (env, net, mut dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        dqn.sync_target();
        let batch = millrace_core::dqn::Batch {
            obs2: Tensor::ones([1, 2, 4], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([1, 1, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([1, 1, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 1, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        let _ = dqn.update(&batch);
        save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["meta.json", "model-000000000004.safetensors"]);
    }

    fn replay_config(shards: usize, capacity: usize) -> ReplayConfig {
        ReplayConfig {
            capacity,
            shards,
            obs_row_bytes: 16,
            stack: 1,
            obs_rows_per_item: 1.5,
            limiter: RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 1e9, 8).unwrap(),
            priority: None,
        }
    }

    fn replay_table(shards: usize, capacity: usize) -> Table {
        Table::new(&replay_config(shards, capacity)).unwrap()
    }

    /// Seven batches of five transitions (rewards = batch number), 35 in all.
    fn fill(table: &Table) {
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
    }

    fn sample(table: &Table, n: usize) -> Option<Vec<f32>> {
        let mut rows = vec![0u8; 16 * n];
        let mut next = vec![0u8; 16 * n];
        let (mut a, mut r, mut d) = (vec![0i64; n], vec![-1f32; n], vec![0f32; n]);
        let mut keys = vec![ItemKey::default(); n];
        let mut out = SampleBuffers {
            obs: &mut rows,
            next_obs: &mut next,
            actions: &mut a,
            rewards: &mut r,
            discounts: &mut d,
            keys: &mut keys,
            weights: &mut vec![0f32; n],
        };
        let got = table
            .try_sample(&mut rand::rngs::SmallRng::seed_from_u64(0), &mut out)
            .unwrap();
        got.map(|_| r)
    }

    #[test]
    fn priorities_survive_a_checkpoint_and_resume_samples_the_same_distribution() {
        let prioritized = |shards: usize| {
            Table::new(&ReplayConfig {
                priority: Some(millrace_replay::PriorityConfig {
                    alpha: 0.6,
                    beta: 0.4,
                }),
                ..replay_config(shards, 1000)
            })
            .unwrap()
        };
        let (env, net, dqn) = setup();
        let table = prioritized(3);
        fill(&table);
        // The learner's TD errors on a sample: distinct priorities to keep.
        let n = 16;
        let mut out = millrace_replay::SampleScratch::new(n, 16);
        table
            .try_sample(
                &mut rand::rngs::SmallRng::seed_from_u64(1),
                &mut out.buffers(),
            )
            .unwrap()
            .unwrap();
        let keys = out.keys;
        let td: Vec<f32> = (0..n).map(|i| 0.5 + 3.0 * i as f32).collect();
        assert!(
            table
                .update_priorities(&millrace_replay::PriorityUpdate {
                    keys: keys.clone(),
                    priorities: td.clone(),
                })
                .applied
                > 0
        );
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        let restored = prioritized(2);
        assert_eq!(restore_replay(&at, &m, &restored, 10).unwrap().held, 35);
        // Every item (by its first observation) keeps its priority.
        let priorities = |t: &Table| {
            let mut v: Vec<(u32, u32)> = Vec::new();
            t.snapshot(|_, b| {
                for (i, p) in b.priorities.iter().enumerate() {
                    let row = b.obs_index[i] as usize * 16;
                    let x = f32::from_ne_bytes(b.obs[row..row + 4].try_into().unwrap());
                    v.push((x.to_bits(), p.to_bits()));
                }
            });
            v.sort_unstable();
            v
        };
        let before = priorities(&table);
        assert_eq!(before.len(), 35);
        assert!(
            before.iter().any(|(_, p)| f32::from_bits(*p) > 1.0),
            "updated"
        );
        assert_eq!(priorities(&restored), before);
        assert_eq!(restored.stats().max_priority, table.stats().max_priority);
    }

    #[test]
    fn a_replay_that_cannot_be_written_keeps_the_previous_one() {
        let (env, net, dqn) = setup();
        let table = replay_table(3, 1000);
        fill(&table);
        sample(&table, 8).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        let first = save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        assert_eq!(first.replay_error, None);
        let (m0, _, _) = load_state(dir.path()).unwrap();
        let old_replay = m0.replay_file.clone().expect("replay written");
        // The next generation's replay cannot be written (its temporary name is taken by
        // a directory: as a full disk would, the write fails).
        let mut state = dqn.state();
        state.updates += 5;
        let name = format!("replay-{:012}.bin", state.updates);
        let tmp = latest
            .join(&name)
            .with_extension(format!("tmp.{}", std::process::id()));
        fs::create_dir(&tmp).unwrap();
        sample(&table, 8).unwrap();
        let second = save_state(&latest, &state, Some(&table), meta(&env, &net)).unwrap();
        assert!(second.replay_error.is_some(), "{second:?}");
        let (m1, _, at) = load_state(dir.path()).unwrap();
        assert_eq!(m1.updates, state.updates, "the new networks are kept");
        assert_eq!(m1.replay_file.as_deref(), Some(old_replay.as_str()));
        assert_eq!(
            (m1.replay_inserts, m1.replay_samples),
            (m0.replay_inserts, m0.replay_samples),
            "with the counters that go with it"
        );
        let restored = replay_table(3, 1000);
        assert_eq!(restore_replay(&at, &m1, &restored, 10).unwrap().held, 35);
        // Once a replay is written again, the old one goes.
        fs::remove_dir(&tmp).unwrap();
        state.updates += 1;
        let third = save_state(&latest, &state, Some(&table), meta(&env, &net)).unwrap();
        assert_eq!(third.replay_error, None);
        let (m2, _, _) = load_state(dir.path()).unwrap();
        assert_ne!(m2.replay_file.as_deref(), Some(old_replay.as_str()));
        assert!(!latest.join(&old_replay).exists());
    }

    #[test]
    fn a_crafted_meta_json_is_refused_in_one_line_before_anything_is_allocated() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), None, meta(&env, &net)).unwrap();
        let path = latest.join(META);
        let good: serde_json::Value = read_json(&path).unwrap();
        let crafted = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = good.clone();
            edit(&mut v);
            fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
            let e = load_state(dir.path()).unwrap_err().to_string();
            let p = load_policy(dir.path(), Some(Which::Latest))
                .unwrap_err()
                .to_string();
            assert!(!e.contains('\n') && !p.contains('\n'), "{e}");
            e
        };
        // A dueling head over 200,000 actions would allocate about 160 GB.
        let e = crafted(&|v| {
            v["dueling"] = true.into();
            v["network"]["num_actions"] = 200_000.into();
        });
        assert!(e.contains("200000 actions"), "{e}");
        let e = crafted(&|v| {
            v["dueling"] = true.into();
            v["network"]["num_actions"] = 5000.into();
        });
        assert!(e.contains("dueling head"), "{e}");
        let e = crafted(&|v| v["network"]["hidden"] = serde_json::json!([1u64 << 40, 8]));
        assert!(e.contains("parameters"), "{e}");
    }

    #[test]
    fn replay_and_its_counters_survive_a_checkpoint() {
        let (env, net, dqn) = setup();
        let table = replay_table(3, 1000);
        fill(&table);
        sample(&table, 8).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        assert_eq!((m.replay_inserts, m.replay_samples), (35, 8));

        let restored = replay_table(3, 1000);
        let r = restore_replay(&at, &m, &restored, 10).unwrap();
        assert_eq!((r.read, r.held, r.skipped), (35, 35, 0));
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
        let two = replay_table(2, 1000);
        assert_eq!(restore_replay(&at, &m, &two, 10).unwrap().held, 35);
        // A damaged file: truncated, a partial header at the end, a length over the limit.
        let file = at.join(m.replay_file.as_ref().unwrap());
        let bytes = fs::read(&file).unwrap();
        fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        assert!(restore_replay(&at, &m, &replay_table(3, 1000), 10).is_err());
        fs::write(&file, [&bytes[..], &[1, 0]].concat()).unwrap();
        assert!(restore_replay(&at, &m, &replay_table(3, 1000), 10).is_err());
        fs::write(&file, [0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
        assert!(matches!(
            restore_replay(&at, &m, &replay_table(3, 1000), 10),
            Err(CheckpointError::Invalid { .. })
        ));
    }

    #[test]
    fn resuming_into_a_smaller_replay_keeps_what_fits_and_samples_only_that() {
        let (env, net, dqn) = setup();
        let table = replay_table(1, 1000);
        fill(&table);
        let dir = tempfile::tempdir().unwrap();
        save_state(
            &dir.path().join("latest"),
            &dqn.state(),
            Some(&table),
            meta(&env, &net),
        )
        .unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        // Room for two batches of five: the five older ones are evicted as it refills.
        let small = replay_table(1, 10);
        let r = restore_replay(&at, &m, &small, 10).unwrap();
        assert_eq!(r.read, 35, "every batch went in, the oldest were evicted");
        assert_eq!((r.held, small.len()), (10, 10));
        let rewards = sample(&small, 64).expect("10 items: the counters came back");
        assert!(
            rewards.iter().all(|r| *r == 5.0 || *r == 6.0),
            "{rewards:?}"
        );
        // Fewer transitions than learning starts needs: the limiter starts afresh.
        let fresh = replay_table(1, 10);
        restore_replay(&at, &m, &fresh, 1000).unwrap();
        assert_eq!(fresh.stats().inserted, 0, "counters not restored");
        // What counts is what the table holds, not what went through it: 35 read, 10
        // held, learning starts at 20.
        let evicted = replay_table(1, 10);
        restore_replay(&at, &m, &evicted, 20).unwrap();
        assert_eq!(evicted.stats().inserted, 0, "counters not restored");
        assert!(
            sample(&fresh, 8).is_none(),
            "no sampling before learning starts"
        );
    }

    #[test]
    fn policies_are_kept_exactly_and_found_by_name() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        save_state(&layout.latest(), &dqn.state(), None, meta(&env, &net)).unwrap();
        let played: Vec<f32> = (0..net.layout().len).map(|i| i as f32 * 0.5).collect();
        let policy_meta = |which: Which, version| PolicyMeta {
            format: FORMAT_VERSION,
            which,
            policy_file: String::new(),
            env: env.clone(),
            network: net.clone(),
            seed: 0,
            params_version: version,
            env_steps: 100,
            updates: 50,
            eval: record(version, 480.0),
            confirm: (which == Which::Solved).then(|| record(version, 490.0)),
        };
        let latest = load_policy(dir.path(), None).unwrap();
        assert_eq!(latest.which, Which::Latest, "only latest/ exists yet");
        assert_eq!(latest.online, dqn.online_params());
        save_policy(&layout.best(), &played, policy_meta(Which::Best, 3)).unwrap();
        save_policy(&layout.best(), &played, policy_meta(Which::Best, 4)).unwrap();
        let best = load_policy(dir.path(), None).unwrap();
        assert_eq!((best.which, best.params_version), (Which::Best, 4));
        assert_eq!(best.online, played, "the exact parameters played");
        assert_eq!(
            fs::read_dir(layout.best()).unwrap().count(),
            2,
            "old file removed"
        );
        let err = load_policy(dir.path(), Some(Which::Solved)).unwrap_err();
        assert!(err.to_string().contains("not solved"), "{err}");
        save_policy(&layout.solved(), &played, policy_meta(Which::Solved, 4)).unwrap();
        let solved = load_policy(&layout.solved(), None).unwrap();
        assert_eq!(solved.which, Which::Solved);
        assert_eq!(solved.confirm.unwrap().mean, 490.0);
    }

    #[test]
    fn mismatched_or_damaged_checkpoints_are_clear_errors() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), None, meta(&env, &net)).unwrap();
        let (m, _, _) = load_state(dir.path()).unwrap();

        let other_env = millrace_actor::env::spec("Acrobot-v1").unwrap();
        let err = check_fits(&m, &other_env, &net).unwrap_err().to_string();
        assert!(
            err.contains("CartPole-v1") && err.contains("Acrobot-v1"),
            "{err}"
        );
        let bigger = NetworkSpec::mlp(&env.obs, &[32], 2, 1).unwrap();
        assert!(check_fits(&m, &env, &bigger).is_err());

        let model = latest.join(&m.model_file);
        fs::write(&model, b"garbage").unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(CheckpointError::Tensor { .. })
        ));

        fs::write(latest.join("meta.json"), b"{\"format\": 2}").unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(CheckpointError::Invalid { .. })
        ));

        // The flat layout of format 1 is named as such.
        let old = tempfile::tempdir().unwrap();
        fs::write(old.path().join("meta.json"), b"{\"format\": 1}").unwrap();
        let err = load_state(old.path()).unwrap_err().to_string();
        assert!(err.contains("checkpoint format 1"), "{err}");

        let missing = dir.path().join("nope");
        let err = load_state(&missing).unwrap_err().to_string();
        assert!(err.contains("no checkpoint here"), "{err}");
    }
}
