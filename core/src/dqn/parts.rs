//! The pieces of a [`super::Dqn`]'s state, each one kind of tensor: the flat
//! parameters with their views, Adam's moments and step counts, and the statistics
//! summed on the device between reads.

use tch::Tensor;

/// Online, target and gradient as flat `[K, P]` tensors, and the views of them the
/// passes read and write, made once: everything is updated in place, so views stay
/// valid.
pub(super) struct FlatParams {
    /// `[K, P]`.
    pub(super) online: Tensor,
    /// Views of `online` per parameter, and the weights' transposes.
    pub(super) online_views: Vec<Tensor>,
    pub(super) online_wt: Vec<Tensor>,
    /// `[K, P]` gradient buffer and its per-parameter views (written by `gradient`).
    pub(super) grad: Tensor,
    pub(super) grad_views: Vec<Tensor>,
    /// The LayerNorms' gains and biases (see [`super::net::norm_views`]) of `online`,
    /// `target` and `grad`: fp32 under every precision. Empty without LayerNorm.
    pub(super) online_norm: Vec<Tensor>,
    pub(super) target_norm: Vec<Tensor>,
    pub(super) grad_norm: Vec<Tensor>,
    /// The IQN head's embedding (weight `[K, n, H₀]`, bias `[K, 1, H₀]`), empty
    /// without one.
    pub(super) online_iqn: Vec<Tensor>,
    pub(super) target_iqn: Vec<Tensor>,
    pub(super) grad_iqn: Vec<Tensor>,
    /// `[K, P]`.
    pub(super) target: Tensor,
    /// Views of `target` per parameter.
    pub(super) target_views: Vec<Tensor>,
}

/// Adam's (or RMSProp's) state.
pub(super) struct AdamState {
    /// First and second moments (RMSProp: E[g] and E[g²]), `[K, P]`.
    pub(super) m: Tensor,
    pub(super) v: Tensor,
    /// Steps attempted, counted on the host (checkpoints, the host path's corrections).
    pub(super) step: u64,
    /// `[K, 1]` f64: each agent's own step t (agents that joined later count fewer),
    /// on the device, where the tensor optimizer computes the bias corrections from
    /// it: no host scalar changes from one update to the next.
    pub(super) t: Tensor,
}

/// Statistics summed on the device since the last read.
pub(super) struct StatSums {
    /// Updates since the last read.
    pub(super) updates: u64,
    /// `[loss, mean |td|, mean q]`, summed.
    pub(super) detail_sum: Tensor,
    /// Per agent `[K, 1]`: updates skipped for a non-finite loss since the last read,
    /// and how many in a row up to now.
    pub(super) nonfinite: Tensor,
    pub(super) nonfinite_streak: Tensor,
}
