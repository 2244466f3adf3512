//! Atari games through ale-py's vectorised C++ interface (`ALEVectorInterface`).
//!
//! Two conventions, told apart by the id:
//! - `ALE/<Game>-v5`, as Gymnasium defines v5: sticky actions (0.25), the full action
//!   set (18), no FIRE at reset (Gymnasium's `AtariPreprocessing`);
//! - `<Game>NoFrameskip-v4`, as SB3's zoo, Dopamine and the DQN papers train: no sticky
//!   actions, the game's minimal action set, FIRE at reset (SB3's `AtariWrapper`).
//!
//! Both with the DQN preprocessing done in C++: frame skip 4 with max-pooling, 84×84
//! grayscale, a stack of 4 (`[4, 84, 84]` u8), up to 30 no-op starts, episodes capped
//! at 108,000 frames (27,000 agent steps, 30 minutes of play). Rewards are the game's
//! own (clipping is the actor's, for training only); with
//! [`EnvConfig::terminal_on_life_loss`] each lost life is reported
//! ([`Step::life_lost`](crate::env::Step)).

use millrace_proto::env::atari_game;
use millrace_proto::{DType, EnvConfig, EnvSpec, ObsSpec};
use pyo3::prelude::*;

use super::{construct, py_err, with_python, PyVecEnv};
use crate::env::EnvError;

/// Agent steps in the 108,000-frame cap (frame skip 4).
pub const MAX_AGENT_STEPS: u32 = 27_000;

#[derive(Debug)]
pub struct AtariVec;

impl AtariVec {
    /// `n` games of `cfg.id`, stepped by ale-py's thread pool (one thread per
    /// environment, at most the machine's cores).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cfg: &EnvConfig, n: usize) -> Result<PyVecEnv<u8>, EnvError> {
        let Some((game, v5)) = atari_game(&cfg.id) else {
            return Err(EnvError::UnknownId(cfg.id.clone()));
        };
        let threads = std::thread::available_parallelism()
            .map_or(1, |c| c.get())
            .min(n);
        with_python(|py| {
            let obj = construct(py, "AtariVec", (game, n, v5, threads))?;
            let num_actions: usize = obj
                .getattr("num_actions")
                .and_then(|a| a.extract())
                .map_err(|e| py_err(py, e))?;
            if cfg.terminal_on_life_loss {
                obj.setattr("report_life_loss", true)
                    .map_err(|e| py_err(py, e))?;
            }
            let spec = EnvSpec {
                id: cfg.id.clone(),
                obs: ObsSpec {
                    shape: vec![4, 84, 84],
                    dtype: DType::U8,
                },
                num_actions,
                max_episode_steps: MAX_AGENT_STEPS,
                reward_threshold: None,
                reward_range: None,
                frame_stack: 4,
            };
            Ok(PyVecEnv::new(obj.unbind(), spec, n))
        })
    }
}
