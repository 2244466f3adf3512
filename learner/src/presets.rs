//! `--preset`: a published configuration as flags, applied beneath the command line
//! (an explicit flag wins) and above the environment's defaults
//! (`learner/hyperparams.toml`); the effective settings are printed and saved as
//! every run's are.

/// Flags and values, by flag name without dashes.
pub type Flags = std::collections::BTreeMap<String, String>;

/// A published configuration.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Ape-X DQN (Horgan et al. 2018): prioritized replay with α 0.6 and β 0.4,
    /// 3-step double-DQN returns, a dueling network, centred RMSProp at 0.00025/4,
    /// batches of 512, the target network every 2,500 updates, gradients clipped to
    /// norm 40, and each environment's own fixed ε = 0.4^(1+7i/(N−1)).
    Apex,
}

/// The preset's flags, by flag name without dashes.
pub fn flags(preset: Preset) -> Flags {
    let pairs: &[(&str, &str)] = match preset {
        Preset::Apex => &[
            ("replay", "prioritized"),
            ("priority-alpha", "0.6"),
            ("priority-beta", "0.4"),
            ("n-step", "3"),
            ("gamma", "0.99"),
            ("dueling", "true"),
            ("optimizer", "rmsprop"),
            ("lr", "0.0000625"),
            ("batch-size", "512"),
            ("target-period", "2500"),
            ("max-grad-norm", "40"),
            ("apex-epsilon", "true"),
        ],
    };
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}
