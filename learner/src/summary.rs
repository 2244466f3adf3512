//! The end-of-run summary: what the run did and what it kept, printed by the binary and
//! written to TensorBoard.

use millrace_core::handoff::Finished;
use std::path::PathBuf;

use millrace_replay::ReplayStats;

use crate::evaluation::{EvalRecord, Solved};
use millrace_core::update_loop::StallTimes;

/// Why a run ended without failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A snapshot reached the target and its confirmation did too.
    Solved,
    /// The step budget ran out first.
    MaxSteps,
    /// SIGINT or SIGTERM (a checkpoint was written).
    Interrupted,
    /// A component failed (or could not start): the run's error says which; a
    /// summary never has this reason.
    Failed,
}

impl StopReason {
    /// The process exit status for this outcome (failures exit 1).
    pub fn exit_code(self) -> u8 {
        match self {
            StopReason::Solved => 0,
            StopReason::MaxSteps => 2,
            StopReason::Interrupted => 130,
            StopReason::Failed => 1,
        }
    }

    /// What the run's last checkpoint records: finished for good, or not.
    pub fn finished(self) -> Option<Finished> {
        match self {
            StopReason::Solved => Some(Finished::Solved),
            StopReason::MaxSteps => Some(Finished::MaxSteps),
            StopReason::Interrupted | StopReason::Failed => None,
        }
    }
}

/// How the run solved: the snapshot and both evaluations.
#[derive(Clone, Debug, PartialEq)]
pub struct SolvedBy {
    pub params_version: u64,
    pub env_steps: u64,
    pub updates: u64,
    pub first: EvalRecord,
    pub confirm: EvalRecord,
}

impl From<&Solved> for SolvedBy {
    fn from(s: &Solved) -> Self {
        Self {
            params_version: s.params.version,
            env_steps: s.params.env_steps,
            updates: s.params.updates,
            first: s.first.clone(),
            confirm: s.confirm.clone(),
        }
    }
}

/// The end-of-run summary.
#[derive(Clone, Debug)]
pub struct RunSummary {
    pub env_id: String,
    pub reason: StopReason,
    pub target: Option<f32>,
    pub max_steps: u64,
    pub env_steps: u64,
    pub updates: u64,
    pub wall_s: f64,
    pub solved: Option<SolvedBy>,
    pub best: Option<EvalRecord>,
    pub last_eval: Option<EvalRecord>,
    pub train_return_100: Option<f32>,
    pub episodes: u64,
    pub stalls: StallTimes,
    /// The longest single hand-over of a checkpoint by the learner thread (seconds).
    pub checkpoint_stall_max: f64,
    pub checkpoint: PathBuf,
    /// Bytes allocated per transition of replay capacity.
    pub replay_bytes_per_item: f64,
    pub replay: ReplayStats,
    /// Bytes of one stored row: an observation, or one frame of a stacked one.
    pub obs_row_bytes: usize,
    /// Frames per observation (replay stores each frame once when above 1).
    pub frame_stack: usize,
    /// Updates skipped for a non-finite loss.
    pub nonfinite: u64,
}

impl std::fmt::Display for RunSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = self
            .target
            .map_or("none".to_string(), |t| format!("{t:.1}"));
        writeln!(f, "run summary ({})", self.env_id)?;
        match (&self.reason, &self.solved) {
            (StopReason::Solved, Some(s)) => {
                writeln!(
                    f,
                    "  result:          solved at {} env steps by parameters v{} ({} updates; target {target})",
                    s.env_steps, s.params_version, s.updates
                )?;
                writeln!(f, "  solving eval:    {}", s.first)?;
                writeln!(f, "  confirmed:       {} (fresh episodes)", s.confirm)?;
            }
            (StopReason::Solved, None) => {
                writeln!(f, "  result:          solved (target {target})")?
            }
            (StopReason::MaxSteps, _) if self.target.is_none() => writeln!(
                f,
                "  result:          ran its {} env steps (no target: the environment has no \
                 reward threshold and --target-return was not given)",
                self.max_steps
            )?,
            (StopReason::MaxSteps, _) => writeln!(
                f,
                "  result:          target {target} not reached within {} env steps",
                self.max_steps
            )?,
            (StopReason::Interrupted, _) => {
                writeln!(f, "  result:          interrupted (checkpoint written)")?
            }
            (StopReason::Failed, _) => writeln!(f, "  result:          failed")?,
        }
        let per_s = |n: u64| n as f64 / self.wall_s.max(1e-9);
        writeln!(f, "  wall time:       {:.2} s", self.wall_s)?;
        writeln!(
            f,
            "  env steps:       {} ({:.0}/s)",
            self.env_steps,
            per_s(self.env_steps)
        )?;
        writeln!(
            f,
            "  updates:         {} ({:.0}/s over the learner thread's {:.2} s)",
            self.updates,
            self.updates as f64 / self.stalls.total.max(1e-9),
            self.stalls.total
        )?;
        writeln!(
            f,
            "  throughput:      {:.0} samples/s, {:.0} inserts/s",
            per_s(self.replay.sampled),
            per_s(self.replay.inserted)
        )?;
        writeln!(f, "  episodes:        {}", self.episodes)?;
        let eval = |e: &Option<EvalRecord>| e.as_ref().map_or("n/a".into(), ToString::to_string);
        writeln!(f, "  best eval:       {}", eval(&self.best))?;
        writeln!(f, "  last eval:       {}", eval(&self.last_eval))?;
        writeln!(
            f,
            "  train return:    {} (last 100 episodes)",
            self.train_return_100
                .map_or("n/a".into(), |r| format!("{r:.1}"))
        )?;
        let s = &self.stalls;
        writeln!(
            f,
            "  learner time:    {:.1}% update compute (duty cycle), {:.1}% waiting for data, {:.1}% host-to-device, {:.1}% publishing, {:.1}% priorities, {:.1}% metrics, {:.1}% checkpointing (longest hand-over {:.1} ms)",
            100.0 * s.duty_cycle(),
            100.0 * s.frac(s.wait_data),
            100.0 * s.frac(s.host_to_device),
            100.0 * s.frac(s.publish),
            100.0 * s.frac(s.priorities),
            100.0 * s.frac(s.metrics),
            100.0 * s.frac(s.checkpoint),
            1e3 * self.checkpoint_stall_max,
        )?;
        if self.nonfinite > 0 {
            writeln!(f, "  non-finite:      {} updates skipped", self.nonfinite)?;
        }
        let r = &self.replay;
        let row = if self.frame_stack > 1 {
            "frame"
        } else {
            "observation"
        };
        writeln!(
            f,
            "  replay:          {} transitions, {:.3} stored {row}s each ({:.0} bytes allocated per transition, {:.3}x one {row})",
            r.size,
            r.obs_rows as f64 / r.size.max(1) as f64,
            self.replay_bytes_per_item,
            self.replay_bytes_per_item / self.obs_row_bytes.max(1) as f64,
        )?;
        if r.dropped > 0 {
            writeln!(
                f,
                "  replay dropped:  {} transitions whose stacked frames were no longer stored",
                r.dropped
            )?;
        }
        writeln!(
            f,
            "  replay ratio:    {:.1} samples per insert ({} inserted, {} sampled); blocked: actors {:.1} s, learner {:.1} s",
            r.sampled as f64 / r.inserted.max(1) as f64,
            r.inserted,
            r.sampled,
            r.insert_blocked_s,
            r.sample_blocked_s,
        )?;
        if r.priority_updates + r.stale_priority_updates + r.invalid_priorities > 0 {
            writeln!(
                f,
                "  priorities:      {} updated by TD error, {} stale (item overwritten since sampled), {} invalid (replaced, not stored), {} from actors clamped; largest {:.3}",
                r.priority_updates,
                r.stale_priority_updates,
                r.invalid_priorities,
                r.clamped_priorities,
                r.max_priority,
            )?;
        }
        if r.evicted > 0 {
            writeln!(
                f,
                "  poison:          {} replay item(s) evicted (TD errors not finite or beyond the value bounds); the updates they spoiled were skipped",
                r.evicted
            )?;
        }
        let kept: Vec<&str> = [
            ("latest/", true),
            ("best/", self.best.is_some()),
            ("solved/", self.solved.is_some()),
        ]
        .iter()
        .filter(|(_, k)| *k)
        .map(|(d, _)| *d)
        .collect();
        writeln!(
            f,
            "  checkpoint:      {} ({})",
            self.checkpoint.display(),
            kept.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(mean: f32) -> EvalRecord {
        EvalRecord {
            params_version: 12,
            env_steps: 8000,
            updates: 3500,
            episodes: 100,
            seed: 1,
            mean,
            std: 10.0,
            stderr: 1.0,
            min: 400.0,
            max: 500.0,
        }
    }

    #[test]
    fn a_solved_summary_names_the_snapshot_and_both_evaluations() {
        let s = RunSummary {
            env_id: "CartPole-v1".into(),
            reason: StopReason::Solved,
            target: Some(475.0),
            max_steps: 200_000,
            env_steps: 9000,
            updates: 4000,
            wall_s: 3.0,
            solved: Some(SolvedBy {
                params_version: 12,
                env_steps: 8000,
                updates: 3500,
                first: record(480.0),
                confirm: record(478.0),
            }),
            best: Some(record(480.0)),
            last_eval: Some(record(480.0)),
            train_return_100: Some(200.0),
            episodes: 100,
            stalls: StallTimes::default(),
            checkpoint_stall_max: 0.0,
            checkpoint: PathBuf::from("runs/m/checkpoint"),
            replay_bytes_per_item: 50.0,
            replay: ReplayStats::default(),
            obs_row_bytes: 16,
            frame_stack: 1,
            nonfinite: 0,
        };
        let text = s.to_string();
        assert!(
            text.contains(
                "solved at 8000 env steps by parameters v12 (3500 updates; target 475.0)"
            ),
            "{text}"
        );
        assert!(text.contains("confirmed:       478.0 ± 1.0"), "{text}");
        assert!(text.contains("(latest/, best/, solved/)"), "{text}");
        assert_eq!(StopReason::Solved.exit_code(), 0);
        assert_eq!(StopReason::MaxSteps.exit_code(), 2);
        assert_eq!(StopReason::Interrupted.exit_code(), 130);
    }
}
