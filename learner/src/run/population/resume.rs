//! What a population's log directory keeps so that `--resume LOGDIR` continues the
//! whole sweep: each agent's directory (`agents/agent-NNN/`) holds `agent.json` (who it
//! is: configuration, hyperparameters, settings), `result.json` once it ended, and
//! while it trains, when the run stops (or every `--checkpoint-every-s`), its state in
//! `checkpoint/latest/` (networks, optimizer, replay, env steps). On resume, ended
//! agents keep their results, stopped ones go on from their state, and the rest start
//! as they would have. An agent whose `agent.json` differs from what the sweep file and
//! flags now give it is refused: a resume continues the same sweep.

use std::path::{Path, PathBuf};

use millrace_proto::{EnvSpec, NetworkSpec};
use serde::{Deserialize, Serialize};

use crate::checkpoint::files::{read_json, write_json};
use crate::checkpoint::{self, CheckpointError, StateMeta};
use crate::population_results::{AgentResult, AgentSetup};
use crate::run::RunError;
use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::DqnState;

/// Who an agent is (`agent.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    pub agent: usize,
    pub config: usize,
    pub label: String,
    pub hparams: AgentHparams,
    pub setup: AgentSetup,
}

/// What an agent's directory says of it.
#[derive(Debug)]
pub enum Saved {
    /// Nothing yet: it starts afresh.
    Fresh,
    /// It ended: its result stands.
    Ended(Box<AgentResult>),
    /// It was stopped while training: it goes on from its saved state.
    Stopped,
}

fn identity_path(dir: &Path) -> PathBuf {
    dir.join("agent.json")
}

fn result_path(dir: &Path) -> PathBuf {
    dir.join("result.json")
}

/// Records who the agent in `dir` is (when it first starts).
pub fn write_identity(dir: &Path, who: &Identity) -> Result<(), CheckpointError> {
    write_json(&identity_path(dir), who)
}

/// Records how the agent in `dir` ended (atomically).
pub fn write_result(dir: &Path, result: &AgentResult) -> Result<(), CheckpointError> {
    write_json(&result_path(dir), result)
}

/// What the directory `dir` holds of agent `who`; refuses one that holds another agent.
pub fn saved(dir: &Path, who: &Identity) -> Result<Saved, RunError> {
    let path = identity_path(dir);
    if !path.exists() {
        return Ok(Saved::Fresh);
    }
    let refuse = |why: String| RunError::Resume(CheckpointError::Mismatch(why));
    let was: Identity = read_json(&path).map_err(RunError::Resume)?;
    if &was != who {
        return Err(refuse(format!(
            "agent {}: {} records other settings than the sweep file and flags give it now \
             (it was {:?}, now {:?}); resume with the same sweep file and flags",
            who.agent,
            path.display(),
            was,
            who
        )));
    }
    if result_path(dir).exists() {
        let result: AgentResult = read_json(&result_path(dir)).map_err(RunError::Resume)?;
        if result.agent != who.agent {
            return Err(refuse(format!(
                "{}: the result of agent {}, in agent {}'s directory",
                result_path(dir).display(),
                result.agent,
                who.agent
            )));
        }
        return Ok(Saved::Ended(Box::new(result)));
    }
    if checkpoint::Layout::new(dir.join("checkpoint"))
        .latest()
        .join("meta.json")
        .exists()
    {
        return Ok(Saved::Stopped);
    }
    Ok(Saved::Fresh)
}

/// Checks, before anything trains, that a stopped agent's saved state in `dir` fits
/// the run (its environment and network; the tensors are read when it starts).
pub fn check_stopped(dir: &Path, env: &EnvSpec, network: &NetworkSpec) -> Result<(), RunError> {
    let meta_path = checkpoint::Layout::new(dir.join("checkpoint"))
        .latest()
        .join("meta.json");
    let meta: StateMeta = read_json(&meta_path).map_err(RunError::Resume)?;
    checkpoint::check_fits(&meta, env, network).map_err(|e| {
        RunError::Resume(CheckpointError::Mismatch(format!(
            "{}: {e}",
            meta_path.display()
        )))
    })
}

/// A stopped agent's state, read back from `checkpoint/latest/` under `dir`.
pub fn load_state(dir: &Path) -> Result<(StateMeta, DqnState, PathBuf), RunError> {
    checkpoint::load_state(&dir.join("checkpoint")).map_err(RunError::Resume)
}
