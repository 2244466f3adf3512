//! A population group that runs out of device memory ends as the learner thread does:
//! every training agent's state saved where the device still allows it, the sizes
//! involved and what to change said in one line, exit status 1. Other groups see the
//! failure and stop (saving theirs) as on an interrupt.

use std::panic::{catch_unwind, AssertUnwindSafe};

use millrace_proto::{EnvSpec, NetworkSpec};

use super::agent::Agent;
use crate::config::{DeviceChoice, RunConfig};
use crate::run::RunError;
use millrace_core::dqn::Dqn;
use millrace_core::memory::Footprint;

/// What a group of `agents` agents holds: the stacked networks with their optimizer
/// state and gradient, one stacked batch (on the device, and its staging), and the
/// agents' replays (host memory).
pub(super) fn footprint(
    cfg: &RunConfig,
    env: &EnvSpec,
    network: &NetworkSpec,
    agents: usize,
    replay_bytes_per_agent: usize,
    device: tch::Device,
) -> Footprint {
    // Two staging sets on a GPU (`population_staging`), one on the CPU.
    let (device, staged) = match device {
        tch::Device::Cuda(i) => (DeviceChoice::Cuda(i), 2),
        _ => (DeviceChoice::Cpu, 1),
    };
    Footprint::of(
        device,
        network.layout().len,
        agents,
        cfg.batch_size,
        env.obs.row_bytes(),
        staged,
        replay_bytes_per_agent * agents,
    )
}

/// The error for an allocation failure `message` in a group training `running`
/// (indices into `agents`, row by row of `dqn`), after saving each one's state for
/// `--resume`. Copying a state off a device that is out of memory can fail too: those
/// agents are named.
pub(super) fn ended(
    message: &str,
    footprint: &Footprint,
    dqn: &Dqn,
    running: &[usize],
    agents: &[Agent],
    (network, env, version): (&NetworkSpec, &EnvSpec, u64),
) -> RunError {
    let mut lost = Vec::new();
    for (row, &a) in running.iter().enumerate() {
        let agent = &agents[a];
        let saved = catch_unwind(AssertUnwindSafe(|| {
            agent.save(&dqn.agent_state(row), network, env, version)
        }));
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(e)) => lost.push(format!("agent {}: {e}", agent.index)),
            Err(p) => lost.push(format!(
                "agent {}: {}",
                agent.index,
                crate::panic_message(&*p)
            )),
        }
    }
    RunError::Failed {
        component: crate::run::Component::PopulationGroup,
        message: footprint.explain(message),
        checkpoint: crate::run::CheckpointFate::Agents {
            saved: running.len() - lost.len(),
            training: running.len(),
            lost,
        },
    }
}
