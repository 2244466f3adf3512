//! Greedy evaluation of published parameters, and what the run keeps because of it.
//!
//! An evaluation plays a parameter snapshot (an `Arc<Params>`, never "the latest"
//! looked up again later), so the parameters it reports on are the ones the run can
//! save. [`EvalTracker`] turns results into decisions: a new best (highest mean, the
//! earliest on ties) is saved as `best/`; a result at the target is confirmed by a
//! second evaluation of the same snapshot on fresh episode seeds before the run counts
//! as solved, and the confirmed snapshot is saved as `solved/`.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use millrace_actor::{EvalError, EvalResult};
use millrace_proto::{EnvConfig, NetworkSpec, Params};
use serde::{Deserialize, Serialize};

/// One evaluation's outcome, as reported and saved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// The parameters played.
    pub params_version: u64,
    pub env_steps: u64,
    pub updates: u64,
    pub episodes: usize,
    /// Seed of the episodes' start states.
    pub seed: u64,
    pub mean: f32,
    pub std: f32,
    pub stderr: f32,
    pub min: f32,
    pub max: f32,
}

impl EvalRecord {
    pub fn new(params: &Params, seed: u64, result: &EvalResult) -> Self {
        Self {
            params_version: params.version,
            env_steps: params.env_steps,
            updates: params.updates,
            episodes: result.returns.len(),
            seed,
            mean: result.mean(),
            std: result.std(),
            stderr: result.stderr(),
            min: result.min(),
            max: result.max(),
        }
    }
}

impl std::fmt::Display for EvalRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} ± {:.1} (sd {:.1}, min {:.0}, max {:.0}; {} episodes, parameters v{} at {} env steps)",
            self.mean,
            self.stderr,
            self.std,
            self.min,
            self.max,
            self.episodes,
            self.params_version,
            self.env_steps
        )
    }
}

/// Why an evaluation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The periodic one, every `--eval-every` env steps.
    Regular,
    /// A second look at a snapshot that reached the target, on fresh episodes.
    Confirm,
}

/// The episodes' seed: regular evaluations draw fresh start states per evaluation
/// point; a confirmation draws from a separate stream, so its episodes are never the
/// ones that put the snapshot at the target.
pub fn eval_seed(run_seed: u64, purpose: Purpose, key: u64) -> u64 {
    let stream = match purpose {
        Purpose::Regular => 0xe7a1,
        Purpose::Confirm => 0xc0f1_12e5,
    };
    millrace_actor::derive_seed(run_seed ^ stream, key)
}

/// Plays `params` greedily for `episodes` episodes of `env` with millrace's own
/// environments (or the bridged ones) and batched CPU inference; returns are true
/// scores (unclipped, whole games).
pub fn evaluate(
    env: &EnvConfig,
    network: &NetworkSpec,
    params: &Params,
    episodes: usize,
    seed: u64,
) -> Result<EvalResult, EvalError> {
    millrace_actor::eval::evaluate_params(env, network, params, episodes, seed)
}

/// A request to the evaluator thread.
#[derive(Debug)]
pub struct EvalRequest {
    pub params: Arc<Params>,
    pub purpose: Purpose,
    pub seed: u64,
}

/// The evaluator thread's answer: the snapshot it played and how it did.
#[derive(Debug)]
pub struct EvalDone {
    pub params: Arc<Params>,
    pub purpose: Purpose,
    pub record: EvalRecord,
}

/// A thread that evaluates snapshots one at a time (beside training, on its own core
/// time), keeping each snapshot with its result.
#[derive(Debug)]
pub struct Evaluator {
    requests: Option<Sender<EvalRequest>>,
    pub done: Receiver<EvalDone>,
    handle: Option<JoinHandle<Result<(), EvaluatorError>>>,
}

impl Evaluator {
    /// `fail`: fail at the first request (tests of the shutdown path).
    pub fn spawn(
        env: EnvConfig,
        network: NetworkSpec,
        episodes: usize,
        fail: bool,
    ) -> std::io::Result<Self> {
        let (requests, rx) = crossbeam_channel::bounded::<EvalRequest>(1);
        let (done_tx, done) = crossbeam_channel::bounded::<EvalDone>(4);
        let handle = std::thread::Builder::new()
            .name("eval".into())
            .spawn(move || {
                for req in rx {
                    if fail {
                        return Err(EvaluatorError::Injected);
                    }
                    let result = evaluate(&env, &network, &req.params, episodes, req.seed)?;
                    let record = EvalRecord::new(&req.params, req.seed, &result);
                    let answer = EvalDone {
                        params: req.params,
                        purpose: req.purpose,
                        record,
                    };
                    if done_tx.send(answer).is_err() {
                        break;
                    }
                }
                Ok(())
            })?;
        Ok(Self {
            requests: Some(requests),
            done,
            handle: Some(handle),
        })
    }

    /// Queues a request unless one is already waiting; returns whether it was queued.
    pub fn try_request(&self, req: EvalRequest) -> bool {
        self.requests
            .as_ref()
            .is_some_and(|r| r.try_send(req).is_ok())
    }

    /// Whether the thread has ended (by itself, that is a failure).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops the thread after the evaluation in progress; returns its error, if any.
    pub fn join(mut self) -> Result<(), EvaluatorError> {
        drop(self.requests.take());
        match self.handle.take().map(crate::joined) {
            Some(joined) => joined?,
            None => Ok(()),
        }
    }
}

/// Why the evaluator thread ended early ([`Evaluator::join`]).
#[derive(Debug, thiserror::Error)]
pub enum EvaluatorError {
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("injected fault at the first evaluation")]
    Injected,
    #[error(transparent)]
    Panicked(#[from] millrace_proto::panics::Panicked),
}

/// A run declared solved: the snapshot and both of its evaluations.
#[derive(Clone, Debug)]
pub struct Solved {
    pub params: Arc<Params>,
    pub first: EvalRecord,
    pub confirm: EvalRecord,
}

/// What to do after an evaluation.
#[derive(Debug, Default)]
pub struct Decision {
    /// Save this snapshot as `best/`.
    pub new_best: bool,
    /// Evaluate this snapshot again on fresh episodes before declaring the run solved.
    pub confirm: Option<Arc<Params>>,
    /// The run is solved: save `solved/` and stop.
    pub solved: Option<Solved>,
    /// A candidate at the target was not confirmed (its confirmation came back below).
    pub not_confirmed: Option<EvalRecord>,
}

/// Keeps the best evaluation and the solving one; pure logic, shared by the threaded
/// coordinator and the lock-step mode.
#[derive(Debug, Default)]
pub struct EvalTracker {
    target: Option<f32>,
    pub best: Option<EvalRecord>,
    pub last: Option<EvalRecord>,
    /// A candidate at the target, awaiting its confirmation.
    candidate: Option<EvalRecord>,
    pub solved: Option<Solved>,
}

impl EvalTracker {
    /// `best`: the best evaluation so far, if the run continues one; only a better one
    /// replaces it.
    pub fn new(target: Option<f32>, best: Option<EvalRecord>) -> Self {
        Self {
            target,
            best,
            ..Self::default()
        }
    }

    /// Whether a confirmation is pending (no regular evaluation should start meanwhile).
    pub fn confirming(&self) -> bool {
        self.candidate.is_some()
    }

    /// Decides what an evaluation's result means.
    pub fn record(&mut self, done: &EvalDone) -> Decision {
        let mut d = Decision::default();
        let rec = &done.record;
        match done.purpose {
            Purpose::Regular => {
                self.last = Some(rec.clone());
                // Strictly better: the earliest of equal means stays the best.
                if self.best.as_ref().is_none_or(|b| rec.mean > b.mean) {
                    self.best = Some(rec.clone());
                    d.new_best = true;
                }
                let at_target = self.target.is_some_and(|t| rec.mean >= t);
                if at_target && self.solved.is_none() && self.candidate.is_none() {
                    self.candidate = Some(rec.clone());
                    d.confirm = Some(Arc::clone(&done.params));
                }
            }
            Purpose::Confirm => {
                let Some(first) = self.candidate.take() else {
                    return d;
                };
                if self.target.is_some_and(|t| rec.mean >= t) {
                    let solved = Solved {
                        params: Arc::clone(&done.params),
                        first,
                        confirm: rec.clone(),
                    };
                    self.solved = Some(solved.clone());
                    d.solved = Some(solved);
                } else {
                    d.not_confirmed = Some(rec.clone());
                }
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(version: u64, mean: f32, purpose: Purpose) -> EvalDone {
        let params = Arc::new(Params {
            version,
            env_steps: version * 1000,
            updates: version * 10,
            population: 1,
            data: vec![version as f32],
        });
        let result = EvalResult {
            returns: vec![mean - 1.0, mean + 1.0],
        };
        EvalDone {
            record: EvalRecord::new(&params, 7, &result),
            params,
            purpose,
        }
    }

    #[test]
    fn the_best_is_the_highest_mean_and_the_earliest_on_ties() {
        let mut t = EvalTracker::new(None, None);
        assert!(t.record(&done(1, 100.0, Purpose::Regular)).new_best);
        assert!(!t.record(&done(2, 90.0, Purpose::Regular)).new_best);
        assert!(t.record(&done(3, 150.0, Purpose::Regular)).new_best);
        assert!(
            !t.record(&done(4, 150.0, Purpose::Regular)).new_best,
            "a tie"
        );
        assert_eq!(t.best.as_ref().unwrap().params_version, 3);
        assert_eq!(t.last.as_ref().unwrap().params_version, 4);
        assert!(t.solved.is_none(), "no target, never solved");
    }

    #[test]
    fn a_continued_run_keeps_its_best_until_beaten() {
        let before = done(3, 150.0, Purpose::Regular).record;
        let mut t = EvalTracker::new(None, Some(before));
        assert!(!t.record(&done(8, 120.0, Purpose::Regular)).new_best);
        assert_eq!(t.best.as_ref().unwrap().params_version, 3);
        assert!(t.record(&done(9, 160.0, Purpose::Regular)).new_best);
    }

    #[test]
    fn a_candidate_at_the_target_is_solved_only_once_confirmed() {
        let mut t = EvalTracker::new(Some(475.0), None);
        let first = t.record(&done(5, 480.0, Purpose::Regular));
        let again = first.confirm.expect("a confirmation is asked for");
        assert_eq!(again.version, 5, "the same snapshot, not a newer one");
        assert!(t.confirming());
        // A confirmation below the target: not solved, and the next candidate may try.
        let no = t.record(&done(5, 300.0, Purpose::Confirm));
        assert!(no.solved.is_none() && no.not_confirmed.is_some());
        assert!(!t.confirming());
        let second = t.record(&done(9, 500.0, Purpose::Regular));
        assert!(second.confirm.is_some());
        let yes = t.record(&done(9, 495.0, Purpose::Confirm));
        let solved = yes.solved.expect("confirmed");
        assert_eq!(solved.params.version, 9);
        assert_eq!((solved.first.mean, solved.confirm.mean), (500.0, 495.0));
        // Once solved, later results ask for nothing more.
        assert!(t
            .record(&done(10, 500.0, Purpose::Regular))
            .confirm
            .is_none());
    }

    #[test]
    fn confirmation_seeds_are_fresh() {
        let regular: Vec<u64> = (0..100)
            .map(|k| eval_seed(3, Purpose::Regular, k * 2000))
            .collect();
        let confirm = eval_seed(3, Purpose::Confirm, 5);
        assert!(!regular.contains(&confirm));
        assert_ne!(
            eval_seed(3, Purpose::Confirm, 5),
            eval_seed(3, Purpose::Confirm, 6)
        );
    }

    #[test]
    fn a_record_reports_mean_and_spread_of_the_snapshot_played() {
        let d = done(4, 10.0, Purpose::Regular);
        let r = &d.record;
        assert_eq!((r.params_version, r.env_steps, r.updates), (4, 4000, 40));
        assert_eq!((r.mean, r.min, r.max, r.episodes), (10.0, 9.0, 11.0, 2));
        assert!((r.std - std::f32::consts::SQRT_2).abs() < 1e-5);
        assert!(r.to_string().starts_with("10.0 ± 1.0"), "{r}");
    }
}
