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
pub mod host_adam;
pub mod network;
pub mod precision;
pub mod schedules;

use millrace_proto::{NetworkSpec, ParamLayout, LAYER_NORM_EPS};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Reduction, Tensor};

pub use config::{DqnConfig, Optimizer, TargetUpdate, RMSPROP_DECAY, RMSPROP_EPS};

use crate::dqn::agents::{AgentHparams, AgentTensors, Sync};
use crate::dqn::dueling::DuelingHead;
use crate::dqn::precision::{HalfCopies, Precision};

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
    /// `[K, P]`.
    online: Tensor,
    /// Views of `online` per parameter, and the weights' transposes, made once: the
    /// optimizer updates `online` in place, so views stay valid.
    online_views: Vec<Tensor>,
    online_wt: Vec<Tensor>,
    /// `[K, P]` gradient buffer and its per-parameter views (written by `gradient`).
    grad: Tensor,
    grad_views: Vec<Tensor>,
    /// The LayerNorms' gains and biases (see [`norm_views`]) of `online`, `target` and
    /// `grad`: fp32 under every precision. Empty without LayerNorm.
    online_norm: Vec<Tensor>,
    target_norm: Vec<Tensor>,
    grad_norm: Vec<Tensor>,
    /// `[K, P]`.
    target: Tensor,
    /// Views of `target` per parameter, made once (the target never reallocates).
    target_views: Vec<Tensor>,
    adam_m: Tensor,
    adam_v: Tensor,
    /// The convolutional torso, if the network has one.
    torso: Option<Torso>,
    /// bf16 copies of the networks for the passes (`--precision bf16`); `None` in fp32,
    /// where the passes read the parameters' own views.
    half: Option<HalfCopies>,
    /// Adam's step count t (bias corrections are computed on the host: no device sync).
    adam_step: u64,
    updates: u64,
    updates_since_stats: u64,
    /// Sums of `[loss, mean |td|, mean q]` over every `DETAIL_STATS_EVERY`-th update.
    detail_sum: Tensor,
    detail_count: u64,
    /// Per agent `[K, 1]`: updates skipped for a non-finite loss since the last read,
    /// and how many in a row up to now.
    nonfinite: Tensor,
    nonfinite_streak: Tensor,
    /// Per-agent learning rates, clips and target rules.
    agents: AgentTensors,
    /// The optimizer step in one pass on the host (CPU), instead of tensor operations.
    host_optimizer: bool,
    /// `[K, 1]` β1ᵗ and β2ᵗ of each agent's own step t, on the device, when the agents
    /// joined at different times (the device path's bias corrections then differ per
    /// agent; kept on the device so that no update waits for a host copy).
    bias_pows: Option<(Tensor, Tensor)>,
}

/// Loss, TD-error and Q statistics are sampled every this many updates (the update
/// itself never computes the loss value, only its gradient).
const DETAIL_STATS_EVERY: u64 = 16;

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
    /// replay's priorities (their absolute values), row `k` agent `k`'s batch.
    pub td_errors: Tensor,
}

impl UpdateOutput {
    /// Agent `row`'s TD errors, `[B]`.
    pub fn agent(&self, row: usize) -> Tensor {
        self.td_errors.get(row as i64)
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

pub(crate) fn param_views(flat: &Tensor, layout: &ParamLayout, population: i64) -> Vec<Tensor> {
    layout
        .entries
        .iter()
        .map(|e| {
            let t = flat.narrow(1, e.offset as i64, e.len as i64);
            match e.shape.as_slice() {
                [fan_in, fan_out] => t.view([population, *fan_in as i64, *fan_out as i64]),
                [fan_out] => t.view([population, 1, *fan_out as i64]),
                other => unreachable!("layout entry of rank {}", other.len()),
            }
        })
        .collect()
}

/// Views of the LayerNorms' gains and biases, alternating, each `[K, 1, width]` (empty
/// for a network without LayerNorm).
pub(crate) fn norm_views(flat: &Tensor, layout: &ParamLayout, population: i64) -> Vec<Tensor> {
    layout
        .norm
        .iter()
        .map(|e| {
            flat.narrow(1, e.offset as i64, e.len as i64)
                .view([population, 1, e.len as i64])
        })
        .collect()
}

/// LayerNorm over the last dimension of `z` `[K, N, H]`, in fp32 whatever `z`'s type:
/// returns the output `x̂ · gain + bias`, `x̂` and `1 / √(var + ε)` `[K, N, 1]` (the
/// last two for the backward pass).
fn layer_norm(z: &Tensor, gain: &Tensor, bias: &Tensor) -> (Tensor, Tensor, Tensor) {
    let width = *z
        .size()
        .last()
        .expect("a LayerNorm input has a last dimension");
    let (xhat, _mean, rstd) = Tensor::native_layer_norm(
        &z.to_kind(Kind::Float),
        [width].as_slice(),
        None::<Tensor>,
        None::<Tensor>,
        LAYER_NORM_EPS,
    );
    (&xhat * gain + bias, xhat, rstd)
}

/// Views of the torso's filters and biases in PyTorch's shapes behind the population:
/// `[K, out, in, kh, kw]` and `[K, out]`.
pub(crate) fn conv_views(flat: &Tensor, layout: &ParamLayout, population: i64) -> Vec<Tensor> {
    layout
        .conv
        .iter()
        .map(|e| {
            let mut shape = vec![population];
            shape.extend(e.shape.iter().map(|d| *d as i64));
            flat.narrow(1, e.offset as i64, e.len as i64)
                .view(shape.as_slice())
        })
        .collect()
}

/// The weights one update's passes read (see [`Dqn::pass_views`]).
struct PassViews<'a> {
    online: &'a [Tensor],
    online_wt: &'a [Tensor],
    target: &'a [Tensor],
    /// The torso's filters and biases (empty without a torso).
    torso_online: &'a [Tensor],
    torso_target: &'a [Tensor],
}

/// The convolutional torso's parameters, as views of the flat online and target tensors.
struct Torso {
    /// Leaves that share the online tensor's storage, for autograd.
    online: Vec<Tensor>,
    target: Vec<Tensor>,
    grad: Vec<Tensor>,
    strides: Vec<i64>,
    image: Vec<i64>,
}

impl Torso {
    fn new(spec: &NetworkSpec, online: &Tensor, target: &Tensor, grad: &Tensor) -> Option<Self> {
        if spec.conv.is_empty() {
            return None;
        }
        let layout = spec.layout();
        let k = spec.population as i64;
        Some(Self {
            online: conv_views(online, &layout, k)
                .into_iter()
                .map(|v| v.detach().set_requires_grad(true))
                .collect(),
            target: conv_views(target, &layout, k),
            grad: conv_views(grad, &layout, k),
            strides: spec.conv.iter().map(|c| c.stride as i64).collect(),
            image: spec.image.iter().map(|d| *d as i64).collect(),
        })
    }
}

/// The torso of K agents at once: `x` is `[K, N, C, H, W]` `u8` (or `[K, N, C·H·W]`),
/// `views` alternate filters `[K, out, in, kh, kw]` and biases `[K, out]`; returns
/// features `[K, N, F]` (ReLU'd, each agent's flattened in `C, H, W` order), computed
/// in the filters' element type.
///
/// The agents' images go side by side along the channels, `[N, K·C, H, W]`, and each
/// layer is one grouped convolution with K groups: agent k's filters see only agent k's
/// channels, so K small torsos are one large convolution.
pub fn torso_forward(views: &[Tensor], strides: &[i64], image: &[i64], x: &Tensor) -> Tensor {
    let (k, n) = (views[0].size()[0], x.size()[1]);
    let mut shape = vec![k, n];
    shape.extend_from_slice(image);
    let mut side_by_side = vec![n, k * image[0]];
    side_by_side.extend_from_slice(&image[1..]);
    let mut h = x
        .reshape(shape.as_slice())
        .permute([1, 0, 2, 3, 4])
        .reshape(side_by_side.as_slice())
        .to_kind(views[0].kind())
        * (1.0 / 255.0);
    for (l, s) in strides.iter().enumerate() {
        let w = views[2 * l].size();
        let filters = views[2 * l].reshape([k * w[1], w[2], w[3], w[4]]);
        let bias = views[2 * l + 1].reshape([k * w[1]]);
        h = h
            .conv2d(&filters, Some(&bias), [*s, *s], [0, 0], [1, 1], k)
            .relu();
    }
    h.reshape([n, k, -1]).permute([1, 0, 2])
}

/// The MLP forward pass: `x` is `[K, N, in]`, `views` alternate weight `[K, in, out]`
/// and bias `[K, 1, out]`; ReLU between layers, after a LayerNorm where `norms` (see
/// [`norm_views`]) has one. Each layer computes in its weights' element type, each
/// LayerNorm in fp32. Returns `[K, N, num_actions]`.
pub fn forward(views: &[Tensor], norms: &[Tensor], x: &Tensor) -> Tensor {
    let layers = views.len() / 2;
    let mut h = x.shallow_clone();
    for l in 0..layers {
        h = views[2 * l + 1].baddbmm(&h.to_kind(views[2 * l].kind()), &views[2 * l], 1.0, 1.0);
        if l + 1 < layers {
            if let [gain, bias] = norms.get(2 * l..2 * l + 2).unwrap_or_default() {
                h = layer_norm(&h, gain, bias).0;
            }
            h = h.relu();
        }
    }
    h
}

/// Double-DQN regression targets `r + discount · Q_target(s', argmax_a Q_online(s', a))`.
///
/// `q_next_online` and `q_next_target` are `[K, B, A]`; `rewards`, `discounts` `[K, B, 1]`.
/// The discount already folds in γ^n and termination (0 on terminal transitions), so
/// truncated transitions bootstrap and terminated ones do not.
pub fn double_dqn_targets(
    q_next_online: &Tensor,
    q_next_target: &Tensor,
    rewards: &Tensor,
    discounts: &Tensor,
) -> Tensor {
    let best = q_next_online.argmax(-1, true);
    let bootstrap = q_next_target.gather(2, &best, false);
    rewards.addcmul(discounts, &bootstrap)
}

impl Dqn {
    /// Fresh networks for `spec.population` agents with `config`'s settings, agent 0
    /// seeded with `seed` (see [`AgentHparams::seeds`]).
    pub fn new(spec: NetworkSpec, config: DqnConfig, device: Device, seed: u64) -> Self {
        let agents: Vec<AgentHparams> = AgentHparams::seeds(seed, spec.population)
            .map(|s| AgentHparams::from_config(&config, s))
            .collect();
        Self::population(spec, config, &agents, device)
    }

    /// Fresh networks for a population, one agent per entry of `agents` (which must
    /// number `spec.population`), each initialised as PyTorch's `nn.Linear` and
    /// `nn.Conv2d` (uniform ±1/√fan_in for weights and biases) from its own seeded
    /// generator: no global state, so two learners in one process do not disturb each
    /// other, and an agent starts where a one-agent run with its seed starts.
    /// `config` gives what the agents share (Adam's betas and ε, Huber's δ).
    ///
    /// # Panics
    /// If `agents` does not number `spec.population`.
    pub fn population(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: &[AgentHparams],
        device: Device,
    ) -> Self {
        assert_eq!(agents.len(), spec.population, "one entry per agent");
        let head = config
            .dueling
            .then(|| DuelingHead::new(&spec, Device::Cpu))
            .and_then(Result::ok);
        let layout = head.as_ref().map_or(&spec, |h| h.internal()).layout();
        let (k, p) = (spec.population, layout.len);
        let mut values = vec![0.0f32; k * p];
        for (agent, hp) in values.chunks_exact_mut(p).zip(agents) {
            let mut rng = SmallRng::seed_from_u64(hp.seed);
            for layer in layout.entries.chunks(2).chain(layout.conv.chunks(2)) {
                // [in, out] for a linear layer, [out, in, k, k] for a convolution.
                let fan_in: usize = match layer[0].shape.as_slice() {
                    [fan_in, _] => *fan_in,
                    [_, rest @ ..] => rest.iter().product(),
                    [] => 1,
                };
                let bound = 1.0 / (fan_in as f32).sqrt();
                for entry in layer {
                    for v in &mut agent[entry.offset..entry.offset + entry.len] {
                        *v = rng.random_range(-bound..bound);
                    }
                }
            }
            // LayerNorm starts as PyTorch's: gain 1, bias 0.
            for gain in layout.norm.iter().step_by(2) {
                agent[gain.offset..gain.offset + gain.len].fill(1.0);
            }
            if let Some(h) = &head {
                h.mask_host(agent);
            }
        }
        let host = Tensor::from_slice(&values).view([k as i64, p as i64]);
        let state = DqnState {
            target: host.copy(),
            adam_m: host.zeros_like(),
            adam_v: host.zeros_like(),
            online: host,
            adam_step: 0,
            updates: 0,
        };
        Self::restore(spec, config, agents, device, state)
    }

    /// The same population with fresh agents added after it (in the rows after the
    /// present ones), each started as [`Dqn::population`] starts it. A newcomer counts
    /// its own updates from here (for its target period and Adam's bias corrections),
    /// so it learns as it would in a population of its own: a sweep streams queued
    /// agents into the places of finished ones.
    pub fn admit(&self, newcomers: &[AgentHparams]) -> Self {
        let fresh: Vec<(AgentHparams, Option<DqnState>)> =
            newcomers.iter().map(|h| (*h, None)).collect();
        self.admit_states(fresh)
    }

    /// [`Dqn::admit`] where a newcomer may bring the state it had in another population
    /// (one agent's [`Dqn::agent_state`], read back from its checkpoint): it goes on
    /// from there, counting its own updates on from the state's.
    ///
    /// # Panics
    /// If a state is not one agent's of this network.
    pub fn admit_states(&self, newcomers: Vec<(AgentHparams, Option<DqnState>)>) -> Self {
        let mut spec = self.spec().clone();
        spec.population = newcomers.len();
        let fresh = Self::population_states(spec, self.config.clone(), newcomers, self.device);
        let hps = fresh.agents.hparams.clone();
        let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 0);
        let state = DqnState {
            online: cat(&self.online, &fresh.online),
            target: cat(&self.target, &fresh.target),
            adam_m: cat(&self.adam_m, &fresh.adam_m),
            adam_v: cat(&self.adam_v, &fresh.adam_v),
            adam_step: self.adam_step,
            updates: self.updates,
        };
        let mut agents = self.agents.hparams.clone();
        agents.extend_from_slice(&hps);
        let mut joined = self.agents.joined.clone();
        joined.extend(fresh.agents.joined.iter().map(|j| self.updates as i64 + j));
        self.rebuilt(state, &agents, &joined, |t, f| cat(t, f), &fresh)
    }

    /// A population of `agents`, each fresh (as [`Dqn::population`] starts it) or going
    /// on from the one-agent state it brings (see [`Dqn::admit_states`]).
    ///
    /// # Panics
    /// If `agents` does not number `spec.population`, or a state is not one agent's of
    /// this network.
    pub fn population_states(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: Vec<(AgentHparams, Option<DqnState>)>,
        device: Device,
    ) -> Self {
        let hps: Vec<AgentHparams> = agents.iter().map(|(h, _)| *h).collect();
        let fresh = Self::population(spec.clone(), config.clone(), &hps, device);
        if agents.iter().all(|(_, s)| s.is_none()) {
            return fresh;
        }
        let mut state = fresh.state();
        let mut joined = vec![0; agents.len()];
        tch::no_grad(|| {
            for (row, (_, s)) in agents.iter().enumerate() {
                let Some(s) = s else { continue };
                for (to, from) in [
                    (&mut state.online, &s.online),
                    (&mut state.target, &s.target),
                    (&mut state.adam_m, &s.adam_m),
                    (&mut state.adam_v, &s.adam_v),
                ] {
                    to.narrow(0, row as i64, 1).copy_(from);
                }
                // Its own updates so far: the population's count (0) less `joined`.
                joined[row] = -(s.updates as i64);
            }
        });
        Self::restore_joined(spec, config, &hps, &joined, device, state)
    }

    /// This population's settings around `state` (for [`Dqn::keep_agents`] and
    /// [`Dqn::admit`]): the skip counters are `counters` of this one's and `other`'s.
    fn rebuilt(
        &self,
        state: DqnState,
        agents: &[AgentHparams],
        joined: &[i64],
        counters: impl Fn(&Tensor, &Tensor) -> Tensor,
        other: &Self,
    ) -> Self {
        let mut spec = self.spec().clone();
        spec.population = agents.len();
        let mut next = Self::restore_joined(
            spec,
            self.config.clone(),
            agents,
            joined,
            self.device,
            state,
        );
        next.host_optimizer = self.host_optimizer;
        next.nonfinite = counters(&self.nonfinite, &other.nonfinite).contiguous();
        next.nonfinite_streak =
            counters(&self.nonfinite_streak, &other.nonfinite_streak).contiguous();
        next
    }

    /// Restores from a checkpointed state (shapes checked by the caller), every agent
    /// with `config`'s settings.
    pub fn from_state(
        spec: NetworkSpec,
        config: DqnConfig,
        device: Device,
        state: DqnState,
    ) -> Self {
        let agents = vec![AgentHparams::from_config(&config, 0); spec.population];
        Self::restore(spec, config, &agents, device, state)
    }

    /// Restores a population's state with each agent's own settings.
    pub fn restore(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: &[AgentHparams],
        device: Device,
        state: DqnState,
    ) -> Self {
        let joined = vec![0; agents.len()];
        Self::restore_joined(spec, config, agents, &joined, device, state)
    }

    /// [`Dqn::restore`] for agents that joined after `joined[k]` of the population's
    /// updates.
    fn restore_joined(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: &[AgentHparams],
        joined: &[i64],
        device: Device,
        state: DqnState,
    ) -> Self {
        assert_eq!(agents.len(), spec.population, "one entry per agent");
        // A spec that cannot have a dueling head was refused when the flags were
        // checked.
        let dueling = config
            .dueling
            .then(|| DuelingHead::new(&spec, device).expect("a dueling head fits this network"));
        let spec = dueling.as_ref().map_or(spec, |h| h.internal().clone());
        let layout = spec.layout();
        let k = spec.population as i64;
        // Contiguous f32: the CPU's optimizer works on the flat storage.
        let online = state
            .online
            .to_kind(Kind::Float)
            .to_device(device)
            .detach()
            .contiguous();
        let target = state.target.to_device(device).detach();
        let target_views = param_views(&target, &layout, k);
        let online_views = param_views(&online, &layout, k);
        let online_wt = online_views
            .iter()
            .step_by(2)
            .map(|w| w.transpose(1, 2))
            .collect();
        let grad = online.zeros_like();
        let grad_views = param_views(&grad, &layout, k);
        let (online_norm, target_norm, grad_norm) = (
            norm_views(&online, &layout, k),
            norm_views(&target, &layout, k),
            norm_views(&grad, &layout, k),
        );
        let torso = Torso::new(&spec, &online, &target, &grad);
        let half = (config.precision == Precision::Bf16).then(|| {
            HalfCopies::new(
                &online,
                &target,
                |flat| param_views(flat, &layout, k),
                |flat| conv_views(flat, &layout, k),
            )
        });
        Self {
            spec,
            dueling,
            config,
            device,
            online,
            online_views,
            online_wt,
            grad,
            grad_views,
            online_norm,
            target_norm,
            grad_norm,
            target,
            target_views,
            adam_m: state
                .adam_m
                .to_kind(Kind::Float)
                .to_device(device)
                .contiguous(),
            adam_v: state
                .adam_v
                .to_kind(Kind::Float)
                .to_device(device)
                .contiguous(),
            torso,
            half,
            adam_step: state.adam_step,
            updates: state.updates,
            updates_since_stats: 0,
            detail_sum: Tensor::zeros([3], (Kind::Float, device)),
            detail_count: 0,
            nonfinite: Tensor::zeros([k, 1], (Kind::Float, device)),
            nonfinite_streak: Tensor::zeros([k, 1], (Kind::Float, device)),
            bias_pows: None,
            agents: AgentTensors::new(agents, joined, device),
            host_optimizer: device == Device::Cpu,
        }
        .with_bias_pows()
    }

    /// Sets up [`Dqn::bias_pows`] when the agents' step numbers differ.
    fn with_bias_pows(mut self) -> Self {
        let k = self.spec.population;
        let own: Vec<u64> = (0..k).map(|a| self.agents.own(a, self.adam_step)).collect();
        if own.windows(2).all(|w| w[0] == w[1]) {
            return self;
        }
        let (b1, b2) = self.config.adam_betas;
        let column = |beta: f64| {
            let v: Vec<f32> = own.iter().map(|t| beta.powf(*t as f64) as f32).collect();
            Tensor::from_slice(&v)
                .view([k as i64, 1])
                .to_device(self.device)
        };
        self.bias_pows = Some((column(b1), column(b2)));
        self
    }

    /// Steps the optimizer with tensor operations, as on a GPU, even on the CPU (tests
    /// and benchmarks compare the two).
    pub fn use_tensor_optimizer(&mut self) {
        self.host_optimizer = false;
    }

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

    /// One gradient step on `batch` (already on the device). Never synchronises with
    /// the host: statistics accumulate on the device until [`Dqn::take_stats`]. Returns
    /// each item's TD error, on the device (see [`UpdateOutput`]).
    ///
    /// An agent whose loss or gradient is not finite skips this step (its parameters
    /// and optimizer state stay as they were) and the skip is counted.
    ///
    /// About 60 tensor operations in all.
    pub fn update(&mut self, batch: &Batch) -> UpdateOutput {
        let (q_taken, targets) = self.gradient(batch);
        let td = &q_taken - &targets;
        self.adam_step(&td);
        if let Some(half) = &mut self.half {
            half.refresh_online(&self.online);
        }
        if let Some(tau) = &self.agents.tau {
            // Agents with hard copies have τ = 0: unchanged.
            let _ = self.target.lerp_tensor_(&self.online, tau);
            self.refresh_half_target();
        }
        if self.updates.is_multiple_of(DETAIL_STATS_EVERY) {
            let k = self.spec.population as f64;
            let detail = Tensor::stack(
                &[
                    q_taken.huber_loss(&targets, Reduction::Mean, self.config.huber_delta) * k,
                    (&q_taken - &targets).abs().mean(Kind::Float),
                    q_taken.mean(Kind::Float),
                ],
                0,
            );
            let _ = self.detail_sum.g_add_(&detail);
            self.detail_count += 1;
        }
        self.updates += 1;
        self.updates_since_stats += 1;
        match self.agents.syncing(self.updates) {
            Sync::All => self.sync_target(),
            Sync::Some(due) => tch::no_grad(|| {
                let due = Tensor::from_slice(&due)
                    .view([-1, 1])
                    .to_device(self.device);
                let synced = self.online.where_self(&due, &self.target);
                self.target.copy_(&synced);
                self.refresh_half_target();
            }),
            Sync::None => {}
        }
        UpdateOutput {
            td_errors: td.squeeze_dim(2),
        }
    }

    /// The bf16 target copy takes the fp32 target's values (under `--precision bf16`).
    fn refresh_half_target(&mut self) {
        if let Some(half) = &mut self.half {
            half.refresh_target(&self.target);
        }
    }

    /// The views the forward and backward passes read: the bf16 copies' under
    /// `--precision bf16`, else the fp32 parameters' own.
    fn pass_views(&self) -> PassViews<'_> {
        let torso = self.torso.as_ref();
        match &self.half {
            Some(h) => PassViews {
                online: &h.online_views,
                online_wt: &h.online_wt,
                target: &h.target_views,
                torso_online: &h.torso_online,
                torso_target: &h.torso_target,
            },
            None => PassViews {
                online: &self.online_views,
                online_wt: &self.online_wt,
                target: &self.target_views,
                torso_online: torso.map_or(&[], |t| &t.online),
                torso_target: torso.map_or(&[], |t| &t.target),
            },
        }
    }

    /// Writes the gradient of the double-DQN Huber loss (each agent's batch mean, each
    /// item's loss scaled by its importance weight where the batch has them) into
    /// the flat gradient buffer; returns `Q(s, a)` and the targets, both `[K, B, 1]`.
    ///
    /// Each layer computes in its weights' element type, its input cast to it: under
    /// `--precision bf16` the torso and the hidden layers read the bf16 copies and the
    /// last layer the fp32 parameters, so Q-values, targets and the Huber derivative are
    /// fp32; every layer's gradient lands in the fp32 buffer.
    pub fn gradient(&mut self, batch: &Batch) -> (Tensor, Tensor) {
        let b = batch.batch_size();
        let views = self.pass_views();
        let layers = views.online.len() / 2;
        // The torso (autograd on the first B rows only: next observations are not
        // differentiated) turns images into features; the head starts from those.
        let (features, head_input) = match &self.torso {
            Some(t) => {
                let on = views.torso_online;
                let f = torso_forward(on, &t.strides, &t.image, &batch.obs2.narrow(1, 0, b));
                let f_next = tch::no_grad(|| {
                    torso_forward(on, &t.strides, &t.image, &batch.obs2.narrow(1, b, b))
                });
                let input = Tensor::cat(&[f.detach(), f_next], 1);
                (Some(f), input)
            }
            None => (None, batch.obs2.shallow_clone()),
        };
        // Forward over obs and next_obs together, keeping each layer's input (in the
        // layer's element type).
        let mut inputs = Vec::with_capacity(layers);
        // Per hidden layer with a LayerNorm: x̂ and 1/σ of the first B rows.
        let mut normed = Vec::with_capacity(self.online_norm.len() / 2);
        let mut h = head_input;
        for l in 0..layers {
            let (w, bias) = (&views.online[2 * l], &views.online[2 * l + 1]);
            let x = h.to_kind(w.kind());
            let mut z = bias.baddbmm(&x, w, 1.0, 1.0);
            inputs.push(x);
            if l + 1 < layers {
                if let [gain, beta] = self.online_norm.get(2 * l..2 * l + 2).unwrap_or_default() {
                    let (y, xhat, rstd) = layer_norm(&z, gain, beta);
                    normed.push((xhat.narrow(1, 0, b), rstd.narrow(1, 0, b)));
                    z = y;
                }
            }
            h = if l + 1 < layers { z.relu() } else { z };
        }
        let q_all = match &self.dueling {
            Some(head) => head.q(&h),
            None => h,
        };
        let q_next_target = self.target_q(&batch.obs2.narrow(1, b, b));
        let targets = double_dqn_targets(
            &q_all.narrow(1, b, b),
            &q_next_target,
            &batch.rewards,
            &batch.discounts,
        );
        let q = q_all.narrow(1, 0, b);
        let q_taken = q.gather(2, &batch.actions, false);

        // dLoss/dQ(s, a): Huber's derivative, clamp(q − y, ±δ), over the batch mean;
        // zero for the actions not taken.
        let delta = self.config.huber_delta;
        let mut g = (&q_taken - &targets).clamp(-delta, delta);
        if let Some(w) = &batch.weights {
            g *= w;
        }
        let _ = g.g_mul_scalar_(1.0 / b as f64);
        let mut d = q.zeros_like();
        let _ = d.scatter_(2, &batch.actions, &g);
        if let Some(head) = &self.dueling {
            d = head.dz(&d);
        }
        // Backward through the layers, on the first B rows only (next_obs is not
        // differentiated); ReLU's derivative is read off its output.
        for l in (0..layers).rev() {
            let x = inputs[l].narrow(1, 0, b);
            d = d.to_kind(x.kind());
            let (gw, gb) = (&self.grad_views[2 * l], &self.grad_views[2 * l + 1]);
            if x.kind() == Kind::Float {
                let _ = x.transpose(1, 2).bmm_out(gw, &d);
                let _ = d.sum_intlist_out(gb, [1i64].as_slice(), true, None);
            } else {
                // bf16 products into the fp32 buffer; the bias sums accumulate in fp32.
                gw.detach().copy_(&x.transpose(1, 2).bmm(&d));
                let _ = d.sum_intlist_out(gb, [1i64].as_slice(), true, Kind::Float);
            }
            if l > 0 {
                d = x.threshold_backward(&d.bmm(&views.online_wt[l]), 0.0);
                if let Some((xhat, rstd)) = normed.get(l - 1) {
                    d = self.layer_norm_backward(l - 1, xhat, rstd, &d);
                }
            } else if let (Some(torso), Some(features)) = (&self.torso, &features) {
                // dLoss/dfeatures, then autograd through the convolutions.
                let d_features = d.bmm(&views.online_wt[0]).to_kind(features.kind());
                let surrogate = (features * d_features).sum(Kind::Float);
                let grads = Tensor::run_backward(&[&surrogate], views.torso_online, false, false);
                for (g, out) in grads.iter().zip(&torso.grad) {
                    out.detach().copy_(g);
                }
            }
        }
        if let Some(head) = &self.dueling {
            head.mask(&self.grad_views[2 * (layers - 1)]);
        }
        (q_taken, targets)
    }

    /// LayerNorm `n`'s backward: writes its gain's and bias's gradients from `dy`, the
    /// gradient at its output `[K, B, H]`, and returns the gradient at its input (fp32):
    /// `dz = (dx̂ − mean(dx̂) − x̂ · mean(dx̂ · x̂)) / σ` with `dx̂ = dy · gain`.
    fn layer_norm_backward(&self, n: usize, xhat: &Tensor, rstd: &Tensor, dy: &Tensor) -> Tensor {
        let dy = dy.to_kind(Kind::Float);
        let dims = [1i64].as_slice();
        let _ = (&dy * xhat).sum_intlist_out(&self.grad_norm[2 * n], dims, true, None);
        let _ = dy.sum_intlist_out(&self.grad_norm[2 * n + 1], dims, true, None);
        let dxhat = dy * &self.online_norm[2 * n];
        let last = [-1i64].as_slice();
        let mean = dxhat.mean_dim(last, true, Kind::Float);
        let mean_dot = (&dxhat * xhat).mean_dim(last, true, Kind::Float);
        (dxhat - mean - xhat * mean_dot) * rstd
    }

    /// The dueling head's Q-values from the last layer's outputs (the outputs as they
    /// are without one).
    fn head(&self, z: Tensor) -> Tensor {
        match &self.dueling {
            Some(head) => head.q(&z),
            None => z,
        }
    }

    /// Q-values of the target network for next observations `[K, B, ...]` (no graph);
    /// fp32, the last layer's type.
    fn target_q(&self, next_obs: &Tensor) -> Tensor {
        let views = self.pass_views();
        tch::no_grad(|| {
            let norms = &self.target_norm;
            let z = match &self.torso {
                Some(t) => forward(
                    views.target,
                    norms,
                    &torso_forward(views.torso_target, &t.strides, &t.image, next_obs),
                ),
                None => forward(views.target, norms, next_obs),
            };
            self.head(z)
        })
    }

    /// Per-agent gradient clipping, then Adam, on the flat `[K, P]` tensors, masked per
    /// agent where the loss or gradient is not finite (about 25 ops).
    ///
    /// Adam's bias corrections are folded into scalars computed on the host:
    /// `p -= lr·√(1−β2ᵗ)/(1−β1ᵗ) · m / (√v + ε·√(1−β2ᵗ))`, which equals PyTorch's
    /// `p -= lr/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) + ε)`. `t` counts attempted steps, skipped
    /// ones included (a skip is rare, and this keeps the corrections host-side).
    fn adam_step(&mut self, td: &Tensor) {
        // The host path is Adam's; RMSProp runs as tensor operations everywhere.
        if self.host_optimizer && self.config.optimizer == Optimizer::Adam {
            self.adam_step_host(td);
            return;
        }
        let c = &self.config;
        let norms = self.grad.norm_scalaropt_dim(2, [1], true);
        // One finite check per agent covers the loss (through its TD errors) and the
        // gradient (through its norm); a NaN or infinity anywhere makes the sum so.
        let td_sum = td.sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Float);
        let ok = (&norms + td_sum.unsqueeze(1)).isfinite();
        let okf = ok.to_kind(Kind::Float);
        let skipped = okf.ones_like() - &okf;
        let _ = self.nonfinite.g_add_(&skipped);
        self.nonfinite_streak = (&self.nonfinite_streak + &skipped) * &skipped;
        // Skipped agents: a zero gradient (NaN · 0 is NaN, so select, not multiply) and
        // no change to the moments or parameters.
        let grad = self.grad.where_scalarother(&ok, 0.0);
        let clip = &self.agents.max_grad_norm;
        let norms = norms.where_self(&ok, clip);
        let scale = clip / norms.maximum(clip);
        let grad = grad * scale;

        self.adam_step += 1;
        if c.optimizer == Optimizer::Rmsprop {
            // adam_m holds E[g], adam_v E[g²] (as PyTorch's grad_avg and square_avg).
            let keep = &okf * (1.0 - RMSPROP_DECAY);
            let _ = self.adam_m.lerp_tensor_(&grad, &keep);
            let _ = self.adam_v.lerp_tensor_(&grad.square(), &keep);
            // Rounding can take the variance a hair below 0: clamp, not NaN.
            let denom = (&self.adam_v - self.adam_m.square())
                .clamp_min(0.0)
                .sqrt()
                .g_add_scalar_(RMSPROP_EPS);
            let step = okf * &self.agents.lr * -1.0;
            let _ = self.online.g_add_(&((grad / denom) * step));
            return;
        }
        let (b1, b2) = c.adam_betas;
        let _ = self.adam_m.lerp_tensor_(&grad, &(&okf * (1.0 - b1)));
        let _ = self
            .adam_v
            .lerp_tensor_(&grad.square(), &(&okf * (1.0 - b2)));
        let (denom, step) = match &mut self.bias_pows {
            None => {
                let b = self.agents.biases(self.adam_step, c.adam_betas)[0];
                let denom = self
                    .adam_v
                    .sqrt()
                    .g_add_scalar_(c.adam_eps * f64::from(b.bias2_sqrt));
                (denom, okf * &self.agents.lr * -f64::from(b.correction))
            }
            // Agents that joined later: their own step numbers, one column each.
            Some((pow1, pow2)) => {
                let _ = pow1.g_mul_scalar_(b1);
                let _ = pow2.g_mul_scalar_(b2);
                let bias1 = pow1.ones_like() - &*pow1;
                let bias2_sqrt = (pow2.ones_like() - &*pow2).sqrt();
                let denom = self.adam_v.sqrt() + &bias2_sqrt * c.adam_eps;
                (denom, okf * &self.agents.lr * -(bias2_sqrt / bias1))
            }
        };
        let _ = self.online.g_add_(&((&self.adam_m / denom) * step));
    }

    /// [`Dqn::adam_step`] on the CPU in one pass over the parameters ([`host_adam`]).
    fn adam_step_host(&mut self, td: &Tensor) {
        let c = &self.config;
        self.adam_step += 1;
        let (b1, b2) = c.adam_betas;
        let settings = host_adam::Step {
            beta1: b1 as f32,
            beta2: b2 as f32,
            eps: c.adam_eps as f32,
        };
        let biases = self.agents.biases(self.adam_step, c.adam_betas);
        let td = td.contiguous();
        // SAFETY: all five are contiguous f32 CPU tensors (made so in `restore`, or
        // just above) with their own storage, which nothing else touches during the
        // call: the views into `online` and `grad` are not used meanwhile.
        let ok = unsafe {
            host_adam::step(
                f32s_mut(&mut self.online),
                f32s_mut(&mut self.adam_m),
                f32s_mut(&mut self.adam_v),
                f32s(&self.grad),
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
                f32s_mut(&mut self.nonfinite),
                f32s_mut(&mut self.nonfinite_streak),
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

    /// Each agent's current run of skipped (non-finite) updates (one host read).
    pub fn nonfinite_streaks(&self) -> Vec<u64> {
        let host = self.nonfinite_streak.to_device(Device::Cpu).contiguous();
        Vec::<f32>::try_from(host.view([-1]))
            .unwrap_or_default()
            .into_iter()
            .map(|x| x as u64)
            .collect()
    }

    /// The same networks for only the agents in `rows` (in that order), each with its
    /// settings: a population drops its finished agents, so they stop costing compute.
    /// Parameters, targets, Adam's moments, the update count, when each agent joined and
    /// the agents' skip counters carry over (the loss statistics since the last read do
    /// not).
    pub fn keep_agents(&self, rows: &[usize]) -> Self {
        let index: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let index = Tensor::from_slice(&index).to_device(self.device);
        let pick = |t: &Tensor| t.index_select(0, &index);
        let state = DqnState {
            online: pick(&self.online),
            target: pick(&self.target),
            adam_m: pick(&self.adam_m),
            adam_v: pick(&self.adam_v),
            adam_step: self.adam_step,
            updates: self.updates,
        };
        let agents: Vec<AgentHparams> = rows.iter().map(|&r| self.agents.hparams[r]).collect();
        let joined: Vec<i64> = rows.iter().map(|&r| self.agents.joined[r]).collect();
        self.rebuilt(state, &agents, &joined, |t, _| pick(t), self)
    }

    /// Agent `row`'s state as a population of one on the host (its own update count):
    /// what its checkpoint saves, and [`Dqn::admit_states`] takes back.
    pub fn agent_state(&self, row: usize) -> DqnState {
        let pick = |t: &Tensor| t.narrow(0, row as i64, 1).to_device(Device::Cpu).copy();
        DqnState {
            online: pick(&self.online),
            target: pick(&self.target),
            adam_m: pick(&self.adam_m),
            adam_v: pick(&self.adam_v),
            adam_step: self.agents.own(row, self.adam_step),
            updates: self.agents.own(row, self.updates),
        }
    }

    /// Copies the online parameters into the target network.
    pub fn sync_target(&mut self) {
        tch::no_grad(|| self.target.copy_(&self.online));
        self.refresh_half_target();
    }

    /// Reads and resets the on-device statistics (one host sync).
    pub fn take_stats(&mut self) -> UpdateStats {
        let n = std::mem::take(&mut self.updates_since_stats);
        let detail_n = std::mem::take(&mut self.detail_count);
        if n == 0 {
            return UpdateStats {
                learning_rate: self.learning_rate(),
                ..UpdateStats::default()
            };
        }
        // One copy to the host for everything: [loss, td, q, skipped, longest streak].
        let all = Tensor::cat(
            &[
                self.detail_sum.shallow_clone(),
                self.nonfinite.sum(Kind::Float).view([1]),
                self.nonfinite_streak.max().view([1]),
            ],
            0,
        )
        .to_device(Device::Cpu);
        let v: Vec<f32> = Vec::<f32>::try_from(&all).unwrap_or_default();
        let _ = self.detail_sum.zero_();
        let _ = self.nonfinite.zero_();
        let per = |i: usize, count: u64| match v.get(i) {
            Some(x) if count > 0 => f64::from(*x) / count as f64,
            _ => f64::NAN,
        };
        let count = |i: usize| v.get(i).map_or(0, |x| *x as u64);
        UpdateStats {
            loss: per(0, detail_n),
            td_abs: per(1, detail_n),
            q: per(2, detail_n),
            updates: n,
            nonfinite: count(3),
            nonfinite_streak: count(4),
            learning_rate: self.learning_rate(),
        }
    }

    /// The online parameters as host floats, `[K, P]` row-major (to publish to actors).
    pub fn online_params(&self) -> Vec<f32> {
        let host = self
            .published(&self.online.detach())
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
            Some(head) => head.fold(&self.online),
            None => self.online.copy(),
        })
    }

    /// Parameters `[K, P]` as published: a dueling head folded into its last layer.
    fn published(&self, flat: &Tensor) -> Tensor {
        match &self.dueling {
            Some(head) => tch::no_grad(|| head.fold(flat)),
            None => flat.shallow_clone(),
        }
    }

    /// Q-values of the online network for `obs` `[K, N, ...]` (tests, export).
    pub fn q_values(&self, obs: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let obs = obs.to_device(self.device);
            let norms = &self.online_norm;
            self.head(match &self.torso {
                Some(t) => forward(
                    &self.online_views,
                    norms,
                    &torso_forward(&t.online, &t.strides, &t.image, &obs),
                ),
                None => forward(&self.online_views, norms, &obs),
            })
        })
    }

    /// A host copy of the full state, for a checkpoint.
    pub fn state(&self) -> DqnState {
        let host = |t: &Tensor| t.detach().to_device(Device::Cpu).copy();
        DqnState {
            online: host(&self.online),
            target: host(&self.target),
            adam_m: host(&self.adam_m),
            adam_v: host(&self.adam_v),
            adam_step: self.adam_step,
            updates: self.updates,
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
        let params = millrace_proto::Params {
            version: 0,
            env_steps: 0,
            updates: 0,
            population: 1,
            data: dqn.online_params(),
        };
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
        let leaf = dqn.online.detach().copy().set_requires_grad(true);
        let q_all = dqn.head(forward(
            &param_views(&leaf, &layout, k),
            &norm_views(&leaf, &layout, k),
            &batch.obs2,
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
        dqn.target.copy_(&other.online);
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
        let manual = dqn.grad.copy();
        let auto = autograd_gradient(&dqn, &batch);
        let err = (&manual - &auto).abs().max().double_value(&[]);
        let scale = auto.abs().max().double_value(&[]);
        assert!(scale > 1e-3, "gradient is not trivially zero");
        for (g, name) in dqn.grad_norm.iter().zip(["gain", "bias"].iter().cycle()) {
            let norm = g.abs().max().double_value(&[]);
            assert!(norm > 1e-4 * scale, "a LayerNorm {name} gradient is zero");
        }
        if weighted {
            // The weights matter: the unweighted gradient differs.
            let mut plain = Dqn::new(spec(k as usize), config(), Device::Cpu, 5);
            plain.target.copy_(&other.online);
            plain.online.copy_(&dqn.online);
            let _ = plain.gradient(&Batch {
                weights: None,
                ..batch.shallow_clone()
            });
            let diff = (&plain.grad - &manual).abs().max().double_value(&[]);
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
        dqn.target.copy_(&other.online);
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
        let manual = dqn.grad.copy();
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
        let w = &param_views(&dqn.online, &layout, k)[4];
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
        dqn.target.copy_(&other.online);
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
            dqn.online.copy(),
            dqn.online.zeros_like(),
            dqn.online.zeros_like(),
        );
        let mut mirror = Dqn::new(spec(1), cfg, Device::Cpu, 4);
        mirror.target.copy_(&other.online);
        for _ in 0..2 {
            let _ = mirror.gradient(&batch);
            let g = mirror.grad.copy();
            m = &m * RMSPROP_DECAY + &g * (1.0 - RMSPROP_DECAY);
            v = &v * RMSPROP_DECAY + g.square() * (1.0 - RMSPROP_DECAY);
            let avg = (&v - m.square()).sqrt() + RMSPROP_EPS;
            p = &p - g / avg * 1e-3;
            mirror.online.copy_(&p);
            let _ = dqn.update(&batch);
        }
        let err = (&dqn.online - &p).abs().max().double_value(&[]);
        assert!(err < 1e-6, "max |ours - reference| = {err}");
        assert!((&p - &other.online).abs().max().double_value(&[]) > 0.0);
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
        for v in &dqn.online_norm {
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
        let gains = Vec::<f32>::try_from(fresh.online_norm[0].reshape([-1])).unwrap();
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

    fn images(n: i64) -> Tensor {
        Tensor::randint(256, [1, n, 4, 36, 36], (Kind::Uint8, Device::Cpu))
    }

    #[test]
    fn cnn_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(false, false);
    }

    #[test]
    fn cnn_dueling_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(true, false);
    }

    #[test]
    fn cnn_layer_norm_dueling_gradient_matches_autograd_end_to_end() {
        check_cnn_gradient(true, true);
    }

    fn check_cnn_gradient(dueling: bool, layer_norm: bool) {
        let cfg = DqnConfig {
            dueling,
            ..config()
        };
        let spec = NetworkSpec {
            layer_norm,
            ..cnn_spec()
        };
        let mut dqn = Dqn::new(spec.clone(), cfg.clone(), Device::Cpu, 5);
        let other = Dqn::new(spec, cfg, Device::Cpu, 6);
        dqn.target.copy_(&other.online);
        tch::manual_seed(10);
        scramble_norms(&dqn);
        let b = 6;
        tch::manual_seed(12);
        let batch = Batch {
            obs2: images(2 * b),
            actions: Tensor::randint(2, [1, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::randn([1, b, 1], (Kind::Float, Device::Cpu)) * 3.0,
            discounts: Tensor::full([1, b, 1], 0.99, (Kind::Float, Device::Cpu)),
            weights: None,
        };
        let _ = dqn.gradient(&batch);
        let manual = dqn.grad.copy();

        let layout = dqn.spec.layout();
        let leaf = dqn.online.detach().copy().set_requires_grad(true);
        let (head, conv) = (
            param_views(&leaf, &layout, 1),
            conv_views(&leaf, &layout, 1),
        );
        let t = dqn.torso.as_ref().unwrap();
        let q_all = dqn.head(forward(
            &head,
            &norm_views(&leaf, &layout, 1),
            &torso_forward(&conv, &t.strides, &t.image, &batch.obs2),
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
        use millrace_actor::{CnnPolicy, Policy};
        let mut dqn = Dqn::new(cnn_spec(), config(), Device::Cpu, 3);
        tch::manual_seed(4);
        let obs = images(3);
        let host: Vec<u8> = Vec::try_from(obs.view([-1])).unwrap();
        let mut policy = CnnPolicy::new(cnn_spec()).unwrap();
        policy
            .load(&millrace_proto::Params {
                version: 0,
                env_steps: 0,
                updates: 0,
                population: 1,
                data: dqn.online_params(),
            })
            .unwrap();
        let mut q = [0.0f32; 6];
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
