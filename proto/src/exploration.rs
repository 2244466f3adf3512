//! Ape-X's exploration ladder: which ε each actor explores with. The learner's server
//! hands remote actors theirs in the welcome, in-process actors compute their own, and
//! both must agree.

/// Ape-X's per-actor exploration: exploration index `index` of `of` gets
/// `base^(1 + alpha·index/(of−1))` (Horgan et al. 2018 use base 0.4, alpha 7), from 0.4
/// down to 0.4⁸ ≈ 0.00066.
pub fn apex_epsilon(index: u32, of: u32, base: f32, alpha: f32) -> f32 {
    if of <= 1 {
        return base;
    }
    base.powf(1.0 + alpha * index as f32 / (of - 1) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apex_epsilons_span_base_to_base_to_the_eighth() {
        assert_eq!(apex_epsilon(0, 1, 0.4, 7.0), 0.4);
        assert!((apex_epsilon(0, 64, 0.4, 7.0) - 0.4).abs() < 1e-6);
        assert!((apex_epsilon(63, 64, 0.4, 7.0) - 0.4f32.powi(8)).abs() < 1e-7);
        let mid = apex_epsilon(9, 19, 0.4, 7.0);
        assert!((mid - 0.4f32.powf(4.5)).abs() < 1e-6);
    }
}
