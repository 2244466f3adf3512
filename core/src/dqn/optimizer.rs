//! The optimizer step: Adam or centred RMSProp with per-agent gradient clipping and
//! non-finite masking, as tensor operations on the device or one pass in plain Rust on
//! the CPU ([`super::host_adam`]).

use super::*;

impl Dqn {
    /// Steps the optimizer with tensor operations, as on a GPU, even on the CPU (tests
    /// and benchmarks compare the two).
    pub fn use_tensor_optimizer(&mut self) {
        if self.host_optimizer {
            self.host_optimizer = false;
            self.count_steps_on_device();
        }
    }

    /// Per-agent gradient clipping, then Adam, on the flat `[K, P]` tensors, masked per
    /// agent where the loss or gradient is not finite (about 25 ops).
    ///
    /// Adam's bias corrections are folded into one factor per agent:
    /// `p -= lr·√(1−β2ᵗ)/(1−β1ᵗ) · m / (√v + ε·√(1−β2ᵗ))`, which equals PyTorch's
    /// `p -= lr/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) + ε)`. `t` counts attempted steps, skipped
    /// ones included, each agent's own ([`super::parts::AdamState::t`], on the device, in f64 as the
    /// host path's [`host_adam::Bias`]): the step dispatches the same operators with
    /// the same arguments every time, as a CUDA graph replays it.
    pub(super) fn adam_step(&mut self, td: &Tensor) {
        // The host path is Adam's; RMSProp runs as tensor operations everywhere.
        if self.host_optimizer && self.config.optimizer == Optimizer::Adam {
            self.adam_step_host(td);
            return;
        }
        let c = &self.config;
        let norms = self.params.grad.norm_scalaropt_dim(2, [1], true);
        // One finite check per agent covers the loss (through its TD errors) and the
        // gradient (through its norm); a NaN or infinity anywhere makes the sum so.
        let td_sum = td.sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Float);
        let ok = (&norms + td_sum.unsqueeze(1)).isfinite();
        let okf = ok.to_kind(Kind::Float);
        let skipped = okf.ones_like() - &okf;
        let _ = self.stats.nonfinite.g_add_(&skipped);
        // In place: (streak + skipped) · skipped.
        let _ = self.stats.nonfinite_streak.g_add_(&skipped);
        let _ = self.stats.nonfinite_streak.g_mul_(&skipped);
        // Skipped agents: a zero gradient (NaN · 0 is NaN, so select, not multiply) and
        // no change to the moments or parameters.
        let grad = self.params.grad.where_scalarother(&ok, 0.0);
        let clip = &self.agents.max_grad_norm;
        let norms = norms.where_self(&ok, clip);
        let scale = clip / norms.maximum(clip);
        let grad = grad * scale;

        self.adam.step += 1;
        let _ = self.adam.t.g_add_scalar_(1.0);
        if c.optimizer == Optimizer::Rmsprop {
            // adam_m holds E[g], adam_v E[g²] (as PyTorch's grad_avg and square_avg).
            let keep = &okf * (1.0 - RMSPROP_DECAY);
            let _ = self.adam.m.lerp_tensor_(&grad, &keep);
            let _ = self.adam.v.lerp_tensor_(&grad.square(), &keep);
            // Rounding can take the variance a hair below 0: clamp, not NaN.
            let denom = (&self.adam.v - self.adam.m.square())
                .clamp_min(0.0)
                .sqrt()
                .g_add_scalar_(RMSPROP_EPS);
            let step = okf * &self.agents.lr * -1.0;
            let _ = self.params.online.g_add_(&((grad / denom) * step));
            return;
        }
        let (b1, b2) = c.adam_betas;
        let _ = self.adam.m.lerp_tensor_(&grad, &(&okf * (1.0 - b1)));
        let _ = self
            .adam
            .v
            .lerp_tensor_(&grad.square(), &(&okf * (1.0 - b2)));
        // As `host_adam::Bias::at`: f64 powers of the agent's own t (at least 1), the
        // corrections rounded to f32, then ε·√(1−β2ᵗ) in f64 as the host scalar was.
        let t = self.adam.t.clamp_min(1.0);
        let bias2_sqrt = Tensor::pow_scalar(b2, &t).rsub_scalar(1.0).sqrt();
        let bias1 = Tensor::pow_scalar(b1, &t).rsub_scalar(1.0);
        let correction = (&bias2_sqrt / bias1).to_kind(Kind::Float);
        let eps = (bias2_sqrt.to_kind(Kind::Float).to_kind(Kind::Double) * c.adam_eps)
            .to_kind(Kind::Float);
        let denom = self.adam.v.sqrt() + eps;
        let step = okf * &self.agents.lr * correction.neg();
        let _ = self.params.online.g_add_(&((&self.adam.m / denom) * step));
    }

    /// [`Dqn::adam_step`] on the CPU in one pass over the parameters ([`host_adam`]).
    pub(super) fn adam_step_host(&mut self, td: &Tensor) {
        let c = &self.config;
        self.adam.step += 1;
        let (b1, b2) = c.adam_betas;
        let settings = host_adam::Step {
            beta1: b1 as f32,
            beta2: b2 as f32,
            eps: c.adam_eps as f32,
        };
        let biases = self.agents.biases(self.adam.step, c.adam_betas);
        let td = td.contiguous();
        // SAFETY: all five are contiguous f32 CPU tensors (made so in `restore`, or
        // just above) with their own storage, which nothing else touches during the
        // call: the views into `online` and `grad` are not used meanwhile.
        let ok = unsafe {
            host_adam::step(
                f32s_mut(&mut self.params.online),
                f32s_mut(&mut self.adam.m),
                f32s_mut(&mut self.adam.v),
                f32s(&self.params.grad),
                f32s(&td),
                &self.agents.lr_host,
                &self.agents.max_grad_norm_host,
                settings,
                &biases,
            )
        };
        // The skip counters in place too (no small tensor operations per update).
        // SAFETY: both are contiguous f32 CPU tensors `[K, 1]` of their own (made in
        // `restore`; the streak is reassigned only on the device path).
        let (skipped, streak) = unsafe {
            (
                f32s_mut(&mut self.stats.nonfinite),
                f32s_mut(&mut self.stats.nonfinite_streak),
            )
        };
        for ((stepped, skipped), streak) in ok.iter().zip(skipped).zip(streak) {
            if *stepped {
                *streak = 0.0;
            } else {
                *skipped += 1.0;
                *streak += 1.0;
            }
        }
    }
}
