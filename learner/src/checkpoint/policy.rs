//! Saved policies, `best/` and `solved/`: the exact parameters an evaluation played,
//! with that evaluation; written atomically, read back by `eval` and `export`.

use std::fs;
use std::path::{Path, PathBuf};

use millrace_proto::{EnvConfig, EnvSpec, NetworkSpec};
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use super::files::{
    invalid, io, plain_name, read_json, remove_unreferenced, tensor_err, write_atomic, write_json,
};
use super::state::{check_format, check_network, read_tensors};
use super::{CheckpointError, FORMAT_VERSION, META};
use super::{Layout, StateMeta, Which};
use crate::evaluation::EvalRecord;
use millrace_core::dqn::dueling::DuelingHead;

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
    /// Which save of this directory wrote it (see [`super::StateMeta::generation`]).
    #[serde(default)]
    pub generation: u64,
}

/// Saves the parameters an evaluation played as `best/` or `solved/` (`dir`).
pub fn save_policy(
    dir: &Path,
    online: &[f32],
    mut meta: PolicyMeta,
) -> Result<(), CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    meta.format = FORMAT_VERSION;
    // A generation in the name: no save writes over the file a committed meta.json
    // names, even for the same parameter version.
    let standing: Option<PolicyMeta> = read_json(&dir.join(META)).ok();
    let next = standing.map_or(0, |p| p.generation).saturating_add(1);
    let named = |g: u64| format!("policy-{:012}-{g:06}.safetensors", meta.params_version);
    meta.generation = (next..=u64::MAX)
        .find(|&g| !dir.join(named(g)).exists())
        .unwrap_or(u64::MAX);
    meta.policy_file = named(meta.generation);
    let k = meta.network.population.max(1) as i64;
    let tensor = Tensor::from_slice(online).view([k, -1]);
    write_atomic(&dir.join(&meta.policy_file), |tmp| {
        Tensor::write_safetensors(&[("online", &tensor)], tmp).map_err(tensor_err(tmp))
    })?;
    if let Err(e) = write_json(&dir.join(META), &meta) {
        // The standing meta.json names the policy it needs; this one is unreferenced.
        let standing: Option<PolicyMeta> = read_json(&dir.join(META)).ok();
        if standing.is_none_or(|p| p.policy_file != meta.policy_file) {
            let _ = std::fs::remove_file(dir.join(&meta.policy_file));
        }
        return Err(e);
    }
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
        generation: 0,
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
