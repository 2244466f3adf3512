//! Mixed precision (`--precision bf16`): the convolutions and hidden layers of the
//! forward and backward passes in bfloat16; the last layer, the parameters, their
//! gradients, the optimizer's state and every step in fp32.
//!
//! As PyTorch's autocast with fp32 master weights: the learner keeps its fp32
//! parameters as they are and, beside them, bf16 copies of the online and target
//! networks that the passes read ([`HalfCopies`]), refreshed from the fp32 ones after
//! every optimizer step (the online copy) and every target change (the target copy: at
//! a sync, or after each update with Polyak averaging); one fused cast-copy of the flat
//! `[K, P]` tensor each. The convolutions and hidden layers run in bf16 (on Ampere and
//! later GPUs, on their tensor cores). The last layer runs in fp32 on the fp32
//! parameters: it is small, and bf16's 8 significant bits would round Q-values near 100
//! (CartPole's) to steps of 0.5, as large as the TD errors late in training, and tie
//! close actions in double DQN's argmax. So Q-values, targets, the Huber derivative and
//! the TD errors (which become priorities) are fp32; each layer's gradient is written
//! into the fp32 gradient buffer, so clipping, Adam or RMSProp, the non-finite check
//! and the target's Polyak average never see bf16. bf16 keeps fp32's exponent range, so
//! no loss scaling is needed (fp16 would need it).
//!
//! Where it is refused: a CUDA device without native bf16 arithmetic (compute
//! capability below 8.0, e.g. a V100 or a T4), which PyTorch emulates more slowly than
//! fp32. The CPU is accepted (PyTorch has bf16 kernels there too; tests run them): on a
//! CPU with bf16 instructions it speeds up convolutions and large batches and slows
//! down CartPole's small MLPs (BENCHMARKS.md, "Mixed precision"); without them PyTorch
//! emulates bf16, expected slower throughout (not measured).

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::device::DeviceChoice;

/// The arithmetic of the learner's forward and backward passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything in fp32.
    #[default]
    Fp32,
    /// Forward and backward in bf16, with fp32 parameters, gradients and optimizer.
    Bf16,
}

impl Precision {
    /// The element type the passes compute in.
    pub fn kind(self) -> Kind {
        match self {
            Precision::Fp32 => Kind::Float,
            Precision::Bf16 => Kind::BFloat16,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
        })
    }
}

/// The first compute capability with native bf16 arithmetic (Ampere).
pub const BF16_MIN_CAPABILITY: (i32, i32) = (8, 0);

/// Whether `precision` can run on `device`, whose compute capability (for a CUDA
/// device) is `capability` as the driver reports it; `Err` says why not and what to do.
/// A CUDA device whose capability the driver did not report is let through: PyTorch
/// then decides, and says so if it cannot.
pub fn check(
    precision: Precision,
    device: DeviceChoice,
    name: &str,
    capability: Option<(i32, i32)>,
) -> Result<(), NoNativeBf16> {
    match (precision, device, capability) {
        (Precision::Bf16, DeviceChoice::Cuda(index), Some(capability))
            if capability < BF16_MIN_CAPABILITY =>
        {
            Err(NoNativeBf16 {
                index,
                name: name.to_string(),
                capability,
            })
        }
        _ => Ok(()),
    }
}

/// `--precision bf16` on a GPU without native bf16 arithmetic ([`check`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--precision bf16 needs a GPU with native bf16 arithmetic (compute capability \
     {}.{} or newer: A100, H100, L4, RTX 30xx and later); \
     cuda:{index} ({name}) is {}.{}, where PyTorch would emulate it more \
     slowly than fp32: drop --precision (fp32 is the default)",
    BF16_MIN_CAPABILITY.0,
    BF16_MIN_CAPABILITY.1,
    capability.0,
    capability.1
)]
pub struct NoNativeBf16 {
    /// The CUDA device's index.
    pub index: usize,
    pub name: String,
    /// Its compute capability (major, minor).
    pub capability: (i32, i32),
}

/// bf16 copies of the online and target parameters, `[K, P]` each, and the views of
/// them that the passes read (laid out as the fp32 parameters' own views).
#[derive(Debug)]
pub struct HalfCopies {
    pub online: Tensor,
    pub target: Tensor,
    /// Per layer: weights `[K, in, out]` and biases `[K, 1, out]`.
    pub online_views: Vec<Tensor>,
    /// The online weights' transposes (the backward pass's).
    pub online_wt: Vec<Tensor>,
    pub target_views: Vec<Tensor>,
    /// The torso's filters and biases: leaves over `online` for autograd, and views of
    /// `target` (empty without a torso).
    pub torso_online: Vec<Tensor>,
    pub torso_target: Vec<Tensor>,
}

impl HalfCopies {
    /// Copies of `online` and `target` in bf16; `views` makes a flat tensor's views (as
    /// the fp32 parameters' are made), `torso` its torso's. The last layer's views are
    /// the fp32 parameters' own, which the optimizer updates in place.
    pub fn new(
        online: &Tensor,
        target: &Tensor,
        views: impl Fn(&Tensor) -> Vec<Tensor>,
        torso: impl Fn(&Tensor) -> Vec<Tensor>,
    ) -> Self {
        let half = |t: &Tensor| tch::no_grad(|| t.detach().to_kind(Kind::BFloat16).contiguous());
        // The copy's views, but the fp32 parameters' for the last layer (weight, bias).
        let mixed = |copy: &Tensor, master: &Tensor| {
            let mut v = views(copy);
            let last = v.len() - 2;
            v.splice(last.., views(master).drain(last..));
            v
        };
        let (online_half, target_half) = (half(online), half(target));
        let online_views = mixed(&online_half, online);
        let online_wt = online_views
            .iter()
            .step_by(2)
            .map(|w| w.transpose(1, 2))
            .collect();
        Self {
            target_views: mixed(&target_half, target),
            torso_online: torso(&online_half)
                .into_iter()
                .map(|v| v.detach().set_requires_grad(true))
                .collect(),
            torso_target: torso(&target_half),
            online_views,
            online_wt,
            online: online_half,
            target: target_half,
        }
    }

    /// Takes the online parameters' new values (after an optimizer step).
    pub fn refresh_online(&mut self, online: &Tensor) {
        tch::no_grad(|| self.online.copy_(online));
    }

    /// Takes the target parameters' new values (after a sync or an average).
    pub fn refresh_target(&mut self, target: &Tensor) {
        tch::no_grad(|| self.target.copy_(target));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_is_refused_on_gpus_without_native_bf16_only() {
        let gpu = DeviceChoice::Cuda(0);
        let err = check(Precision::Bf16, gpu, "Tesla T4", Some((7, 5)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cuda:0 (Tesla T4) is 7.5"), "{err}");
        assert!(err.contains("8.0 or newer"), "{err}");
        for capability in [Some((8, 0)), Some((9, 0)), Some((12, 1)), None] {
            assert_eq!(check(Precision::Bf16, gpu, "gpu", capability), Ok(()));
        }
        assert_eq!(
            check(Precision::Bf16, DeviceChoice::Cpu, "cpu", None),
            Ok(())
        );
        assert_eq!(
            check(Precision::Fp32, gpu, "Tesla T4", Some((7, 5))),
            Ok(())
        );
    }
}
