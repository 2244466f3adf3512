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

/// At most this share of a round may be poison: a few items in a round are bad data,
/// more are the network itself diverging (its own values blown up), which is
/// `--max-nonfinite`'s to judge, not any item's or actor's fault.
pub const MAX_SHARE: usize = 16;

/// The positions, in a round of |TD errors|, of the items that are poison: not finite,
/// or beyond `bound` and [`MARGIN`] times the round's median (an outlier, not a
/// network whose every error grew). Empty when more than one item in [`MAX_SHARE`]
/// would be: that is divergence, not poison.
pub fn culprits(td_abs: &[f32], bound: f32) -> Vec<usize> {
    let mut finite: Vec<f32> = td_abs
        .iter()
        .map(|t| t.abs())
        .filter(|t| t.is_finite())
        .collect();
    let median = if finite.is_empty() {
        0.0
    } else {
        let mid = finite.len() / 2;
        *finite.select_nth_unstable_by(mid, f32::total_cmp).1
    };
    let outlier = bound.max(median * MARGIN as f32);
    let culprits: Vec<usize> = td_abs
        .iter()
        .enumerate()
        .filter(|(_, td)| !td.is_finite() || td.abs() > outlier)
        .map(|(i, _)| i)
        .collect();
    if culprits.len() * MAX_SHARE > td_abs.len().max(MAX_SHARE) {
        return Vec::new();
    }
    culprits
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
        let mut tds = vec![0.5f32; 58];
        tds.extend([f32::NAN, 1e3, f32::INFINITY, 3e38, 2e5, 0.7]);
        assert_eq!(culprits(&tds, 1e5), [58, 60, 61, 62]);
        assert_eq!(culprits(&tds, f32::INFINITY), [58, 60]);
        assert_eq!(culprits(&tds, td_bound(f32::MAX, 0.99, 256)), [58, 60, 61]);
        assert!(culprits(&[0.0; 64], 1.0).is_empty());
    }

    #[test]
    fn a_network_whose_errors_all_grew_is_diverging_not_poisoned() {
        // Every error beyond the bound, but none an outlier: no culprit.
        let grown: Vec<f32> = (0..64).map(|i| 1e7 + i as f32).collect();
        assert!(culprits(&grown, 6e5).is_empty());
        // More than one item in 16 beyond everything: divergence, not poison.
        let mut many = vec![0.5f32; 64];
        for t in many.iter_mut().take(5) {
            *t = f32::NAN;
        }
        assert!(culprits(&many, 1e5).is_empty());
        many[4] = 0.5;
        assert_eq!(culprits(&many, 1e5), [0, 1, 2, 3], "four in 64 is poison");
    }
}
