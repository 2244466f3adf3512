//! The learner thread's checkpoint hand-off: it copies its state to the host and hands
//! it over; writing it (and replay beside it) is the application's checkpoint writer's
//! job, on a thread of its own, behind [`CheckpointSink`].

use std::path::PathBuf;

use crossbeam_channel::Receiver;
use millrace_proto::panics::Panicked;
use serde::{Deserialize, Serialize};

use crate::dqn::DqnState;

/// How a run that is over for good ended, as its last checkpoint records it
/// (`meta.json`'s `run_finished`: `"solved"` or `"max steps"`). A run that stopped
/// (a signal, a failure) is not finished: it records none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Finished {
    /// Its target return, confirmed on fresh episodes.
    #[serde(rename = "solved")]
    Solved,
    /// Its step budget ran out first.
    #[serde(rename = "max steps")]
    MaxSteps,
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Finished::Solved => "solved",
            Finished::MaxSteps => "max steps",
        })
    }
}

/// One state to write.
#[derive(Debug)]
pub struct SaveJob {
    pub state: DqnState,
    pub params_version: u64,
    /// The run's env steps when the state was copied.
    pub env_steps: u64,
    /// Set on the run's last checkpoint when the run is over for good.
    pub run_finished: Option<Finished>,
}

/// Where the learner thread hands its checkpoints.
pub trait CheckpointSink {
    /// Why a checkpoint was not written.
    type Error: std::fmt::Display + Send + 'static;

    /// Hands over a periodic checkpoint without waiting; `false` (and it is skipped)
    /// when the writer is still busy with the previous one.
    fn try_submit(&self, job: SaveJob) -> bool;

    /// Hands over the final checkpoint (or, `Err`, the panic that copying the state off
    /// the device ended in), waiting for room; its result arrives on the receiver.
    fn submit_final(
        &self,
        job: Result<SaveJob, Panicked>,
    ) -> Receiver<Result<PathBuf, Self::Error>>;
}
