//! Poison in replay, found by the TD errors it causes.
//!
//! Values are screened before they are stored (`millrace_proto::bounds`), but a bound a
//! user raised, or an environment that misbehaves within it, can still put a transition
//! in replay whose TD error explodes: one reward of 3e38 made every update that sampled
//! it overflow, and the learner stopped after `--max-nonfinite` skipped updates (issue
//! "One bad transition…", part 1). The learner's feedback reads every update's TD
//! errors back in rounds; an item whose |TD error| is not finite, or beyond anything a
//! transition within the run's value bounds can give or large enough to overflow a
//! batch's loss ([`td_bound`]), is evicted from replay and counted. The update it spoiled was already skipped on the device (a
//! non-finite loss masks it); once the item is gone, training goes on, and only a run
//! that keeps diverging with no such item to blame reaches `--max-nonfinite`.

/// How far beyond the largest honest |TD error| a poisoned one must be.
pub const MARGIN: f64 = 1e3;

/// The |TD error| beyond which an item is poison, for a run whose stored rewards are at
/// most `max_abs_reward` (an n-step return), whose discount is `gamma` and whose
/// batches hold `batch` items: a network whose values are those of some policy has
/// |Q| ≤ R / (1 − γ), so an honest target and estimate differ by at most
/// R (1 + 2 / (1 − γ)), and [`MARGIN`] times that is nothing a learning network
/// reaches; and whatever the bounds (a user may raise them to 1e38), an error whose
/// batch's loss could overflow (beyond `f32::MAX / (4 · batch)`) is poison.
pub fn td_bound(max_abs_reward: f32, gamma: f32, batch: usize) -> f32 {
    let horizon = 1.0 / (1.0 - f64::from(gamma)).max(1e-6);
    let honest = MARGIN * f64::from(max_abs_reward) * (1.0 + 2.0 * horizon);
    let overflow = f64::from(f32::MAX) / (4.0 * batch.max(1) as f64);
    honest.min(overflow) as f32
}

/// The positions, in a round of |TD errors|, of the items that are poison: not finite,
/// or beyond `bound`.
pub fn culprits(td_abs: &[f32], bound: f32) -> Vec<usize> {
    td_abs
        .iter()
        .enumerate()
        .filter(|(_, td)| !td.is_finite() || td.abs() > bound)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_follows_the_rewards_and_the_horizon_below_overflow() {
        // CartPole, 3-step: rewards of at most ~3, γ = 0.99.
        let b = td_bound(3.0, 0.99, 256);
        assert!(b > 1e5 && b < 1e6, "{b}");
        assert!(td_bound(3e6, 0.99, 256) > 1e11);
        // Bounds raised past anything: still below where a batch's loss overflows.
        let top = td_bound(f32::MAX, 0.99, 256);
        assert!(top.is_finite() && top < 3e38 / 256.0, "{top}");
        assert!(
            td_bound(1.0, 1.0, 32).is_finite(),
            "γ = 1 is not a division by zero"
        );
    }

    #[test]
    fn non_finite_and_exploding_errors_are_culprits_and_nothing_else() {
        let tds = [0.5, f32::NAN, 1e3, f32::INFINITY, 3e38, 2e5];
        assert_eq!(culprits(&tds, 1e5), [1, 3, 4, 5]);
        assert_eq!(culprits(&tds, f32::INFINITY), [1, 3]);
        assert_eq!(culprits(&tds, td_bound(f32::MAX, 0.99, 256)), [1, 3, 4]);
        assert!(culprits(&[0.0; 64], 1.0).is_empty());
    }
}
