//! `--preset`: a published or measured configuration as flags, applied beneath the
//! command line (an explicit flag wins) and above the environment's defaults
//! (`learner/hyperparams.toml`, whose tables may themselves name a preset); the
//! effective settings are printed and saved as every run's are.

use crate::per_agent::{
    BATCH_SIZE, EPS_DECAY_STEPS, EPS_END, EPS_START, GAMMA, LR, MAX_GRAD_NORM, MUNCHAUSEN_ALPHA,
    MUNCHAUSEN_CLIP, MUNCHAUSEN_TAU, N_STEP, PRIORITY_ALPHA, SAMPLES_PER_INSERT, TARGET_PERIOD,
};

/// Flags and values, by flag name without dashes. Settings a sweep may also give each
/// agent are named through [`crate::per_agent`]'s table, the rest by their flag.
pub type Flags = std::collections::BTreeMap<String, String>;

/// A configuration for a family of environments, or a published agent's.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Ape-X DQN (Horgan et al. 2018): prioritized replay with α 0.6 and β 0.4,
    /// 3-step double-DQN returns, a dueling network, centred RMSProp at 0.00025/4,
    /// batches of 512, the target network every 2,500 updates, gradients clipped to
    /// norm 40, and each environment's own fixed ε = 0.4^(1+7i/(N−1)).
    Apex,
    /// Small vector-observation tasks (CartPole-v1's table): LayerNorm, prioritized
    /// replay, Adam at 1e-3 decaying to 5e-5 over 10,000 env steps, batches of 256 at one
    /// update per env step; measured here on CartPole-v1 (docs/results/learning.md).
    Classic,
    /// MinAtar from pixels: the MinAtar paper's DQN where millrace has it (Young &
    /// Tian 2019: batches of 32, one update per frame, a replay of 100,000 from 5,000,
    /// the target every 1,000 updates, ε from 1 over 100,000 frames, 1-step returns),
    /// with Adam at 1e-4 and the Munchausen target (Vieillard et al. 2020: τ 0.03,
    /// α 0.9, clip −1), which learned more than double DQN's on 7 of the 10 games and
    /// seeds of this project's five-game table (docs/results/learning.md).
    Minatar,
    /// Atari from pixels: Munchausen DQN's Atari settings (Vieillard et al. 2020, on
    /// Dopamine): the Munchausen target, Adam at 5e-5, batches of 32 every 4 env steps,
    /// a replay of 1M from 20,000, the target every 8,000 env steps, ε to 0.01 over
    /// 250,000 env steps, 1-step returns. From the literature, not measured here.
    Atari,
}

/// The preset's flags, by flag name without dashes.
pub fn flags(preset: Preset) -> Flags {
    let pairs: &[(&str, &str)] = match preset {
        Preset::Apex => &[
            ("replay", "prioritized"),
            (PRIORITY_ALPHA.flag, "0.6"),
            ("priority-beta", "0.4"),
            (N_STEP.flag, "3"),
            (GAMMA.flag, "0.99"),
            ("dueling", "true"),
            ("optimizer", "rmsprop"),
            (LR.flag, "0.0000625"),
            (BATCH_SIZE.flag, "512"),
            (TARGET_PERIOD.flag, "2500"),
            (MAX_GRAD_NORM.flag, "40"),
            ("apex-epsilon", "true"),
        ],
        Preset::Classic => &[
            ("layer-norm", "true"),
            ("replay", "prioritized"),
            (LR.flag, "0.001"),
            ("lr-final", "0.00005"),
            ("lr-decay-steps", "10000"),
            (BATCH_SIZE.flag, "256"),
            (SAMPLES_PER_INSERT.flag, "256"),
        ],
        Preset::Minatar => &[
            ("target", "munchausen"),
            (MUNCHAUSEN_TAU.flag, "0.03"),
            (MUNCHAUSEN_ALPHA.flag, "0.9"),
            (MUNCHAUSEN_CLIP.flag, "-1"),
            ("optimizer", "adam"),
            (LR.flag, "0.0001"),
            (BATCH_SIZE.flag, "32"),
            (SAMPLES_PER_INSERT.flag, "32"),
            ("replay-capacity", "100000"),
            ("learning-starts", "5000"),
            (TARGET_PERIOD.flag, "1000"),
            (EPS_START.flag, "1"),
            (EPS_END.flag, "0.04"),
            (EPS_DECAY_STEPS.flag, "100000"),
            (N_STEP.flag, "1"),
            (GAMMA.flag, "0.99"),
        ],
        Preset::Atari => &[
            ("target", "munchausen"),
            (MUNCHAUSEN_TAU.flag, "0.03"),
            (MUNCHAUSEN_ALPHA.flag, "0.9"),
            (MUNCHAUSEN_CLIP.flag, "-1"),
            ("optimizer", "adam"),
            (LR.flag, "0.00005"),
            (BATCH_SIZE.flag, "32"),
            (SAMPLES_PER_INSERT.flag, "8"),
            ("replay-capacity", "1000000"),
            ("learning-starts", "20000"),
            (TARGET_PERIOD.flag, "2000"),
            (EPS_START.flag, "1"),
            (EPS_END.flag, "0.01"),
            (EPS_DECAY_STEPS.flag, "250000"),
            (N_STEP.flag, "1"),
            (GAMMA.flag, "0.99"),
        ],
    };
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The preset a `hyperparams.toml` table names (`preset = "classic"`).
pub fn named(name: &str) -> Result<Preset, UnknownPreset> {
    <Preset as clap::ValueEnum>::from_str(name, false).map_err(|_| UnknownPreset(name.into()))
}

/// A preset name that no [`Preset`] has; the message lists the known ones.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown preset {0:?} (known: {known})", known = known_presets())]
pub struct UnknownPreset(pub String);

fn known_presets() -> String {
    <Preset as clap::ValueEnum>::value_variants()
        .iter()
        .filter_map(clap::ValueEnum::to_possible_value)
        .map(|v| v.get_name().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
