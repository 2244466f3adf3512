//! The replay-sampling flags (`--replay prioritized` and its settings), checked into
//! [`PriorityOptions`].

use anyhow::bail;
use serde::Serialize;

use millrace_core::priority_feedback::BetaSchedule;

/// How replay chooses what to sample.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayKind {
    /// Every stored transition equally likely.
    Uniform,
    /// Proportional prioritized replay (Schaul et al. 2016; Ape-X): transition i drawn
    /// with probability p_i^α / Σ p^α, p = |TD error| from the learner (or the actor's
    /// initial priority; new items otherwise get the largest priority seen),
    /// importance-sampling weights (N·P(i))^-β normalised by the largest.
    Prioritized,
}

/// `--replay` and the prioritized settings.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayFlags {
    /// Replay sampling: uniform, or prioritized (proportional to |TD error|^α).
    #[arg(long, value_enum, default_value_t = ReplayKind::Uniform)]
    pub replay: ReplayKind,

    /// Prioritized replay: priority exponent α (0 is uniform).
    #[arg(long, default_value_t = 0.6)]
    pub priority_alpha: f64,

    /// Prioritized replay: importance-sampling exponent β at the start.
    #[arg(long, default_value_t = 0.4)]
    pub priority_beta: f64,

    /// Prioritized replay: β at the end of its linear anneal (default: --priority-beta,
    /// fixed, as Ape-X; Schaul et al. anneal it to 1).
    #[arg(long)]
    pub priority_beta_final: Option<f64>,

    /// Prioritized replay: env steps over which β anneals (default: --max-steps).
    #[arg(long)]
    pub priority_beta_steps: Option<u64>,

    /// Prioritized replay: updates whose TD errors are read back and applied as
    /// priorities at once (by a thread of their own; lock-step runs apply them inline,
    /// on a GPU a round late).
    #[arg(long, default_value_t = 8)]
    pub priority_feedback_every: usize,

    /// Staging buffers the sampler fills ahead of the learner (default: as many as fit
    /// about 64 MiB, 512 MiB on a GPU, at most 256; with --replay prioritized at most
    /// 8, so that batches are not drawn from priorities many updates old).
    #[arg(long)]
    pub prefetch_depth: Option<usize>,
}

/// Prioritized replay's settings, as the run uses them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PriorityOptions {
    pub alpha: f64,
    pub beta: BetaSchedule,
    pub feedback_every: usize,
}

/// Updates whose TD errors are read back at once with uniform replay, to find poison
/// (prioritized replay reads them back every `--priority-feedback-every`).
pub const POISON_CHECK_EVERY: usize = 8;

/// The learner's feedback into `table`, for updates on `device`: with `priority`, TD
/// errors back as priorities, β set for `env_steps` (a resumed run's or agent's); for
/// every replay, items whose |TD error| is not finite or beyond `poison_td` evicted as
/// poison ([`millrace_core::poison`]).
pub fn feedback(
    priority: Option<&PriorityOptions>,
    table: &std::sync::Arc<millrace_replay::Table>,
    device: tch::Device,
    env_steps: u64,
    poison_td: f32,
) -> millrace_core::priority_feedback::PriorityFeedback {
    millrace_core::priority_feedback::PriorityFeedback::new(
        std::sync::Arc::clone(table),
        priority.map(|p| p.beta),
        priority.map_or(POISON_CHECK_EVERY, |p| p.feedback_every),
        device,
        env_steps,
        poison_td,
    )
}

/// Staging buffers with priorities on, unless `--prefetch-depth` says otherwise: each
/// is a batch drawn from priorities that many updates old.
pub const PRIORITIZED_PREFETCH_DEPTH: usize = 8;

impl ReplayFlags {
    /// The prioritized settings (`None` for uniform replay), checked; `max_steps`
    /// is β's default anneal length.
    pub fn priority(&self, max_steps: u64) -> anyhow::Result<Option<PriorityOptions>> {
        if let Some(d) = self.prefetch_depth {
            if !(2..=256).contains(&d) {
                bail!("--prefetch-depth must be between 2 and 256, got {d}");
            }
        }
        if self.replay == ReplayKind::Uniform {
            return Ok(None);
        }
        let unit = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(anyhow::anyhow!("--{name} must be between 0 and 1, got {v}"))
            }
        };
        let alpha = millrace_replay::PriorityConfig::checked_alpha(self.priority_alpha)
            .map_err(|e| anyhow::anyhow!("--priority-alpha {e}"))?;
        unit("priority-beta", self.priority_beta)?;
        let end = self.priority_beta_final.unwrap_or(self.priority_beta);
        unit("priority-beta-final", end)?;
        if !(1..=4096).contains(&self.priority_feedback_every) {
            bail!(
                "--priority-feedback-every must be between 1 and 4096, got {}",
                self.priority_feedback_every
            );
        }
        Ok(Some(PriorityOptions {
            alpha,
            beta: BetaSchedule {
                start: self.priority_beta,
                end,
                steps: self.priority_beta_steps.unwrap_or(max_steps),
            },
            feedback_every: self.priority_feedback_every,
        }))
    }
}
