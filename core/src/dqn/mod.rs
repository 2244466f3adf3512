//! Double DQN on the device, for a population of K agents with stacked parameters.
//!
//! Every agent's parameters live in one row of a `[K, P]` tensor laid out by
//! [`ParamLayout`]; the online network is one leaf tensor, the target network another, and
//! Adam's moments two more of the same shape. A layer is one `baddbmm` over `[K, B, in]`,
//! the target sync is one `copy_`, and the optimizer is a handful of element-wise ops on
//! the flat tensors whatever the depth of the network: the update is bound by
//! per-operation overhead for small networks, so fewer, larger operations pay most.
//!
//! For the same reason the MLP's backward pass is written out (four ops per layer, the
//! weight and bias gradients written straight into views of one flat gradient buffer)
//! instead of going through autograd, whose graph bookkeeping costs more than the
//! arithmetic at these sizes. A test checks it against autograd. So is the LayerNorm's
//! (`--layer-norm`: `Linear → LayerNorm → ReLU` per hidden layer, computed in fp32 under
//! either precision), its gains and biases further views of the same flat tensor.
//!
//! A convolutional torso (the Nature DQN, for `u8` image observations) goes through
//! autograd: its arithmetic dominates, so graph bookkeeping is noise. Its filters are
//! leaf views of the same flat `[K, P]` tensor, K agents' torsos one grouped
//! convolution per layer, so the fused optimizer, target sync and publishing are
//! unchanged; the head's hand-written backward hands it the gradient at the features.
//!
//! Agents may differ in learning rate, gradient clip and target rule: those are `[K, 1]`
//! tensors in the same element-wise steps ([`crate::dqn::agents`]).
//!
//! An update whose loss or gradient is not finite is skipped on the device (a mask on
//! the optimizer step, no host sync) and counted; [`Dqn::take_stats`] reads the counts
//! with the other statistics, and the learner thread stops the run after too many in a
//! row. Each update returns its per-item TD errors, still on the device, for
//! prioritized replay.

pub mod agents;
mod config;
pub mod dueling;
mod fixed_io;
mod parts;
mod target_rule;
pub use dueling::DuelingError;
pub mod host_adam;
pub mod iqn;
mod lifecycle;
mod net;
pub mod network;
mod optimizer;
pub mod precision;
pub mod schedules;
mod storage;

use millrace_proto::{NetworkSpec, ParamEntry, ParamLayout, TorsoStep, LAYER_NORM_EPS};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Reduction, Tensor};

pub use config::{
    Bootstrap, DqnConfig, Munchausen, Optimizer, TargetKind, TargetUpdate, RMSPROP_DECAY,
    RMSPROP_EPS,
};
use net::Torso;
pub(crate) use net::{conv_views, iqn_views, norm_views, param_views};
pub use net::{double_dqn_targets, forward, munchausen_targets, torso_forward};

use crate::dqn::agents::{AgentHparams, AgentTensors, Sync};
use crate::dqn::dueling::DuelingHead;
use crate::dqn::precision::{HalfCopies, Precision};
use parts::{AdamState, FlatParams, StatSums};
use target_rule::TargetRule;

/// One sampled batch on the device, `[K, ...]` leading.
///
/// `obs2` holds `obs` in rows `0..B` and `next_obs` in rows `B..2B`, so the online network
/// evaluates both in one forward pass (double DQN needs its argmax over next states).
#[derive(Debug)]
pub struct Batch {
    /// `[K, 2B, obs_dim]` f32.
    pub obs2: Tensor,
    /// `[K, B, 1]` i64.
    pub actions: Tensor,
    /// `[K, B, 1]` f32: n-step discounted returns.
    pub rewards: Tensor,
    /// `[K, B, 1]` f32: `γ^k`, or 0 where the episode terminated.
    pub discounts: Tensor,
    /// `[K, B, 1]` f32: prioritized replay's importance-sampling weights, which scale
    /// each item's loss; `None` for uniform replay (all 1).
    pub weights: Option<Tensor>,
}

impl Batch {
    pub fn batch_size(&self) -> i64 {
        self.actions.size()[1]
    }

    /// The same tensors, shared.
    pub fn shallow_clone(&self) -> Self {
        Self {
            obs2: self.obs2.shallow_clone(),
            actions: self.actions.shallow_clone(),
            rewards: self.rewards.shallow_clone(),
            discounts: self.discounts.shallow_clone(),
            weights: self.weights.as_ref().map(Tensor::shallow_clone),
        }
    }
}

/// Online and target parameters, Adam state and on-device statistics.
pub struct Dqn {
    /// The learner's network (with a dueling head's extra output, if it has one).
    spec: NetworkSpec,
    /// The dueling head, whose published network is what [`Dqn::spec`] returns.
    dueling: Option<DuelingHead>,
    config: DqnConfig,
    device: Device,
    /// Online, target and gradient, flat and as views.
    params: FlatParams,
    /// Double DQN's or Munchausen's target, with its settings.
    rule: TargetRule,
    adam: AdamState,
    /// The convolutional torso, if the network has one.
    torso: Option<Torso>,
    /// bf16 copies of the networks for the passes (`--precision bf16`); `None` in fp32,
    /// where the passes read the parameters' own views.
    half: Option<HalfCopies>,
    updates: u64,
    stats: StatSums,
    /// Per-agent learning rates, clips and target rules.
    agents: AgentTensors,
    /// The optimizer step in one pass on the host (CPU), instead of tensor operations.
    host_optimizer: bool,
    /// The inputs and TD errors in fixed memory, on the tensor optimizer's path.
    fixed_io: fixed_io::FixedIo,
}

impl std::fmt::Debug for Dqn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dqn")
            .field("spec", &self.spec)
            .field("device", &self.device)
            .field("updates", &self.updates)
            .finish_non_exhaustive()
    }
}

/// What one update hands back to its caller.
#[derive(Debug)]
pub struct UpdateOutput {
    /// Each item's TD error `Q(s, a) − y`, `[K, B]` fp32, on the device: prioritized
    /// replay's priorities (their absolute values), row `k` agent `k`'s batch. From
    /// [`Dqn::update_in_place`] on the tensor optimizer's path, the next update
    /// overwrites it; from [`Dqn::update`], it is the caller's.
    pub td_errors: Tensor,
}

impl UpdateOutput {
    /// Agent `row`'s TD errors, `[1, B]`: the shape a population of one's output has.
    pub fn agent(&self, row: usize) -> Tensor {
        self.td_errors.narrow(0, row as i64, 1)
    }
}

/// Means over the updates since the previous read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UpdateStats {
    pub loss: f64,
    pub td_abs: f64,
    pub q: f64,
    pub updates: u64,
    /// Updates skipped since the previous read because their loss or gradient was not
    /// finite (summed over agents).
    pub nonfinite: u64,
    /// The current run of consecutive skipped updates (the longest among agents); a
    /// finite update ends it.
    pub nonfinite_streak: u64,
    /// The (first agent's) learning rate at the read.
    pub learning_rate: f64,
}

/// The full state of a [`Dqn`] as host tensors, for checkpoints.
#[derive(Debug)]
pub struct DqnState {
    pub online: Tensor,
    pub target: Tensor,
    pub adam_m: Tensor,
    pub adam_v: Tensor,
    pub adam_step: u64,
    pub updates: u64,
}

/// The values of a contiguous f32 CPU tensor, as a mutable slice.
///
/// # Safety
/// `t` must be a contiguous `f32` CPU tensor whose storage nothing else (no view of it)
/// reads or writes while the slice lives.
unsafe fn f32s_mut(t: &mut Tensor) -> &mut [f32] {
    debug_assert!(t.is_contiguous() && t.kind() == Kind::Float && t.device() == Device::Cpu);
    // SAFETY: per the contract, `numel` f32s live as long as `t`, unaliased.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<f32>(), t.numel()) }
}

/// The values of a contiguous f32 CPU tensor.
///
/// # Safety
/// As [`f32s_mut`], except that others may read the storage meanwhile.
unsafe fn f32s(t: &Tensor) -> &[f32] {
    debug_assert!(t.is_contiguous() && t.kind() == Kind::Float && t.device() == Device::Cpu);
    // SAFETY: per the contract, `numel` f32s live as long as `t`, and nothing writes.
    unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<f32>(), t.numel()) }
}

impl Dqn {
    /// The network as actors, evaluation and export see it (a dueling head folded into
    /// a plain last layer).
    pub fn spec(&self) -> &NetworkSpec {
        self.dueling
            .as_ref()
            .map_or(&self.spec, DuelingHead::published)
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Sets each agent's learning rate for its env steps into the run (`env_steps[k]`
    /// agent `k`'s; the last entry for the agents past it) by the decay schedule, if
    /// there is one. Changes under its resolution wait: nothing to do on most updates.
    pub fn anneal_lr(&mut self, env_steps: &[u64]) {
        let Some(decay) = self.config.lr_decay else {
            return;
        };
        let mut scales = self.agents.lr_scales().to_vec();
        let mut changed = false;
        for (row, now) in scales.iter_mut().enumerate() {
            let steps = env_steps.get(row).or(env_steps.last()).copied();
            let scale = decay.scale_at(steps.unwrap_or(0));
            let change = (scale - *now).abs();
            // The end of the decay is reached exactly, however small the last step.
            if change > 0.0 && (change >= decay.resolution() || scale == decay.end_fraction) {
                *now = scale;
                changed = true;
            }
        }
        if changed {
            self.agents.scale_lr(&scales);
        }
    }

    /// The learning rate now as a fraction of each agent's own (1 without a decay).
    pub fn lr_scale(&self) -> f64 {
        self.agents.lr_scale()
    }

    /// Agent `row`'s own updates (those since it joined, with its checkpoint's).
    pub fn agent_updates(&self, row: usize) -> u64 {
        self.agents.own(row, self.updates)
    }

    /// Agent `row`'s learning rate now.
    pub fn agent_learning_rate(&self, row: usize) -> f64 {
        self.agents.hparams[row].lr * self.agents.lr_scales()[row]
    }

    /// The (first agent's) learning rate now.
    pub fn learning_rate(&self) -> f64 {
        self.agents.hparams[0].lr * self.agents.lr_scale()
    }

    /// One gradient step on `batch` (already on the device), then the hard target
    /// copies that fall due ([`Dqn::update_in_place`], [`Dqn::sync_due_targets`]).
    /// Never synchronises with the host: statistics accumulate on the device until
    /// [`Dqn::take_stats`]. Returns each item's TD error, on the device (see
    /// [`UpdateOutput`]).
    ///
    /// An agent whose loss or gradient is not finite skips this step (its parameters
    /// and optimizer state stay as they were) and the skip is counted.
    pub fn update(&mut self, batch: &Batch) -> UpdateOutput {
        let mut out = self.update_in_place(batch);
        self.sync_due_targets();
        if !self.host_optimizer {
            // Out of the fixed output tensor, outside what a graph would capture.
            out.td_errors = out.td_errors.copy();
        }
        out
    }

    /// The gradient step alone, as a CUDA graph can replay it: the same operators with
    /// the same non-tensor arguments every step (Adam's step counts and bias
    /// corrections live on the device, the statistics accumulate every step, a hard
    /// target copy is [`Dqn::sync_due_targets`]'s), every persistent tensor updated in
    /// place (`core/tests/update_ops.rs` checks both).
    ///
    /// On the tensor optimizer's path (a GPU's) the batch is first copied into input
    /// buffers allocated once, and the TD errors land in one output tensor, which the
    /// next update overwrites ([`Dqn::update`] copies them out).
    pub fn update_in_place(&mut self, batch: &Batch) -> UpdateOutput {
        let fixed = (!self.host_optimizer).then(|| self.fixed_io.load(batch));
        let batch = fixed.as_ref().unwrap_or(batch);
        let (q_taken, targets, iqn_loss) = if self.spec.iqn.is_some() {
            let (q, t, loss) = self.iqn_gradient(batch);
            (q, t, Some(loss))
        } else {
            let (q, t) = self.gradient(batch);
            (q, t, None)
        };
        let td = &q_taken - &targets;
        self.adam_step(&td);
        if let Some(half) = &mut self.half {
            half.refresh_online(&self.params.online);
        }
        if let Some(tau) = &self.agents.tau {
            // Agents with hard copies have τ = 0: unchanged.
            let _ = self.params.target.lerp_tensor_(&self.params.online, tau);
            self.refresh_half_target();
        }
        let k = self.spec.population as f64;
        let detail = Tensor::stack(
            &[
                iqn_loss.unwrap_or_else(|| {
                    q_taken.huber_loss(&targets, Reduction::Mean, self.config.huber_delta) * k
                }),
                td.abs().mean(Kind::Float),
                q_taken.mean(Kind::Float),
            ],
            0,
        );
        let _ = self.stats.detail_sum.g_add_(&detail);
        self.updates += 1;
        self.stats.updates += 1;
        let td_errors = td.squeeze_dim(2);
        UpdateOutput {
            td_errors: match fixed {
                Some(_) => self.fixed_io.store_td(&td_errors),
                None => td_errors,
            },
        }
    }

    /// Copies the online parameters into the target network for the agents whose hard
    /// target period falls due at this update count (none under Polyak averaging,
    /// which [`Dqn::update_in_place`] applies every step).
    pub fn sync_due_targets(&mut self) {
        match self.agents.syncing(self.updates) {
            Sync::All => self.sync_target(),
            Sync::Some(due) => tch::no_grad(|| {
                let due = Tensor::from_slice(&due)
                    .view([-1, 1])
                    .to_device(self.device);
                let synced = self.params.online.where_self(&due, &self.params.target);
                self.params.target.copy_(&synced);
                self.refresh_half_target();
            }),
            Sync::None => {}
        }
    }

    /// The bf16 target copy takes the fp32 target's values (under `--precision bf16`).
    fn refresh_half_target(&mut self) {
        if let Some(half) = &mut self.half {
            half.refresh_target(&self.params.target);
        }
    }

    /// Each agent's current run of skipped (non-finite) updates (one host read).
    pub fn nonfinite_streaks(&self) -> Vec<u64> {
        let host = self
            .stats
            .nonfinite_streak
            .to_device(Device::Cpu)
            .contiguous();
        Vec::<f32>::try_from(host.view([-1]))
            .unwrap_or_default()
            .into_iter()
            .map(|x| x as u64)
            .collect()
    }

    /// Copies the online parameters into the target network.
    pub fn sync_target(&mut self) {
        tch::no_grad(|| self.params.target.copy_(&self.params.online));
        self.refresh_half_target();
    }

    /// Reads and resets the on-device statistics (one host sync).
    pub fn take_stats(&mut self) -> UpdateStats {
        let n = std::mem::take(&mut self.stats.updates);
        if n == 0 {
            return UpdateStats {
                learning_rate: self.learning_rate(),
                ..UpdateStats::default()
            };
        }
        // One copy to the host for everything: [loss, td, q, skipped, longest streak].
        let all = Tensor::cat(
            &[
                self.stats.detail_sum.shallow_clone(),
                self.stats.nonfinite.sum(Kind::Float).view([1]),
                self.stats.nonfinite_streak.max().view([1]),
            ],
            0,
        )
        .to_device(Device::Cpu);
        let v: Vec<f32> = Vec::<f32>::try_from(&all).unwrap_or_default();
        let _ = self.stats.detail_sum.zero_();
        let _ = self.stats.nonfinite.zero_();
        let per = |i: usize, count: u64| match v.get(i) {
            Some(x) if count > 0 => f64::from(*x) / count as f64,
            _ => f64::NAN,
        };
        let count = |i: usize| v.get(i).map_or(0, |x| *x as u64);
        UpdateStats {
            loss: per(0, n),
            td_abs: per(1, n),
            q: per(2, n),
            updates: n,
            nonfinite: count(3),
            nonfinite_streak: count(4),
            learning_rate: self.learning_rate(),
        }
    }

    /// The online parameters as host floats, `[K, P]` row-major (to publish to actors).
    pub fn online_params(&self) -> Vec<f32> {
        let host = self
            .published(&self.params.online.detach())
            .to_device(Device::Cpu)
            .contiguous()
            .view([-1]);
        Vec::<f32>::try_from(&host).unwrap_or_default()
    }

    /// The online parameters as `version`, taken after `env_steps` (for actors).
    pub fn params(&self, version: u64, env_steps: u64) -> millrace_proto::Params {
        millrace_proto::Params {
            version,
            env_steps,
            updates: self.updates(),
            population: self.spec.population,
            data: self.online_params(),
        }
    }

    /// A copy of the online parameters `[K, P]` on the device (queued, no host sync).
    pub fn online_snapshot(&self) -> Tensor {
        tch::no_grad(|| match &self.dueling {
            Some(head) => head.fold(&self.params.online),
            None => self.params.online.copy(),
        })
    }

    /// Parameters `[K, P]` as published: a dueling head folded into its last layer.
    fn published(&self, flat: &Tensor) -> Tensor {
        match &self.dueling {
            Some(head) => tch::no_grad(|| head.fold(flat)),
            None => flat.shallow_clone(),
        }
    }
}

#[cfg(test)]
mod precision_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::{DType, ObsSpec};

    fn t(values: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(values).view(shape)
    }

    fn close(a: &Tensor, b: &[f32]) {
        let got = Vec::<f32>::try_from(&a.contiguous().view([-1])).unwrap();
        assert_eq!(got.len(), b.len());
        for (g, w) in got.iter().zip(b) {
            assert!((g - w).abs() < 1e-5, "{got:?} != {b:?}");
        }
    }

    #[test]
    fn targets_bootstrap_from_target_net_at_online_argmax() {
        // K=1, B=3, A=2. Online prefers action 1, 0, 1; the target net values differ.
        let online = t(&[0.0, 5.0, 3.0, 1.0, -1.0, 2.0], &[1, 3, 2]);
        let target = t(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0], &[1, 3, 2]);
        let rewards = t(&[1.0, 1.0, 0.5], &[1, 3, 1]);
        // Row 0 continues (γ = 0.9), row 1 terminated (0), row 2 truncated after 3 steps
        // of n-step (γ^3 = 0.729; truncation bootstraps).
        let discounts = t(&[0.9, 0.0, 0.729], &[1, 3, 1]);
        let y = double_dqn_targets(&online, &target, &rewards, &discounts);
        close(&y, &[1.0 + 0.9 * 20.0, 1.0, 0.5 + 0.729 * 60.0]);
    }

    #[test]
    fn double_dqn_uses_online_argmax_not_target_max() {
        // The target net's own max would be action 0 (100); double DQN takes action 1.
        let online = t(&[0.0, 1.0], &[1, 1, 2]);
        let target = t(&[100.0, 7.0], &[1, 1, 2]);
        let y = double_dqn_targets(
            &online,
            &target,
            &t(&[0.0], &[1, 1, 1]),
            &t(&[1.0], &[1, 1, 1]),
        );
        close(&y, &[7.0]);
    }

    #[test]
    fn munchausen_targets_add_the_clipped_log_policy_to_a_soft_bootstrap() {
        // K=1, B=1, A=2, τ = 1: log π(0|s) = 1 − log(e + e²) = −1.3133, clipped to −1;
        // π(·|s') = (½, ½) over q̄(s') = (0, 0): the soft value is log 2.
        let m = Munchausen {
            tau: 1.0,
            alpha: 0.9,
            clip: -1.0,
        };
        let y = munchausen_targets(
            &t(&[1.0, 2.0], &[1, 1, 2]),
            &t(&[0.0, 0.0], &[1, 1, 2]),
            &Tensor::zeros([1, 1, 1], (Kind::Int64, Device::Cpu)),
            &t(&[1.0], &[1, 1, 1]),
            &t(&[0.99], &[1, 1, 1]),
            &m.per_agent(&[None], Device::Cpu),
        );
        close(&y, &[1.0 - 0.9 + 0.99 * std::f32::consts::LN_2]);
        // The bonus unclipped when τ·log π is above the clip: action 1, log π = −0.3133.
        let y = munchausen_targets(
            &t(&[1.0, 2.0], &[1, 1, 2]),
            &t(&[0.0, 0.0], &[1, 1, 2]),
            &Tensor::ones([1, 1, 1], (Kind::Int64, Device::Cpu)),
            &t(&[0.0], &[1, 1, 1]),
            &t(&[0.0], &[1, 1, 1]),
            &m.per_agent(&[None], Device::Cpu),
        );
        close(&y, &[0.9 * (2.0 - (1f32.exp() + 2f32.exp()).ln())]);
    }

    #[test]
    fn munchausen_with_a_small_tau_and_no_bonus_is_the_max_bootstrap() {
        // τ → 0 and α = 0: the soft value tends to max q̄(s') (here within τ·log A).
        let m = Munchausen {
            tau: 1e-3,
            alpha: 0.0,
            clip: -1.0,
        };
        let y = munchausen_targets(
            &t(&[5.0, -3.0, 0.0], &[1, 1, 3]),
            &t(&[1.0, 4.0, 2.0], &[1, 1, 3]),
            &Tensor::zeros([1, 1, 1], (Kind::Int64, Device::Cpu)),
            &t(&[0.5], &[1, 1, 1]),
            &t(&[0.9], &[1, 1, 1]),
            &m.per_agent(&[None], Device::Cpu),
        );
        close(&y, &[0.5 + 0.9 * 4.0]);
        // A terminal transition (discount 0) keeps the reward and the bonus only.
        let m = Munchausen::default();
        let y = munchausen_targets(
            &t(&[5.0, -3.0, 0.0], &[1, 1, 3]),
            &t(&[1.0, 4.0, 2.0], &[1, 1, 3]),
            &Tensor::ones([1, 1, 1], (Kind::Int64, Device::Cpu)),
            &t(&[0.5], &[1, 1, 1]),
            &t(&[0.0], &[1, 1, 1]),
            &m.per_agent(&[None], Device::Cpu),
        );
        // τ·log π(1|s) is about −8: clipped to −1.
        close(&y, &[0.5 - 0.9]);
    }

    #[test]
    fn munchausen_backward_matches_autograd_and_differs_from_double() {
        for dueling in [false, true] {
            let cfg = |bootstrap| DqnConfig {
                bootstrap,
                dueling,
                ..config()
            };
            let m = Bootstrap::Munchausen(Munchausen::default());
            let mut dqn = Dqn::new(spec(2), cfg(m), Device::Cpu, 5);
            let other = Dqn::new(spec(2), cfg(m), Device::Cpu, 6);
            dqn.params.target.copy_(&other.params.online);
            let (k, b) = (2, 16);
            tch::manual_seed(12);
            let batch = Batch {
                obs2: Tensor::randn([k, 2 * b, 3], (Kind::Float, Device::Cpu)),
                actions: Tensor::randint(2, [k, b, 1], (Kind::Int64, Device::Cpu)),
                rewards: Tensor::randn([k, b, 1], (Kind::Float, Device::Cpu)),
                discounts: Tensor::rand([k, b, 1], (Kind::Float, Device::Cpu)).round() * 0.99,
                weights: Some(Tensor::rand([k, b, 1], (Kind::Float, Device::Cpu))),
            };
            let (_, targets) = dqn.gradient(&batch);
            let manual = dqn.params.grad.copy();
            let auto = autograd_gradient(&dqn, &batch);
            let scale = auto.abs().max().double_value(&[]);
            let err = (&manual - &auto).abs().max().double_value(&[]);
            assert!(
                scale > 1e-3 && err < 1e-5 * scale.max(1.0),
                "{err} of {scale}"
            );
            let mut double = Dqn::new(spec(2), cfg(Bootstrap::Double), Device::Cpu, 5);
            double.params.target.copy_(&other.params.online);
            let (_, plain) = double.gradient(&batch);
            let apart = (&targets - &plain).abs().max().double_value(&[]);
            assert!(apart > 1e-3, "the Munchausen targets are double DQN's");
        }
    }

    fn spec(k: usize) -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        NetworkSpec::mlp(&obs, &[8, 8], 2, k).unwrap()
    }

    fn config() -> DqnConfig {
        DqnConfig {
            lr: 1e-2,
            target: TargetUpdate::Hard { period: 1000 },
            ..DqnConfig::default()
        }
    }

    fn batch(k: i64, b: i64, reward: f32) -> Batch {
        Batch {
            obs2: Tensor::ones([k, 2 * b, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([k, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::full([k, b, 1], f64::from(reward), (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([k, b, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        }
    }

    #[test]
    fn updates_regress_q_towards_the_target() {
        let mut dqn = Dqn::new(spec(1), config(), Device::Cpu, 0);
        let b = batch(1, 4, 3.0);
        for _ in 0..300 {
            let _ = dqn.update(&b);
        }
        let stats = dqn.take_stats();
        assert_eq!(stats.updates, 300);
        let q = dqn.q_values(&Tensor::ones([1, 1, 3], (Kind::Float, Device::Cpu)));
        let q0 = q.double_value(&[0, 0, 0]);
        assert!((q0 - 3.0).abs() < 0.05, "Q(s, 0) = {q0}, want 3");
        assert_eq!(
            dqn.take_stats(),
            UpdateStats {
                learning_rate: 1e-2,
                ..UpdateStats::default()
            },
            "stats reset after a read (the learning rate is not a statistic)"
        );
        assert!(stats.loss.is_finite() && stats.q.is_finite());
    }

    #[test]
    fn population_agents_learn_independently() {
        // Agent 0 sees reward 1, agent 1 reward -2; neither's gradient reaches the other.
        let mut dqn = Dqn::new(spec(2), config(), Device::Cpu, 1);
        let mut b = batch(2, 4, 0.0);
        b.rewards = t(&[1.0, 1.0, 1.0, 1.0, -2.0, -2.0, -2.0, -2.0], &[2, 4, 1]);
        for _ in 0..300 {
            let _ = dqn.update(&b);
        }
        let q = dqn.q_values(&Tensor::ones([2, 1, 3], (Kind::Float, Device::Cpu)));
        assert!((q.double_value(&[0, 0, 0]) - 1.0).abs() < 0.05);
        assert!((q.double_value(&[1, 0, 0]) + 2.0).abs() < 0.05);
    }

    #[test]
    fn forward_matches_the_actor_cpu_policy() {
        use millrace_actor::{MlpPolicy, Policy};
        let dqn = Dqn::new(spec(1), config(), Device::Cpu, 3);
        let params = millrace_proto::Params::of_one(0, dqn.online_params());
        let mut policy = MlpPolicy::new(spec(1), 0).unwrap();
        policy.load(&params).unwrap();
        let obs = [0.1f32, -0.4, 2.0, 1.5, 0.0, -0.7];
        let mut q = [0.0f32; 4];
        policy.q_values(&obs, &mut q);
        let want = dqn.q_values(&t(&obs, &[1, 2, 3]));
        close(&want, &q);
    }

    /// Autograd's gradient of the update's loss at `dqn`'s online parameters: each
    /// agent's mean Huber loss of the double-DQN targets (each item's scaled by its
    /// importance weight where the batch has them), through a dueling head if there is
    /// one, and masked as a dueling update masks it. For MLP networks.
    fn autograd_gradient(dqn: &Dqn, batch: &Batch) -> Tensor {
        let (k, b) = (dqn.spec.population as i64, batch.batch_size());
        let layout = dqn.spec.layout();
        let leaf = dqn.params.online.detach().copy().set_requires_grad(true);
        let q_all = dqn.head(forward(
            &param_views(&leaf, &layout, k),
            &norm_views(&leaf, &layout, k),
            &batch.obs2,
        ));
        let targets = tch::no_grad(|| dqn.td_targets(&q_all.narrow(1, b, b), batch));
        let q = q_all.narrow(1, 0, b).gather(2, &batch.actions, false);
        let mut per_item = q.huber_loss(&targets, Reduction::None, 1.0);
        if let Some(w) = &batch.weights {
            per_item *= w;
        }
        let loss = per_item
            .mean_dim([1i64, 2].as_slice(), false, Kind::Float)
            .sum(Kind::Float);
        let auto = Tensor::run_backward(&[&loss], &[&leaf], false, false)
            .pop()
            .unwrap();
        if let Some(head) = &dqn.dueling {
            head.mask(&param_views(&auto, &layout, k)[layout.entries.len() - 2]);
        }
        auto
    }

    /// The hand-written backward pass against autograd on the same loss (with
    /// importance weights: each item's Huber loss scaled by its weight).
    fn check_gradient_against_autograd(k: usize, weighted: bool, layer_norm: bool) {
        let spec = |k| NetworkSpec {
            layer_norm,
            ..spec(k)
        };
        let mut dqn = Dqn::new(spec(k), config(), Device::Cpu, 5);
        // Move the target away from the online net so targets are non-trivial.
        let other = Dqn::new(spec(k), config(), Device::Cpu, 6);
        dqn.params.target.copy_(&other.params.online);
        tch::manual_seed(10);
        scramble_norms(&dqn);
        let (k, b) = (k as i64, 16);
        tch::manual_seed(11);
        let batch = Batch {
            obs2: Tensor::randn([k, 2 * b, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::randint(2, [k, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::randn([k, b, 1], (Kind::Float, Device::Cpu)) * 3.0,
            discounts: Tensor::rand([k, b, 1], (Kind::Float, Device::Cpu)).round() * 0.99,
            weights: weighted.then(|| Tensor::rand([k, b, 1], (Kind::Float, Device::Cpu))),
        };
        let _ = dqn.gradient(&batch);
        let manual = dqn.params.grad.copy();
        let auto = autograd_gradient(&dqn, &batch);
        let err = (&manual - &auto).abs().max().double_value(&[]);
        let scale = auto.abs().max().double_value(&[]);
        assert!(scale > 1e-3, "gradient is not trivially zero");
        for (g, name) in dqn
            .params
            .grad_norm
            .iter()
            .zip(["gain", "bias"].iter().cycle())
        {
            let norm = g.abs().max().double_value(&[]);
            assert!(norm > 1e-4 * scale, "a LayerNorm {name} gradient is zero");
        }
        if weighted {
            // The weights matter: the unweighted gradient differs.
            let mut plain = Dqn::new(spec(k as usize), config(), Device::Cpu, 5);
            plain.params.target.copy_(&other.params.online);
            plain.params.online.copy_(&dqn.params.online);
            let _ = plain.gradient(&Batch {
                weights: None,
                ..batch.shallow_clone()
            });
            let diff = (&plain.params.grad - &manual).abs().max().double_value(&[]);
            assert!(
                diff > 1e-3 * scale,
                "importance weights change the gradient"
            );
        }
        assert!(
            err < 1e-5 * scale.max(1.0),
            "max |manual - autograd| = {err}"
        );
    }

    /// The dueling head's hand-written backward against autograd through the head's
    /// combination (autograd's gradient masked as the update masks it), for a
    /// population of 2 and 3 actions.
    #[test]
    fn dueling_backward_matches_autograd_and_publishes_a_plain_network() {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let spec = NetworkSpec::mlp(&obs, &[8, 6], 3, 2).unwrap();
        let cfg = DqnConfig {
            dueling: true,
            ..config()
        };
        let mut dqn = Dqn::new(spec.clone(), cfg.clone(), Device::Cpu, 5);
        let other = Dqn::new(spec.clone(), cfg.clone(), Device::Cpu, 6);
        dqn.params.target.copy_(&other.params.online);
        let (k, b) = (2, 16);
        tch::manual_seed(12);
        let batch = Batch {
            obs2: Tensor::randn([k, 2 * b, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::randint(3, [k, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::randn([k, b, 1], (Kind::Float, Device::Cpu)) * 3.0,
            discounts: Tensor::rand([k, b, 1], (Kind::Float, Device::Cpu)).round() * 0.99,
            weights: Some(Tensor::rand([k, b, 1], (Kind::Float, Device::Cpu))),
        };
        let _ = dqn.gradient(&batch);
        let manual = dqn.params.grad.copy();
        let auto = autograd_gradient(&dqn, &batch);
        let head = dqn.dueling.as_ref().unwrap();
        let layout = head.internal().layout();
        let err = (&manual - &auto).abs().max().double_value(&[]);
        let scale = auto.abs().max().double_value(&[]);
        assert!(scale > 1e-3, "gradient is not trivially zero");
        assert!(
            err < 1e-5 * scale.max(1.0),
            "max |manual - autograd| = {err}"
        );

        // Updates never move the cross-stream weights off zero.
        for _ in 0..20 {
            let _ = dqn.update(&batch);
        }
        let w = &param_views(&dqn.params.online, &layout, k)[4];
        let crossed = (w - &(w * head_mask(&dqn))).abs().max().double_value(&[]);
        assert_eq!(crossed, 0.0, "the streams stay apart");

        // What is published is a plain network of the published spec, with the same Q.
        assert_eq!(dqn.spec(), &spec);
        let published = Tensor::from_slice(&dqn.online_params()).view([k, -1]);
        assert_eq!(published.size()[1] as usize, spec.layout().len);
        let x = Tensor::randn([k, 5, 3], (Kind::Float, Device::Cpu));
        let plain = forward(&param_views(&published, &spec.layout(), k), &[], &x);
        let ours = dqn.q_values(&x);
        let diff = (&plain - &ours).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "published network differs by {diff}");
        let snapshot = dqn.online_snapshot();
        assert!(snapshot.allclose(&published, 1e-6, 1e-6, false));
    }

    #[test]
    fn centred_rmsprop_steps_as_pytorch_defines_it() {
        let cfg = DqnConfig {
            optimizer: Optimizer::Rmsprop,
            max_grad_norm: 1e9,
            lr: 1e-3,
            ..config()
        };
        let mut dqn = Dqn::new(spec(1), cfg.clone(), Device::Cpu, 4);
        let other = Dqn::new(spec(1), cfg.clone(), Device::Cpu, 9);
        dqn.params.target.copy_(&other.params.online);
        tch::manual_seed(3);
        let batch = Batch {
            obs2: Tensor::randn([1, 16, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::randint(2, [1, 8, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::randn([1, 8, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::full([1, 8, 1], 0.9, (Kind::Float, Device::Cpu)),
            weights: None,
        };
        // Two steps by hand from the same state, with the gradients the update sees.
        let (mut p, mut m, mut v) = (
            dqn.params.online.copy(),
            dqn.params.online.zeros_like(),
            dqn.params.online.zeros_like(),
        );
        let mut mirror = Dqn::new(spec(1), cfg, Device::Cpu, 4);
        mirror.params.target.copy_(&other.params.online);
        for _ in 0..2 {
            let _ = mirror.gradient(&batch);
            let g = mirror.params.grad.copy();
            m = &m * RMSPROP_DECAY + &g * (1.0 - RMSPROP_DECAY);
            v = &v * RMSPROP_DECAY + g.square() * (1.0 - RMSPROP_DECAY);
            let avg = (&v - m.square()).sqrt() + RMSPROP_EPS;
            p = &p - g / avg * 1e-3;
            mirror.params.online.copy_(&p);
            let _ = dqn.update(&batch);
        }
        let err = (&dqn.params.online - &p).abs().max().double_value(&[]);
        assert!(err < 1e-6, "max |ours - reference| = {err}");
        assert!((&p - &other.params.online).abs().max().double_value(&[]) > 0.0);
    }

    /// The dueling head's mask, as a tensor of the last layer's weight shape.
    fn head_mask(dqn: &Dqn) -> Tensor {
        let head = dqn.dueling.as_ref().unwrap();
        let layout = head.internal().layout();
        let ones = Tensor::ones([1, layout.len as i64], (Kind::Float, Device::Cpu));
        let w = param_views(&ones, &layout, 1)[4].copy();
        head.mask(&w);
        w
    }

    /// Random LayerNorm gains and biases (fresh ones are 1 and 0, which would hide a
    /// gain left out of the backward pass).
    fn scramble_norms(dqn: &Dqn) {
        for v in &dqn.params.online_norm {
            v.detach().copy_(&(v.rand_like() + 0.5));
        }
    }

    #[test]
    fn manual_backward_matches_autograd() {
        check_gradient_against_autograd(1, false, false);
    }

    #[test]
    fn manual_backward_matches_autograd_for_a_population() {
        check_gradient_against_autograd(3, false, false);
    }

    #[test]
    fn importance_weighted_backward_matches_autograd() {
        check_gradient_against_autograd(1, true, false);
        check_gradient_against_autograd(3, true, false);
    }

    #[test]
    fn layer_norm_backward_matches_autograd() {
        check_gradient_against_autograd(1, false, true);
        check_gradient_against_autograd(3, true, true);
    }

    #[test]
    fn layer_norm_forward_matches_the_actor_cpu_policy() {
        use millrace_actor::{MlpPolicy, Policy};
        let spec = NetworkSpec {
            layer_norm: true,
            ..spec(2)
        };
        let dqn = Dqn::new(spec.clone(), config(), Device::Cpu, 3);
        tch::manual_seed(2);
        scramble_norms(&dqn);
        let params = dqn.params(0, 0);
        let obs = [0.1f32, -0.4, 2.0, 1.5, 0.0, -0.7];
        let want = dqn.q_values(&t(&obs, &[1, 2, 3]).repeat([2, 1, 1]));
        for agent in 0..2 {
            let mut policy = MlpPolicy::new(spec.clone(), agent).unwrap();
            policy.load(&params).unwrap();
            let mut q = [0.0f32; 4];
            policy.q_values(&obs, &mut q);
            close(&want.get(agent as i64), &q);
        }
        // The agents' outputs differ, and a fresh LayerNorm is the identity affine.
        assert!(!want.get(0).allclose(&want.get(1), 1e-3, 1e-3, false));
        let fresh = Dqn::new(spec, config(), Device::Cpu, 3);
        let gains = Vec::<f32>::try_from(fresh.params.online_norm[0].reshape([-1])).unwrap();
        assert!(gains.iter().all(|g| *g == 1.0));
    }

    /// A Nature-style network on small images (36×36: feature maps 8, 3, 1).
    fn cnn_spec() -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![4, 36, 36],
            dtype: DType::U8,
        };
        NetworkSpec::nature_cnn(&obs, 2).unwrap()
    }

    /// The IMPALA network, one residual block a stage, on 13×13 images (feature maps
    /// 7, 4, 2), its last stage max-pooled to 1×1: every kind of step in the plan.
    fn impala_spec() -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![4, 13, 13],
            dtype: DType::U8,
        };
        let torso = millrace_proto::ImpalaTorso {
            channels: vec![4, 8, 8],
            blocks: 1,
            pool: 1,
        };
        let mut spec = NetworkSpec::impala_cnn(&obs, &torso, 2).unwrap();
        spec.hidden = vec![16];
        spec
    }

    fn images_of(spec: &NetworkSpec, n: i64) -> Tensor {
        let mut shape = vec![1, n];
        shape.extend(spec.image.iter().map(|d| *d as i64));
        Tensor::randint(256, shape.as_slice(), (Kind::Uint8, Device::Cpu))
    }

    #[test]
    fn cnn_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(cnn_spec(), false, false);
    }

    #[test]
    fn cnn_dueling_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(cnn_spec(), true, false);
    }

    #[test]
    fn cnn_layer_norm_dueling_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(cnn_spec(), true, true);
    }

    #[test]
    fn impala_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(impala_spec(), false, false);
        check_cnn_gradient(impala_spec(), true, true);
    }

    fn check_cnn_gradient(spec: NetworkSpec, dueling: bool, layer_norm: bool) {
        let cfg = DqnConfig {
            dueling,
            ..config()
        };
        let spec = NetworkSpec { layer_norm, ..spec };
        let mut dqn = Dqn::new(spec.clone(), cfg.clone(), Device::Cpu, 5);
        let other = Dqn::new(spec.clone(), cfg, Device::Cpu, 6);
        dqn.params.target.copy_(&other.params.online);
        tch::manual_seed(10);
        scramble_norms(&dqn);
        let b = 6;
        tch::manual_seed(12);
        let batch = Batch {
            obs2: images_of(&spec, 2 * b),
            actions: Tensor::randint(2, [1, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::randn([1, b, 1], (Kind::Float, Device::Cpu)) * 3.0,
            discounts: Tensor::full([1, b, 1], 0.99, (Kind::Float, Device::Cpu)),
            weights: None,
        };
        let _ = dqn.gradient(&batch);
        let manual = dqn.params.grad.copy();

        let layout = dqn.spec.layout();
        let leaf = dqn.params.online.detach().copy().set_requires_grad(true);
        let (head, conv) = (
            param_views(&leaf, &layout, 1),
            conv_views(&leaf, &layout, 1),
        );
        let t = dqn.torso.as_ref().unwrap();
        let q_all = dqn.head(forward(
            &head,
            &norm_views(&leaf, &layout, 1),
            &torso_forward(&conv, &t.plan, &t.image, &batch.obs2),
        ));
        let targets = tch::no_grad(|| {
            double_dqn_targets(
                &q_all.narrow(1, b, b),
                &dqn.target_q(&batch.obs2.narrow(1, b, b)),
                &batch.rewards,
                &batch.discounts,
            )
        });
        let q = q_all.narrow(1, 0, b).gather(2, &batch.actions, false);
        let loss = q.huber_loss(&targets, Reduction::Mean, 1.0);
        let auto = Tensor::run_backward(&[&loss], &[&leaf], false, false)
            .pop()
            .unwrap();
        if let Some(d) = &dqn.dueling {
            let last = layout.entries.len() - 2;
            d.mask(&param_views(&auto, &layout, 1)[last]);
        }
        let conv0 = layout.conv[0].offset as i64;
        let norm0 = layout.norm.first().map_or(layout.len, |e| e.offset) as i64;
        let mut parts = vec![("head", 0, conv0), ("torso", conv0, norm0 - conv0)];
        if layer_norm {
            parts.push(("LayerNorm", norm0, layout.len as i64 - norm0));
        }
        for (what, lo, len) in parts {
            let (m, a) = (manual.narrow(1, lo, len), auto.narrow(1, lo, len));
            let err = (&m - &a).abs().max().double_value(&[]);
            let scale = a.abs().max().double_value(&[]);
            assert!(scale > 1e-4, "{what} gradient is not trivially zero");
            assert!(
                err < 1e-4 * scale,
                "{what}: max |manual - autograd| = {err} (scale {scale})"
            );
        }
    }

    #[test]
    fn cnn_forward_matches_the_actor_cpu_policy_and_learns() {
        check_forward_matches_the_actor_and_learns(cnn_spec());
    }

    #[test]
    fn impala_forward_matches_the_actor_cpu_policy_and_learns() {
        check_forward_matches_the_actor_and_learns(impala_spec());
        // Atari's size, twice the width, pooled to 6×6 (Beyond The Rainbow's torso).
        let obs = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        let torso = millrace_proto::ImpalaTorso::new(2, 6);
        check_forward_matches_the_actor_and_learns(
            NetworkSpec::impala_cnn(&obs, &torso, 6).unwrap(),
        );
    }

    fn check_forward_matches_the_actor_and_learns(spec: NetworkSpec) {
        use millrace_actor::{CnnPolicy, Policy};
        let mut dqn = Dqn::new(spec.clone(), config(), Device::Cpu, 3);
        tch::manual_seed(4);
        let obs = images_of(&spec, 3);
        let host: Vec<u8> = Vec::try_from(obs.view([-1])).unwrap();
        let mut policy = CnnPolicy::new(spec.clone()).unwrap();
        policy
            .load(&millrace_proto::Params::of_one(0, dqn.online_params()))
            .unwrap();
        let mut q = vec![0.0f32; 3 * spec.num_actions];
        policy.q_values(&host, &mut q);
        let want = Vec::<f32>::try_from(dqn.q_values(&obs).view([-1])).unwrap();
        for (a, b) in q.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4 * b.abs().max(1.0), "{q:?} vs {want:?}");
        }
        // And the update moves Q(s, a) towards a fixed target.
        let batch = Batch {
            obs2: Tensor::cat(&[&obs, &obs], 1),
            actions: Tensor::zeros([1, 3, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::full([1, 3, 1], 2.0, (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 3, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        for _ in 0..100 {
            let _ = dqn.update(&batch);
        }
        let q = dqn.q_values(&obs).narrow(2, 0, 1);
        let err = (q - 2.0).abs().max().double_value(&[]);
        assert!(err < 0.1, "|Q(s, 0) - 2| = {err}");
    }

    #[test]
    fn initialisation_is_seeded_without_global_state() {
        let a = Dqn::new(spec(2), config(), Device::Cpu, 7).online_params();
        // Another user of libtorch's global generator changes nothing.
        tch::manual_seed(123);
        let _ = Tensor::rand([10], (Kind::Float, Device::Cpu));
        let b = Dqn::new(spec(2), config(), Device::Cpu, 7).online_params();
        assert_eq!(a, b, "same seed, same parameters");
        assert_ne!(
            a,
            Dqn::new(spec(2), config(), Device::Cpu, 8).online_params()
        );
        let p = a.len() / 2;
        assert_ne!(a[..p], a[p..], "agents start differently");
        // PyTorch's nn.Linear bounds: first layer fan-in 3, so |w| <= 1/sqrt(3).
        let w0 = &a[..3 * 8];
        assert!(w0.iter().all(|w| w.abs() <= 1.0 / 3f32.sqrt()));
        assert!(w0.iter().any(|w| w.abs() > 0.3), "spread over the range");
    }

    #[test]
    fn a_non_finite_loss_skips_that_agents_update_and_is_counted() {
        let mut dqn = Dqn::new(spec(2), config(), Device::Cpu, 0);
        let before = dqn.state();
        let mut b = batch(2, 4, 1.0);
        // Agent 1's rewards are NaN; agent 0's are fine.
        b.rewards = t(&[1.0, 1.0, 1.0, 1.0, f32::NAN, 1.0, 1.0, 1.0], &[2, 4, 1]);
        let td = dqn.update(&b).td_errors;
        assert_eq!(td.size(), [2, 4], "per-item TD errors");
        let after = dqn.state();
        let row = |t: &Tensor, k: i64| t.narrow(0, k, 1);
        for (name, x, y) in [
            ("online", &before.online, &after.online),
            ("adam_m", &before.adam_m, &after.adam_m),
            ("adam_v", &before.adam_v, &after.adam_v),
        ] {
            assert!(row(x, 1).equal(&row(y, 1)), "agent 1's {name} is untouched");
            assert!(!row(x, 0).equal(&row(y, 0)), "agent 0's {name} moved");
        }
        assert!(bool::try_from(after.online.isfinite().all()).unwrap());
        let _ = dqn.update(&b);
        let _ = dqn.update(&b);
        let stats = dqn.take_stats();
        assert_eq!((stats.nonfinite, stats.nonfinite_streak), (3, 3));
        // A finite batch ends the streak; the count restarts after each read.
        let _ = dqn.update(&batch(2, 4, 1.0));
        let stats = dqn.take_stats();
        assert_eq!((stats.nonfinite, stats.nonfinite_streak), (0, 0));
        // An infinite target (the gradient stays finite: Huber clips) is caught too.
        let mut inf = batch(2, 4, 1.0);
        inf.rewards = Tensor::full([2, 4, 1], f64::INFINITY, (Kind::Float, Device::Cpu));
        let _ = dqn.update(&inf);
        assert_eq!(dqn.take_stats().nonfinite, 2, "both agents skipped");
    }

    #[test]
    fn hard_target_sync_follows_the_period() {
        let mut cfg = config();
        cfg.target = TargetUpdate::Hard { period: 3 };
        let mut dqn = Dqn::new(spec(1), cfg, Device::Cpu, 0);
        let b = batch(1, 2, 1.0);
        let before = dqn.state().target;
        let _ = dqn.update(&b);
        let _ = dqn.update(&b);
        assert!(
            dqn.state().target.equal(&before),
            "no sync before the period"
        );
        let _ = dqn.update(&b);
        let s = dqn.state();
        assert!(s.target.equal(&s.online), "synced at the period");
    }
}
