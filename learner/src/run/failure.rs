//! What failed, typed: the component a run's error names ("the learner failed: ..."),
//! and what became of the checkpoint.

use std::path::PathBuf;

/// A part of a run that can fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Component {
    Server,
    Learner,
    Sampler,
    /// An actor thread (`None` in lock-step mode, where actors step in turn).
    Actor(Option<u32>),
    /// The evaluator thread.
    Evaluator,
    /// An evaluation (lock-step mode's inline one, or a population agent's).
    Evaluation {
        agent: Option<usize>,
    },
    Replay,
    CheckpointWriter,
    /// A population's group thread, or the group that failed.
    PopulationThread,
    PopulationGroup,
    /// Starting the components.
    SetUp,
    /// None that could be named (a thread ended by itself without saying why).
    Run,
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Component::Server => f.write_str("server"),
            Component::Learner => f.write_str("learner"),
            Component::Sampler => f.write_str("sampler"),
            Component::Actor(None) => f.write_str("actor"),
            Component::Actor(Some(id)) => write!(f, "actor {id}"),
            Component::Evaluator => f.write_str("evaluator"),
            Component::Evaluation { agent: None } => f.write_str("evaluation"),
            Component::Evaluation { agent: Some(k) } => write!(f, "evaluation of agent {k}"),
            Component::Replay => f.write_str("replay"),
            Component::CheckpointWriter => f.write_str("checkpoint writer"),
            Component::PopulationThread => f.write_str("population thread"),
            Component::PopulationGroup => f.write_str("population group"),
            Component::SetUp => f.write_str("set-up"),
            Component::Run => f.write_str("run"),
        }
    }
}

/// A component's failure and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub component: Component,
    pub message: String,
}

impl Failure {
    pub fn new(component: Component, message: impl Into<String>) -> Self {
        Self {
            component,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_read_as_the_errors_always_said() {
        for (c, said) in [
            (Component::Actor(Some(3)), "actor 3"),
            (Component::Actor(None), "actor"),
            (
                Component::Evaluation { agent: Some(7) },
                "evaluation of agent 7",
            ),
            (Component::CheckpointWriter, "checkpoint writer"),
            (Component::SetUp, "set-up"),
        ] {
            assert_eq!(c.to_string(), said);
        }
    }
}

/// What became of a failed run's checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointFate {
    /// The final checkpoint was written here.
    Written(PathBuf),
    /// None was attempted (after divergence): the last good one stays.
    KeptLast,
    /// The final checkpoint failed too (why).
    Failed(String),
    /// A population's group: `saved` of its `training` agents saved their state for
    /// `--resume`; `lost` says which were not, and why.
    Agents {
        saved: usize,
        training: usize,
        lost: Vec<String>,
    },
    /// A population's thread panicked: the other groups' training agents saved their
    /// state, this one's did not.
    AllButThisGroup,
}

impl CheckpointFate {
    /// A single run's final checkpoint: written (where), failed, or not attempted.
    pub fn of(saved: &Result<Option<PathBuf>, crate::checkpoint::CheckpointError>) -> Self {
        match saved {
            Ok(Some(path)) => Self::Written(path.clone()),
            Ok(None) => Self::KeptLast,
            Err(e) => Self::Failed(e.to_string()),
        }
    }
}

impl std::fmt::Display for CheckpointFate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Written(path) => write!(f, "a checkpoint was written to {}", path.display()),
            Self::KeptLast => f.write_str("the last good checkpoint was kept"),
            Self::Failed(e) => write!(f, "the checkpoint failed too: {e}"),
            Self::Agents {
                saved, training, ..
            } if saved == training => write!(
                f,
                "the state of its {training} training agents was saved in agents/agent-NNN/checkpoint/latest/ for --resume"
            ),
            Self::Agents {
                saved,
                training,
                lost,
            } => write!(
                f,
                "{saved} of its {training} training agents were saved for --resume; not saved: {}",
                lost.join("; ")
            ),
            Self::AllButThisGroup => f.write_str(
                "the agents that were training saved their state in agents/agent-NNN/checkpoint/latest/ for --resume, except this group's",
            ),
        }
    }
}
