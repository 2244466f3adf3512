//! The implicit quantile network's head (IQN, Dabney et al. 2018): what the learner, the
//! actors and `export` agree on.
//!
//! The network returns the τ-quantiles `Z_τ(s, a)` of the return, for any quantile
//! fraction τ in (0, 1). The first hidden layer's output `ψ(s)` (after its LayerNorm
//! and ReLU) is multiplied, element by element, by an embedding of τ,
//! `φ(τ) = ReLU(Σ_{i<n} cos(π·i·τ)·w_i + b)`, and the rest of the MLP maps the product
//! to one value per action. So the torso and the first hidden layer run once per
//! observation, and only the layers after them once per τ. (Dopamine's IQN multiplies
//! the torso's output instead, which runs the first hidden layer once per τ too.)
//!
//! Acting takes the mean over a fixed set of fractions, `τ_j = (j + ½)/m` for
//! `j < m` ([`IqnHead::quantiles`], 32 by default): the same set on every actor and in
//! every evaluation, so acting is reproducible. The learner samples its fractions.

use serde::{Deserialize, Serialize};

/// Most cosines an embedding may have, and most fractions actors may act on
/// ([`crate::NetworkSpec::validate`]).
pub const MAX_IQN_SIZE: usize = 1024;

/// The IQN head of a [`crate::NetworkSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IqnHead {
    /// Cosines in τ's embedding, `n` (64 in the paper).
    pub embedding: usize,
    /// Fractions actors and evaluation average over, `m` (32 in the paper).
    pub quantiles: usize,
}

impl Default for IqnHead {
    fn default() -> Self {
        Self {
            embedding: 64,
            quantiles: 32,
        }
    }
}

impl IqnHead {
    /// The fixed fractions acting averages over: `(j + ½)/m`.
    pub fn act_fractions(&self) -> Vec<f32> {
        let m = self.quantiles as f32;
        (0..self.quantiles).map(|j| (j as f32 + 0.5) / m).collect()
    }

    /// `cos(π·i·τ)` for `i` in `0..out.len()`, into `out`.
    pub fn cosines(tau: f32, out: &mut [f32]) {
        for (i, c) in out.iter_mut().enumerate() {
            *c = (std::f32::consts::PI * i as f32 * tau).cos();
        }
    }

    /// Checks a head read from a file or a peer.
    pub fn check(&self) -> Result<(), IqnHeadError> {
        if !(1..=MAX_IQN_SIZE).contains(&self.embedding)
            || !(1..=MAX_IQN_SIZE).contains(&self.quantiles)
        {
            return Err(IqnHeadError(*self));
        }
        Ok(())
    }
}

/// An IQN head out of range ([`IqnHead::check`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an IQN head needs 1..={MAX_IQN_SIZE} cosines and acting fractions, got {0:?}")]
pub struct IqnHeadError(pub IqnHead);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acting_fractions_are_the_midpoints() {
        let head = IqnHead {
            embedding: 4,
            quantiles: 4,
        };
        assert_eq!(head.act_fractions(), [0.125, 0.375, 0.625, 0.875]);
        let mut c = [0.0; 3];
        IqnHead::cosines(0.5, &mut c);
        assert!((c[0] - 1.0).abs() < 1e-6 && c[1].abs() < 1e-6 && (c[2] + 1.0).abs() < 1e-6);
        assert!(head.check().is_ok());
        assert!(IqnHead {
            embedding: 0,
            quantiles: 4
        }
        .check()
        .is_err());
        assert!(IqnHead {
            embedding: 4,
            quantiles: MAX_IQN_SIZE + 1
        }
        .check()
        .is_err());
    }

    #[test]
    fn the_embedding_is_laid_out_last_and_counted() {
        let obs = crate::ObsSpec {
            shape: vec![4],
            dtype: crate::DType::F32,
        };
        let mut spec = crate::NetworkSpec::mlp(&obs, &[8, 6], 2, 1).unwrap();
        let plain = spec.layout();
        spec.layer_norm = true;
        spec.iqn = Some(IqnHead {
            embedding: 5,
            quantiles: 3,
        });
        let layout = spec.layout();
        assert_eq!(
            layout.entries, plain.entries,
            "the MLP's offsets do not move"
        );
        assert_eq!(layout.iqn[0].shape, [5, 8]);
        assert_eq!(layout.iqn[0].offset, plain.len + 2 * (8 + 6));
        assert_eq!(layout.iqn[1].shape, [8]);
        assert_eq!(layout.len, layout.iqn[1].offset + 8);
        assert_eq!(spec.checked_param_count(), Some(layout.len));
        assert_eq!(spec.validate(), Ok(()));
        // Old specs (files, peers) have no such field: no head.
        let mut json = serde_json::to_value(&spec).unwrap();
        json.as_object_mut().unwrap().remove("iqn");
        assert!(serde_json::from_value::<crate::NetworkSpec>(json)
            .unwrap()
            .iqn
            .is_none());
        let mut bare = spec.clone();
        bare.hidden.clear();
        assert!(bare
            .validate()
            .unwrap_err()
            .to_string()
            .contains("hidden layer"));
        let mut huge = spec;
        huge.iqn = Some(IqnHead {
            embedding: usize::MAX,
            quantiles: 3,
        });
        assert!(huge.validate().is_err());
    }
}
