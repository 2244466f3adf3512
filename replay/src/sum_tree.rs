//! Proportional prioritized selection (Schaul et al. 2016; Ape-X): a sum tree over the
//! shard's positions, with a min tree beside it for the largest importance-sampling
//! weight.
//!
//! An item with priority `p` is drawn with probability `w / Σw`, where its weight is
//! `w = max(p, MIN_PRIORITY)^α`. The floor keeps every live item drawable and every
//! importance weight finite: all-zero priorities sample uniformly, and a priority of
//! 1e-300 cannot underflow α-powers or divide by zero. Both trees are complete binary
//! trees in one array each (root at 1, leaves at `size..2·size`); an update rewrites
//! the leaf and recomputes each ancestor from its two children, so no rounding error
//! accumulates over updates (every internal node is within a few ulps of the exact sum
//! of its subtree, however many updates came before: the drift test below checks 10⁶).
//! Insert, update, delete and sample are O(log n).
//!
//! Priorities from outside (the learner's TD errors, actors' initial priorities) are
//! validated by whoever calls the shard; this type asserts only in debug builds that it
//! is given finite, non-negative numbers, and maps anything else to the floor.

use crate::selector::Selector;

/// Priorities below this count as this: see the module docs.
pub const MIN_PRIORITY: f64 = 1e-6;

/// Sum tree and min tree over a shard's positions; see the module docs.
#[derive(Debug)]
pub struct Prioritized {
    alpha: f64,
    /// Leaves start here (a power of two ≥ capacity).
    size: usize,
    sum: Vec<f64>,
    min: Vec<f64>,
    /// The raw priority of each position (for checkpoints); `None` where nothing lives.
    raw: Vec<Option<f64>>,
    live: usize,
}

impl Prioritized {
    /// A selector over `capacity` positions that weighs items by `priority^alpha`
    /// (`alpha` = 0 is uniform; Ape-X and Schaul et al. use 0.6).
    pub fn new(capacity: usize, alpha: f64) -> Self {
        assert!(
            alpha.is_finite() && alpha >= 0.0,
            "alpha must be finite and non-negative, got {alpha}"
        );
        let capacity = capacity.max(1);
        let size = capacity.next_power_of_two();
        Self {
            alpha,
            size,
            sum: vec![0.0; 2 * size],
            min: vec![f64::INFINITY; 2 * size],
            raw: vec![None; capacity],
            live: 0,
        }
    }

    /// The weight an item of `priority` gets.
    pub fn weight(&self, priority: f64) -> f64 {
        debug_assert!(
            priority.is_finite() && priority >= 0.0,
            "priorities are validated before they reach a selector: {priority}"
        );
        let p = if priority.is_finite() {
            priority.max(MIN_PRIORITY)
        } else {
            MIN_PRIORITY
        };
        p.powf(self.alpha)
    }

    /// The weight of the item at `pos`, if one lives there.
    pub fn weight_at(&self, pos: usize) -> Option<f64> {
        self.raw.get(pos)?.map(|_| self.sum[self.size + pos])
    }

    /// Items stored.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn set(&mut self, pos: usize, weight: f64, min: f64) {
        let mut i = self.size + pos;
        self.sum[i] = weight;
        self.min[i] = min;
        while i > 1 {
            i /= 2;
            self.sum[i] = self.sum[2 * i] + self.sum[2 * i + 1];
            self.min[i] = self.min[2 * i].min(self.min[2 * i + 1]);
        }
    }
}

impl Selector for Prioritized {
    fn insert(&mut self, pos: usize, priority: f64) {
        debug_assert!(self.raw[pos].is_none(), "position {pos} is occupied");
        if self.raw[pos].is_none() {
            self.live += 1;
        }
        self.raw[pos] = Some(priority);
        let w = self.weight(priority);
        self.set(pos, w, w);
    }

    fn update(&mut self, pos: usize, priority: f64) {
        if self.raw.get(pos).is_some_and(Option::is_some) {
            self.raw[pos] = Some(priority);
            let w = self.weight(priority);
            self.set(pos, w, w);
        }
    }

    fn delete(&mut self, pos: usize) {
        if self.raw.get(pos).is_some_and(Option::is_some) {
            self.raw[pos] = None;
            self.live -= 1;
            self.set(pos, 0.0, f64::INFINITY);
        }
    }

    fn total(&self) -> f64 {
        self.sum[1]
    }

    fn sample(&self, u: f64) -> Option<usize> {
        if self.live == 0 {
            return None;
        }
        // Clamp into [0, total): a stale or rounded u, NaN included, still lands on a
        // live item. Descending never enters a zero-weight subtree while u < its
        // sibling's sum, and every live leaf has weight > 0 (the floor).
        let total = self.sum[1];
        let mut u = if u.is_nan() { 0.0 } else { u.clamp(0.0, total) };
        let mut i = 1;
        while i < self.size {
            let left = self.sum[2 * i];
            if u < left || self.sum[2 * i + 1] == 0.0 {
                i *= 2;
            } else {
                u -= left;
                i = 2 * i + 1;
            }
        }
        let pos = i - self.size;
        // Rounding can leave u at the right edge of the last live leaf's interval only
        // through a leaf of weight 0, which the descent above never picks; guard anyway.
        if self.raw.get(pos).is_some_and(Option::is_some) {
            Some(pos)
        } else {
            self.raw.iter().position(Option::is_some)
        }
    }

    fn weight(&self, pos: usize) -> f64 {
        self.weight_at(pos).unwrap_or(0.0)
    }

    /// For the largest importance weight `(N · w_min / Σw)^-β`; `+∞` when empty.
    fn min_weight(&self) -> f64 {
        self.min[1]
    }

    fn priority(&self, pos: usize) -> Option<f64> {
        self.raw.get(pos).copied().flatten()
    }

    fn clear(&mut self) {
        self.sum.fill(0.0);
        self.min.fill(f64::INFINITY);
        self.raw.fill(None);
        self.live = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// Draws `n` samples with uniform u in [0, total); counts per position.
    fn histogram(s: &Prioritized, n: usize, seed: u64) -> Vec<u64> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut counts = vec![0u64; s.raw.len()];
        for _ in 0..n {
            let u = rng.random::<f64>() * s.total();
            counts[s.sample(u).expect("something is stored")] += 1;
        }
        counts
    }

    #[test]
    fn the_sampled_distribution_matches_the_priorities() {
        // Capacity not a power of two; priorities spanning three orders of magnitude;
        // some positions deleted.
        let alpha = 0.6;
        let mut s = Prioritized::new(100, alpha);
        let mut rng = SmallRng::seed_from_u64(7);
        for pos in 0..100 {
            s.insert(pos, 10f64.powf(rng.random_range(-2.0..1.0)));
        }
        for pos in (0..100).step_by(7) {
            s.delete(pos);
        }
        let n = 400_000;
        let counts = histogram(&s, n, 11);
        let total: f64 = (0..100).filter_map(|p| s.weight_at(p)).sum();
        // Each count is binomial(n, q): within 5 standard deviations (a false alarm
        // about once in 1.7 million per position, 100 positions).
        for (pos, &count) in counts.iter().enumerate() {
            let q = s.weight_at(pos).map_or(0.0, |w| w / total);
            let (mean, sd) = (n as f64 * q, (n as f64 * q * (1.0 - q)).sqrt());
            let got = count as f64;
            assert!(
                (got - mean).abs() <= 5.0 * sd + 1e-9,
                "position {pos}: {got} draws, expected {mean:.0} ± {sd:.0}"
            );
        }
        // And a chi-square over all live positions: 86 degrees of freedom, whose 99.99th
        // percentile is about 138.
        let chi2: f64 = (0..100)
            .filter_map(|pos| {
                let q = s.weight_at(pos)? / total;
                let e = n as f64 * q;
                Some((counts[pos] as f64 - e).powi(2) / e)
            })
            .sum();
        assert!(
            chi2 < 138.0,
            "chi-square {chi2:.1} with 86 degrees of freedom"
        );
    }

    #[test]
    fn zero_and_tiny_priorities_sample_uniformly_without_nan() {
        for p in [0.0, 1e-300, f64::MIN_POSITIVE] {
            let mut s = Prioritized::new(8, 0.6);
            for pos in 0..8 {
                s.insert(pos, p);
            }
            assert!(s.total() > 0.0 && s.total().is_finite());
            let w = s.min_weight();
            assert!(w > 0.0 && w.is_finite());
            let counts = histogram(&s, 80_000, 3);
            for c in counts {
                // Binomial(80000, 1/8): sd 93.5; 5 sd.
                assert!((c as f64 - 10_000.0).abs() < 470.0, "{c}");
            }
            // Importance weights relative to the largest are all 1.
            let max_iw = (8.0 * w / s.total()).powf(-0.4);
            let iw = (8.0 * s.weight_at(3).unwrap() / s.total()).powf(-0.4) / max_iw;
            assert!((iw - 1.0).abs() < 1e-12, "{iw}");
        }
        // One large priority among zeros takes almost every draw, the zeros still some.
        let mut s = Prioritized::new(4, 1.0);
        for pos in 0..4 {
            s.insert(pos, 0.0);
        }
        s.update(2, 1.0);
        let counts = histogram(&s, 100_000, 5);
        assert!(counts[2] > 99_990, "{counts:?}");
    }

    #[test]
    fn the_trees_do_not_drift_over_a_million_updates() {
        let mut s = Prioritized::new(1000, 0.6);
        let mut rng = SmallRng::seed_from_u64(1);
        for pos in 0..1000 {
            s.insert(pos, rng.random::<f64>());
        }
        for _ in 0..1_000_000 {
            let pos = rng.random_range(0..1000);
            // Priorities over ten orders of magnitude, the hard case for sums.
            s.update(pos, 10f64.powf(rng.random_range(-6.0..4.0)));
        }
        let exact: f64 = {
            // Kahan-compensated sum of the leaves.
            let (mut sum, mut c) = (0.0f64, 0.0f64);
            for pos in 0..1000 {
                let y = s.weight_at(pos).unwrap() - c;
                let t = sum + y;
                c = (t - sum) - y;
                sum = t;
            }
            sum
        };
        let rel = (s.total() - exact).abs() / exact;
        assert!(rel < 1e-12, "the root is off by {rel:e} of the leaves' sum");
        let min = (0..1000)
            .filter_map(|p| s.weight_at(p))
            .fold(f64::INFINITY, f64::min);
        assert_eq!(s.min_weight(), min, "the min tree is exact");
    }

    #[test]
    fn importance_weights_match_a_direct_computation() {
        let (alpha, beta) = (0.6, 0.4);
        let priorities = [0.5, 2.0, 0.01, 7.5, 1.0];
        let mut s = Prioritized::new(5, alpha);
        for (pos, p) in priorities.iter().enumerate() {
            s.insert(pos, *p);
        }
        // Directly: P(i) = p_i^α / Σ p^α; w_i = (N·P(i))^-β / max_j (N·P(j))^-β.
        let powered: Vec<f64> = priorities.iter().map(|p: &f64| p.powf(alpha)).collect();
        let z: f64 = powered.iter().sum();
        let direct: Vec<f64> = powered.iter().map(|w| (5.0 * w / z).powf(-beta)).collect();
        let max = direct.iter().cloned().fold(0.0, f64::max);
        let n = s.len() as f64;
        let largest = (n * s.min_weight() / s.total()).powf(-beta);
        for (pos, d) in direct.iter().enumerate() {
            let ours = (n * s.weight_at(pos).unwrap() / s.total()).powf(-beta) / largest;
            assert!(
                (ours - d / max).abs() < 1e-12,
                "{pos}: {ours} vs {}",
                d / max
            );
        }
        assert!((s.total() - z).abs() < 1e-12);
    }

    #[test]
    fn deletes_updates_and_clear_keep_the_trees_consistent() {
        let mut s = Prioritized::new(3, 1.0);
        assert_eq!((s.sample(0.5), s.min_weight()), (None, f64::INFINITY));
        s.insert(0, 1.0);
        s.insert(1, 3.0);
        s.insert(2, 6.0);
        assert_eq!(s.total(), 10.0);
        assert_eq!(s.sample(0.999), Some(0));
        assert_eq!(s.sample(1.0), Some(1));
        assert_eq!(s.sample(9.999), Some(2));
        assert_eq!(s.sample(42.0), Some(2), "clamped");
        assert_eq!(s.sample(-1.0), Some(0), "clamped");
        assert_eq!(s.sample(f64::NAN), Some(0), "NaN lands on a live item");
        s.delete(1);
        assert_eq!((s.total(), s.len()), (7.0, 2));
        assert_eq!(s.sample(1.5), Some(2), "a deleted item is never drawn");
        s.update(1, 100.0);
        assert_eq!(s.total(), 7.0, "an update of a deleted position is ignored");
        assert_eq!(s.priority(1), None);
        s.update(2, 2.0);
        assert_eq!(
            (s.total(), s.priority(2), s.min_weight()),
            (3.0, Some(2.0), 1.0)
        );
        s.clear();
        assert_eq!((s.total(), s.len(), s.sample(0.0)), (0.0, 0, None));
        s.insert(1, 0.5);
        assert_eq!(s.sample(0.0), Some(1));
    }
}
