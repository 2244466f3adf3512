//! A convolutional torso as a plan of steps: the one description the learner (tch, on
//! the device), the actors (plain Rust, on the CPU) and `export` (PyTorch modules) each
//! execute, so that a new kind of torso is a new plan rather than three new passes.
//!
//! Two torsos exist: a stack of plain convolutions, each followed by a ReLU (the Nature
//! and MinAtar DQNs, [`crate::ConvLayer`]), and the IMPALA network's residual torso
//! ([`ImpalaTorso`], Espeholt et al. 2018): per stage a 3×3 convolution, a 3×3 max-pool
//! of stride 2, then residual blocks `x + conv(relu(conv(relu(x))))`; a ReLU after the
//! last stage, and optionally an adaptive max-pool of its output (Beyond The Rainbow,
//! Clark et al. 2025).

use serde::{Deserialize, Serialize};

/// One convolution of a pixel torso: `out_channels` filters of `kernel × kernel`,
/// stride `stride`, no padding, ReLU after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvLayer {
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
}

/// The convolutional torso of the Nature DQN (Mnih et al. 2015).
pub const NATURE_CONV: [ConvLayer; 3] = [
    ConvLayer {
        out_channels: 32,
        kernel: 8,
        stride: 4,
    },
    ConvLayer {
        out_channels: 64,
        kernel: 4,
        stride: 2,
    },
    ConvLayer {
        out_channels: 64,
        kernel: 3,
        stride: 1,
    },
];

/// The MinAtar DQN's torso (Young & Tian 2019): 16 filters of 3×3, stride 1, for
/// 10×10 observations.
pub const MINATAR_CONV: [ConvLayer; 1] = [ConvLayer {
    out_channels: 16,
    kernel: 3,
    stride: 1,
}];

/// The IMPALA network's channels per stage (Espeholt et al. 2018), before any width
/// multiplier.
pub const IMPALA_CHANNELS: [usize; 3] = [16, 32, 32];

/// Residual blocks per stage in the IMPALA network.
pub const IMPALA_BLOCKS: usize = 2;

/// Most residual blocks a stage may have ([`NetworkSpec::validate`]).
pub const MAX_BLOCKS: usize = 64;

/// Most steps a torso's plan may have ([`NetworkSpec::validate`]): far past any real
/// network, so a crafted spec cannot make every pass loop for long.
pub const MAX_TORSO_STEPS: usize = 4096;

/// The IMPALA network's residual torso over `u8` image observations `[C, H, W]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImpalaTorso {
    /// Output channels of each stage: [`IMPALA_CHANNELS`] times the width multiplier
    /// (×2 in Schmidt & Schmied 2021 and in Beyond The Rainbow).
    pub channels: Vec<usize>,
    /// Residual blocks per stage ([`IMPALA_BLOCKS`]).
    pub blocks: usize,
    /// An adaptive max-pool of the last stage's output to `pool × pool` where that
    /// output is larger (6 in Beyond The Rainbow, which turns Atari's 11×11 into 6×6);
    /// 0 for none.
    pub pool: usize,
}

impl ImpalaTorso {
    /// The IMPALA network with its channels times `width`.
    pub fn new(width: usize, pool: usize) -> Self {
        Self {
            channels: IMPALA_CHANNELS.iter().map(|c| c * width).collect(),
            blocks: IMPALA_BLOCKS,
            pool,
        }
    }
}

/// One step of a torso's plan, applied to the activations `[C, H, W]` of each image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorsoStep {
    /// Convolution number `index` (its filters are `ParamLayout::conv[2·index]`, its
    /// biases `[2·index + 1]`), zero-padded by `padding` on every side.
    Conv {
        index: usize,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    Relu,
    /// Max over `kernel × kernel` windows at `stride`, padded by `padding` with −∞
    /// (PyTorch's `max_pool2d`).
    MaxPool {
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    /// PyTorch's `adaptive_max_pool2d` to `size × size`: output cell `i` of an axis of
    /// length `n` is the max over `[⌊i·n/size⌋, ⌈(i+1)·n/size⌉)`.
    AdaptiveMaxPool {
        size: usize,
    },
    /// Keeps the activations for the next [`TorsoStep::AddSaved`] (a residual block's
    /// input).
    Save,
    /// Adds the activations kept by the matching [`TorsoStep::Save`].
    AddSaved,
}

impl TorsoStep {
    /// The activations' shape after this step, given the shape before it; `None` where
    /// it does not fit (an image smaller than a kernel, a channel count that does not
    /// match, arithmetic that would overflow).
    pub fn output(
        &self,
        (c, h, w): (usize, usize, usize),
        saved: Option<(usize, usize, usize)>,
    ) -> Option<(usize, usize, usize)> {
        let window = |x: usize, kernel: usize, stride: usize, padding: usize| {
            x.checked_add(padding.checked_mul(2)?)?
                .checked_sub(kernel)?
                .checked_div(stride)
                .map(|q| q + 1)
        };
        match *self {
            TorsoStep::Conv {
                in_channels,
                out_channels,
                ..
            } => (in_channels == c && out_channels > 0).then_some(())?,
            TorsoStep::MaxPool { .. } | TorsoStep::Relu | TorsoStep::Save => {}
            TorsoStep::AdaptiveMaxPool { size } => (size > 0).then_some(())?,
            TorsoStep::AddSaved => (saved? == (c, h, w)).then_some(())?,
        }
        let out = match *self {
            TorsoStep::Conv {
                out_channels,
                kernel,
                stride,
                padding,
                ..
            } => (
                out_channels,
                window(h, kernel, stride, padding)?,
                window(w, kernel, stride, padding)?,
            ),
            TorsoStep::MaxPool {
                kernel,
                stride,
                padding,
            } => {
                // PyTorch's rule: padding at most half the kernel.
                (kernel > 0 && 2 * padding <= kernel).then_some(())?;
                (
                    c,
                    window(h, kernel, stride, padding)?,
                    window(w, kernel, stride, padding)?,
                )
            }
            TorsoStep::AdaptiveMaxPool { size } => (c, size, size),
            TorsoStep::Relu | TorsoStep::Save | TorsoStep::AddSaved => (c, h, w),
        };
        (out.1 > 0 && out.2 > 0).then_some(out)
    }
}

/// A network's torso, as a [`NetworkSpec`](crate::NetworkSpec) holds it
/// ([`NetworkSpec::torso`](crate::NetworkSpec::torso)): the image it reads and either
/// plain convolutions or the IMPALA torso (or neither: an MLP on flat observations).
#[derive(Clone, Copy, Debug)]
pub struct Torso<'a> {
    /// The observation's shape `[C, H, W]` (empty for flat observations).
    pub image: &'a [usize],
    pub conv: &'a [ConvLayer],
    pub impala: Option<&'a ImpalaTorso>,
}

impl Torso<'_> {
    /// The torso's steps in order (empty for an MLP on flat observations).
    pub fn plan(&self) -> Vec<TorsoStep> {
        let mut plan = Vec::new();
        let mut in_channels = self.image.first().copied().unwrap_or(0);
        let mut conv = |plan: &mut Vec<TorsoStep>, out: usize, kernel, stride, padding| {
            let index = plan
                .iter()
                .filter(|s| matches!(s, TorsoStep::Conv { .. }))
                .count();
            plan.push(TorsoStep::Conv {
                index,
                in_channels,
                out_channels: out,
                kernel,
                stride,
                padding,
            });
            in_channels = out;
        };
        for l in self.conv {
            conv(&mut plan, l.out_channels, l.kernel, l.stride, 0);
            plan.push(TorsoStep::Relu);
        }
        if let Some(t) = self.impala {
            // A crafted spec cannot make the plan long: validate refuses it first, and
            // the plan stops growing past the bound.
            for &channels in &t.channels {
                conv(&mut plan, channels, 3, 1, 1);
                plan.push(TorsoStep::MaxPool {
                    kernel: 3,
                    stride: 2,
                    padding: 1,
                });
                for _ in 0..t.blocks.min(MAX_BLOCKS) {
                    plan.push(TorsoStep::Save);
                    plan.push(TorsoStep::Relu);
                    conv(&mut plan, channels, 3, 1, 1);
                    plan.push(TorsoStep::Relu);
                    conv(&mut plan, channels, 3, 1, 1);
                    plan.push(TorsoStep::AddSaved);
                }
                if plan.len() > MAX_TORSO_STEPS {
                    break;
                }
            }
            plan.push(TorsoStep::Relu);
            if t.pool > 0 {
                if let Some((_, h, w)) = shapes_of(self.image, &plan).last().copied().flatten() {
                    if h > t.pool || w > t.pool {
                        plan.push(TorsoStep::AdaptiveMaxPool { size: t.pool });
                    }
                }
            }
        }
        plan
    }

    /// The activations' shape after each step of [`Torso::plan`] (`None` from the
    /// first step that does not fit on).
    pub fn shapes(&self) -> Vec<Option<(usize, usize, usize)>> {
        shapes_of(self.image, &self.plan())
    }

    /// The torso's flattened output size, if it fits the image.
    pub fn features(&self) -> Option<usize> {
        let (c, h, w) = (*self.shapes().last()?)?;
        c.checked_mul(h)?.checked_mul(w)
    }

    /// Whether there is a convolutional torso at all.
    pub fn exists(&self) -> bool {
        !self.conv.is_empty() || self.impala.is_some()
    }

    /// Checks a torso read from a file or a peer, which feeds a head of `head_inputs`
    /// inputs (see [`NetworkSpec::validate`](crate::NetworkSpec::validate)).
    pub fn check(&self, head_inputs: usize) -> Result<(), TorsoError> {
        if let Some(t) = self.impala {
            if !self.conv.is_empty() {
                return Err(TorsoError::ConvAndImpala);
            }
            if t.channels.is_empty() || t.channels.contains(&0) || t.blocks > MAX_BLOCKS {
                return Err(TorsoError::BadImpala(t.clone()));
            }
            let steps = t.channels.len().saturating_mul(2 + 6 * t.blocks);
            if steps > MAX_TORSO_STEPS {
                return Err(TorsoError::TooManySteps(t.clone()));
            }
        }
        if !self.exists() {
            return Ok(());
        }
        if self.image.len() != 3 || self.image.contains(&0) {
            return Err(TorsoError::NotAnImage(self.image.to_vec()));
        }
        if self.features() != Some(head_inputs) {
            return Err(TorsoError::HeadInputs {
                image: self.image.to_vec(),
                head_inputs,
            });
        }
        Ok(())
    }
}

/// What is wrong with a torso read from a file or a peer ([`Torso::check`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TorsoError {
    #[error("a network has plain convolutions or the IMPALA torso, not both")]
    ConvAndImpala,
    #[error(
        "the IMPALA torso needs at least one stage of positive channels and at most {MAX_BLOCKS} blocks a stage, got {0:?}"
    )]
    BadImpala(ImpalaTorso),
    #[error("the IMPALA torso {0:?} has over {MAX_TORSO_STEPS} steps")]
    TooManySteps(ImpalaTorso),
    #[error("a convolutional network needs [C, H, W] observations, got {0:?}")]
    NotAnImage(Vec<usize>),
    #[error("the torso over {image:?} does not give the head's {head_inputs} inputs")]
    HeadInputs {
        image: Vec<usize>,
        head_inputs: usize,
    },
}

fn shapes_of(image: &[usize], plan: &[TorsoStep]) -> Vec<Option<(usize, usize, usize)>> {
    let mut cur = match image {
        &[c, h, w] => Some((c, h, w)),
        _ => None,
    };
    let mut saved = Vec::new();
    plan.iter()
        .map(|step| {
            let before = cur?;
            match step {
                TorsoStep::Save => saved.push(before),
                TorsoStep::AddSaved => {
                    let s = saved.pop();
                    cur = step.output(before, s);
                    return cur;
                }
                _ => {}
            }
            cur = step.output(before, None);
            cur
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, NetworkSpec, ObsSpec};

    fn image(shape: &[usize]) -> ObsSpec {
        ObsSpec {
            shape: shape.to_vec(),
            dtype: DType::U8,
        }
    }

    #[test]
    fn impala_shapes_at_atari_and_minatar_sizes() {
        let atari =
            NetworkSpec::impala_cnn(&image(&[4, 84, 84]), &ImpalaTorso::new(1, 0), 6).unwrap();
        // Each stage halves (rounding up): 84 → 42 → 21 → 11.
        assert_eq!(atari.torso_shapes().last(), Some(&Some((32, 11, 11))));
        assert_eq!(atari.obs_dim, 32 * 11 * 11);
        assert_eq!(atari.hidden, [256]);
        // 15 convolutions: a stage's first and two per residual block.
        let plan = atari.torso_plan();
        let convs = plan
            .iter()
            .filter(|s| matches!(s, TorsoStep::Conv { .. }))
            .count();
        assert_eq!(convs, 15);
        assert_eq!(atari.layout().conv.len(), 30);
        // 16·4·9+16 + 4·(16·16·9+16) + 32·16·9+32 + 4·(32·32·9+32) + 32·32·9+32 + 4·(32·32·9+32)
        let torso = (16 * 4 * 9 + 16)
            + 4 * (16 * 16 * 9 + 16)
            + (32 * 16 * 9 + 32)
            + 4 * (32 * 32 * 9 + 32)
            + (32 * 32 * 9 + 32)
            + 4 * (32 * 32 * 9 + 32);
        let head = 3872 * 256 + 256 + 256 * 6 + 6;
        assert_eq!(atari.checked_param_count(), Some(torso + head));
        assert_eq!(atari.layout().len, torso + head);
        assert_eq!(atari.validate(), Ok(()));

        // Beyond The Rainbow's: twice the width, the last stage pooled to 6×6.
        let btr =
            NetworkSpec::impala_cnn(&image(&[4, 84, 84]), &ImpalaTorso::new(2, 6), 6).unwrap();
        assert_eq!(
            btr.torso_plan().last(),
            Some(&TorsoStep::AdaptiveMaxPool { size: 6 })
        );
        assert_eq!(btr.obs_dim, 64 * 6 * 6);
        assert_eq!(btr.validate(), Ok(()));

        // MinAtar: 10 → 5 → 3 → 2, smaller than the pool, which is then left out.
        let minatar =
            NetworkSpec::impala_cnn(&image(&[4, 10, 10]), &ImpalaTorso::new(1, 6), 3).unwrap();
        assert_eq!(minatar.obs_dim, 32 * 2 * 2);
        assert!(!minatar
            .torso_plan()
            .contains(&TorsoStep::AdaptiveMaxPool { size: 6 }));
    }

    #[test]
    fn plain_convolutions_are_a_plan_too() {
        let nature = NetworkSpec::nature_cnn(&image(&[4, 84, 84]), 6).unwrap();
        let plan = nature.torso_plan();
        assert_eq!(plan.len(), 6);
        assert_eq!(
            plan[2],
            TorsoStep::Conv {
                index: 1,
                in_channels: 32,
                out_channels: 64,
                kernel: 4,
                stride: 2,
                padding: 0
            }
        );
        let shapes: Vec<_> = nature.torso_shapes().into_iter().flatten().collect();
        assert_eq!(shapes[4], (64, 7, 7));
        assert_eq!(nature.torso_features(), Some(3136));
    }

    #[test]
    fn crafted_impala_torsos_are_refused() {
        let good =
            NetworkSpec::impala_cnn(&image(&[4, 10, 10]), &ImpalaTorso::new(1, 0), 3).unwrap();
        let mut both = good.clone();
        both.conv = crate::MINATAR_CONV.to_vec();
        assert!(both
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not both"));
        let mut many = good.clone();
        many.impala.as_mut().unwrap().blocks = usize::MAX;
        assert!(many.validate().is_err());
        let mut deep = good.clone();
        deep.impala.as_mut().unwrap().channels = vec![8; 1 << 20];
        assert!(deep.validate().is_err());
        assert!(deep.torso_plan().len() <= MAX_TORSO_STEPS + 16);
        let mut zero = good.clone();
        zero.impala.as_mut().unwrap().channels = vec![16, 0];
        assert!(zero.validate().is_err());
        let mut off = good.clone();
        off.obs_dim += 1;
        assert!(off.validate().unwrap_err().to_string().contains("head's"));
        let mut wide = good;
        wide.impala.as_mut().unwrap().channels = vec![usize::MAX / 2];
        assert!(wide.validate().is_err(), "overflow is refused, not wrapped");
        assert!(NetworkSpec::impala_cnn(&image(&[4, 0, 10]), &ImpalaTorso::new(1, 0), 3).is_err());
    }

    #[test]
    fn max_pool_pads_as_pytorch_does() {
        let pool = TorsoStep::MaxPool {
            kernel: 3,
            stride: 2,
            padding: 1,
        };
        assert_eq!(pool.output((1, 5, 5), None), Some((1, 3, 3)));
        assert_eq!(pool.output((1, 1, 1), None), Some((1, 1, 1)));
        let too_much = TorsoStep::MaxPool {
            kernel: 3,
            stride: 2,
            padding: 2,
        };
        assert_eq!(too_much.output((1, 5, 5), None), None);
        assert_eq!(TorsoStep::AddSaved.output((1, 5, 5), Some((2, 5, 5))), None);
    }
}
