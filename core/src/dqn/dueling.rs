//! The dueling head (Wang et al. 2016): Q(s, a) = V(s) + A(s, a) − mean_a A(s, a), from
//! a value stream and an advantage stream.
//!
//! Here the streams are the two halves of the last hidden layer (`--hidden 256,256
//! --dueling`: a shared layer of 256, then streams of 128 each): the last linear layer
//! has `A + 1` outputs `z = [V, A_1..A_A]`, V reading only the first half of the hidden
//! units and the advantages only the second (a fixed mask on that layer's weights,
//! applied at initialisation and to every gradient, so Adam never moves the masked
//! weights off zero), and `Q = z · M` with the fixed `(A + 1) × A` matrix `M`
//! (`M[0, j] = 1`, `M[1 + i, j] = δ_ij − 1/A`).
//!
//! Since `M` is linear, the published network is a plain MLP: its last layer is
//! `W · M` and `b · M`. Actors, evaluation, `export` and the saved `best/` and
//! `solved/` policies see ordinary parameters of the published [`NetworkSpec`]; only
//! the learner's own state (and `latest/`, for `--resume`) holds the streams.

use millrace_proto::NetworkSpec;
use tch::{Device, Kind, Tensor};

/// Most actions a dueling head combines (its matrix holds (A + 1) x A floats: 64 MiB
/// at this many).
pub const MAX_ACTIONS: usize = 4096;

/// Most entries of the stream mask (last hidden width x (A + 1)).
const MAX_MASK: usize = 1 << 28;

/// The streams and their combination, for one network.
#[derive(Debug)]
pub struct DuelingHead {
    /// What everyone else sees: `num_actions` outputs.
    published: NetworkSpec,
    /// The learner's: `num_actions + 1` outputs.
    internal: NetworkSpec,
    /// `[A + 1, A]` and its transpose.
    combine: Tensor,
    combine_t: Tensor,
    /// `[1, in, A + 1]`: 1 where the last layer's weight is a stream's.
    mask: Tensor,
}

/// Why a network cannot have a dueling head ([`DuelingHead::new`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DuelingError {
    #[error("a dueling head needs a hidden layer to split into its two streams")]
    NoHidden,
    #[error(
        "a dueling head splits the last hidden layer in two streams: it needs an even width, got {0}"
    )]
    OddWidth(usize),
    #[error("a dueling head combines 1..={MAX_ACTIONS} actions, got {0}")]
    Actions(usize),
    #[error(
        "a dueling head over a last hidden layer of {last} and {actions} actions is too large"
    )]
    TooLarge { last: usize, actions: usize },
}

impl DuelingHead {
    /// The head for `published`, or why it cannot have one.
    pub fn new(published: &NetworkSpec, device: Device) -> Result<Self, DuelingError> {
        let last = *published.hidden.last().ok_or(DuelingError::NoHidden)?;
        if last < 2 || last % 2 != 0 {
            return Err(DuelingError::OddWidth(last));
        }
        let a = published.num_actions;
        // Sized before allocating (a spec may come from a file): the combining matrix
        // is (A + 1) x A and the mask last x (A + 1).
        if a == 0 || a > MAX_ACTIONS {
            return Err(DuelingError::Actions(a));
        }
        if last.checked_mul(a + 1).is_none_or(|n| n > MAX_MASK) {
            return Err(DuelingError::TooLarge { last, actions: a });
        }
        let mut internal = published.clone();
        internal.num_actions = a + 1;
        let mut m = vec![0f32; (a + 1) * a];
        for j in 0..a {
            m[j] = 1.0;
            for i in 0..a {
                m[(1 + i) * a + j] = if i == j { 1.0 } else { 0.0 } - 1.0 / a as f32;
            }
        }
        let combine = Tensor::from_slice(&m)
            .view([(a + 1) as i64, a as i64])
            .to_device(device);
        let half = last / 2;
        let mut mask = vec![0f32; last * (a + 1)];
        for r in 0..last {
            for c in 0..=a {
                let value_stream = r < half;
                mask[r * (a + 1) + c] = f32::from(u8::from((c == 0) == value_stream));
            }
        }
        Ok(Self {
            published: published.clone(),
            internal,
            combine_t: combine.transpose(0, 1).contiguous(),
            combine,
            mask: Tensor::from_slice(&mask)
                .view([1, last as i64, (a + 1) as i64])
                .to_device(device),
        })
    }

    pub fn published(&self) -> &NetworkSpec {
        &self.published
    }

    /// The learner's network: the published one with the extra value output.
    pub fn internal(&self) -> &NetworkSpec {
        &self.internal
    }

    /// Q-values from the last layer's outputs `[K, N, A + 1]`.
    pub fn q(&self, z: &Tensor) -> Tensor {
        z.matmul(&self.combine)
    }

    /// The gradient at the last layer's outputs from the gradient at Q `[K, N, A]`.
    pub fn dz(&self, dq: &Tensor) -> Tensor {
        dq.matmul(&self.combine_t)
    }

    /// Zeroes the cross-stream entries of the last layer's weight gradient (or weight)
    /// `[K, in, A + 1]`, in place.
    pub fn mask(&self, w: &Tensor) {
        let mut w = w.shallow_clone();
        let _ = w.g_mul_(&self.mask);
    }

    /// Zeroes the cross-stream weights in one agent's flat internal parameters.
    pub fn mask_host(&self, params: &mut [f32]) {
        let layout = self.internal.layout();
        let w = &layout.entries[layout.entries.len() - 2];
        let (rows, cols) = (w.shape[0], w.shape[1]);
        let half = rows / 2;
        for r in 0..rows {
            for c in 0..cols {
                if (c == 0) != (r < half) {
                    params[w.offset + r * cols + c] = 0.0;
                }
            }
        }
    }

    /// The published parameters `[K, P_published]` of internal ones `[K, P_internal]`:
    /// everything as it is, but the last layer folded with `M`.
    pub fn fold(&self, flat: &Tensor) -> Tensor {
        let (int, publ) = (self.internal.layout(), self.published.layout());
        let k = flat.size()[0];
        let n = int.entries.len();
        let (w, b) = (&int.entries[n - 2], &int.entries[n - 1]);
        let piece = |offset: usize, len: usize| flat.narrow(1, offset as i64, len as i64);
        let w_pub = piece(w.offset, w.len)
            .view([k, w.shape[0] as i64, w.shape[1] as i64])
            .matmul(&self.combine)
            .view([k, -1]);
        let b_pub = piece(b.offset, b.len).matmul(&self.combine);
        let mut parts = vec![piece(0, w.offset), w_pub, b_pub];
        let tail = int.len - (b.offset + b.len);
        if tail > 0 {
            parts.push(piece(b.offset + b.len, tail));
        }
        let out = Tensor::cat(&parts, 1);
        debug_assert_eq!(out.size()[1] as usize, publ.len);
        out.to_kind(Kind::Float)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::{DType, ObsSpec};

    fn spec() -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        NetworkSpec::mlp(&obs, &[8, 6], 4, 2).unwrap()
    }

    #[test]
    fn q_is_value_plus_centred_advantages() {
        let head = DuelingHead::new(&spec(), Device::Cpu).unwrap();
        let z = Tensor::from_slice(&[2.0f32, 1.0, 2.0, 3.0, 6.0]).view([1, 1, 5]);
        let q = Vec::<f32>::try_from(head.q(&z).view([-1])).unwrap();
        // V = 2, A = [1, 2, 3, 6] with mean 3.
        assert_eq!(q, [0.0, 1.0, 2.0, 5.0]);
    }

    #[test]
    fn refuses_layers_it_cannot_split() {
        let mut odd = spec();
        odd.hidden = vec![8, 5];
        assert!(DuelingHead::new(&odd, Device::Cpu)
            .unwrap_err()
            .to_string()
            .contains("even"));
        odd.hidden = vec![];
        assert!(DuelingHead::new(&odd, Device::Cpu).is_err());
    }

    #[test]
    fn a_huge_action_count_is_refused_before_allocating() {
        // 200,000 actions: a 160 GB combining matrix, refused in one line.
        let mut huge = spec();
        huge.num_actions = 200_000;
        let e = DuelingHead::new(&huge, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1..=4096 actions, got 200000"), "{e}");
        huge.num_actions = 0;
        assert!(DuelingHead::new(&huge, Device::Cpu).is_err());
        let mut wide = spec();
        wide.num_actions = 4096;
        wide.hidden = vec![1 << 20];
        assert!(DuelingHead::new(&wide, Device::Cpu)
            .unwrap_err()
            .to_string()
            .contains("too large"));
    }

    #[test]
    fn the_mask_keeps_the_streams_apart() {
        let head = DuelingHead::new(&spec(), Device::Cpu).unwrap();
        let layout = head.internal().layout();
        let mut p = vec![1f32; layout.len];
        head.mask_host(&mut p);
        let w = &layout.entries[4];
        assert_eq!(w.shape, [6, 5]);
        for r in 0..6 {
            let row = &p[w.offset + r * 5..w.offset + (r + 1) * 5];
            if r < 3 {
                assert_eq!(row, [1.0, 0.0, 0.0, 0.0, 0.0], "value stream row {r}");
            } else {
                assert_eq!(row, [0.0, 1.0, 1.0, 1.0, 1.0], "advantage stream row {r}");
            }
        }
        let device = Tensor::ones([2, 6, 5], (Kind::Float, Device::Cpu));
        head.mask(&device);
        let host = Vec::<f32>::try_from(device.narrow(0, 0, 1).view([-1])).unwrap();
        assert_eq!(host, p[w.offset..w.offset + w.len]);
    }
}
