//! The network's passes: parameter views of the flat `[K, P]` tensors, the MLP and
//! convolutional torso forward passes, the written-out backward pass of the double-DQN
//! Huber loss, and Q-values.

use super::*;

pub(crate) fn param_views(flat: &Tensor, layout: &ParamLayout, population: i64) -> Vec<Tensor> {
    matrix_views(flat, &layout.entries, population)
}

/// Views of weights `[in, out]` as `[K, in, out]` and biases `[out]` as `[K, 1, out]`.
fn matrix_views(flat: &Tensor, entries: &[ParamEntry], population: i64) -> Vec<Tensor> {
    entries
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

/// Views of the IQN embedding's weight `[K, n, H₀]` and bias `[K, 1, H₀]` (empty for a
/// network without an IQN head).
pub(crate) fn iqn_views(flat: &Tensor, layout: &ParamLayout, population: i64) -> Vec<Tensor> {
    matrix_views(flat, &layout.iqn, population)
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
pub(super) fn layer_norm(z: &Tensor, gain: &Tensor, bias: &Tensor) -> (Tensor, Tensor, Tensor) {
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
pub(super) struct PassViews<'a> {
    pub(super) online: &'a [Tensor],
    pub(super) online_wt: &'a [Tensor],
    pub(super) target: &'a [Tensor],
    /// The torso's filters and biases (empty without a torso).
    pub(super) torso_online: &'a [Tensor],
    pub(super) torso_target: &'a [Tensor],
}

/// The convolutional torso's parameters, as views of the flat online and target tensors.
pub(super) struct Torso {
    /// Leaves that share the online tensor's storage, for autograd.
    pub(super) online: Vec<Tensor>,
    pub(super) target: Vec<Tensor>,
    pub(super) grad: Vec<Tensor>,
    /// The steps every pass takes ([`NetworkSpec::torso_plan`]).
    pub(super) plan: Vec<TorsoStep>,
    pub(super) image: Vec<i64>,
}

impl Torso {
    pub(super) fn new(
        spec: &NetworkSpec,
        online: &Tensor,
        target: &Tensor,
        grad: &Tensor,
    ) -> Option<Self> {
        if !spec.has_torso() {
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
            plan: spec.torso_plan(),
            image: spec.image.iter().map(|d| *d as i64).collect(),
        })
    }
}

/// The torso of K agents at once: `x` is `[K, N, C, H, W]` `u8` (or `[K, N, C·H·W]`),
/// `views` alternate filters `[K, out, in, kh, kw]` and biases `[K, out]`, `plan` is
/// the torso's steps ([`NetworkSpec::torso_plan`]); returns features `[K, N, F]` (each
/// agent's flattened in `C, H, W` order), computed in the filters' element type.
///
/// The agents' images go side by side along the channels, `[N, K·C, H, W]`, and each
/// convolution is one grouped convolution with K groups: agent k's filters see only
/// agent k's channels, so K small torsos are one large convolution. ReLUs, max-pools
/// and residual sums act channel by channel, so they need no grouping.
pub fn torso_forward(views: &[Tensor], plan: &[TorsoStep], image: &[i64], x: &Tensor) -> Tensor {
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
    let mut saved = Vec::new();
    for step in plan {
        h = match *step {
            TorsoStep::Conv {
                index,
                stride,
                padding,
                ..
            } => {
                let w = views[2 * index].size();
                let filters = views[2 * index].reshape([k * w[1], w[2], w[3], w[4]]);
                let bias = views[2 * index + 1].reshape([k * w[1]]);
                let (s, p) = (stride as i64, padding as i64);
                h.conv2d(&filters, Some(&bias), [s, s], [p, p], [1, 1], k)
            }
            TorsoStep::Relu => h.relu(),
            TorsoStep::MaxPool {
                kernel,
                stride,
                padding,
            } => {
                let (k, s, p) = (kernel as i64, stride as i64, padding as i64);
                h.max_pool2d([k, k], [s, s], [p, p], [1, 1], false)
            }
            TorsoStep::AdaptiveMaxPool { size } => {
                h.adaptive_max_pool2d([size as i64, size as i64]).0
            }
            TorsoStep::Save => {
                saved.push(h.shallow_clone());
                h
            }
            TorsoStep::AddSaved => h + saved.pop().expect("a residual sum follows its save"),
        };
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

/// Munchausen-DQN targets `[K, B, 1]` (see [`Munchausen`]) from the target network's
/// Q-values at `s` and at `s'` (`[K, B, A]` each, fp32), the actions taken `[K, B, 1]`,
/// the (n-step) rewards and the discounts (`γⁿ`, 0 where the episode terminated);
/// `[tau, alpha, clip]` are each agent's settings, `[K, 1, 1]`
/// ([`Munchausen::per_agent`]). `τ·log π` is `τ·log_softmax(q/τ)`, stable for small τ.
pub fn munchausen_targets(
    q_target: &Tensor,
    q_next_target: &Tensor,
    actions: &Tensor,
    rewards: &Tensor,
    discounts: &Tensor,
    [tau, alpha, clip]: &[Tensor; 3],
) -> Tensor {
    let tau_log_pi = |q: &Tensor| (q / tau).log_softmax(-1, Kind::Float) * tau;
    let bonus = tau_log_pi(q_target)
        .gather(2, actions, false)
        .maximum(clip)
        .clamp_max(0.0)
        * alpha;
    let next = tau_log_pi(q_next_target);
    let pi_next = (&next / tau).exp();
    let soft =
        (pi_next * (q_next_target - next)).sum_dim_intlist([-1i64].as_slice(), true, Kind::Float);
    (rewards + bonus).addcmul(discounts, &soft)
}

impl Dqn {
    /// The TD targets `[K, B, 1]` of `batch` under the configured target rule, given
    /// the online network's Q-values at the next observations (double DQN's argmax).
    pub(crate) fn td_targets(&self, q_next_online: &Tensor, batch: &Batch) -> Tensor {
        let b = batch.batch_size();
        match &self.rule {
            TargetRule::Double => double_dqn_targets(
                q_next_online,
                &self.target_q(&batch.obs2.narrow(1, b, b)),
                &batch.rewards,
                &batch.discounts,
            ),
            TargetRule::Munchausen(settings) => {
                // One target pass over s and s' together.
                let q = self.target_q(&batch.obs2);
                munchausen_targets(
                    &q.narrow(1, 0, b),
                    &q.narrow(1, b, b),
                    &batch.actions,
                    &batch.rewards,
                    &batch.discounts,
                    settings,
                )
            }
        }
    }

    /// The views the forward and backward passes read: the bf16 copies' under
    /// `--precision bf16`, else the fp32 parameters' own.
    pub(super) fn pass_views(&self) -> PassViews<'_> {
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
                online: &self.params.online_views,
                online_wt: &self.params.online_wt,
                target: &self.params.target_views,
                torso_online: torso.map_or(&[], |t| &t.online),
                torso_target: torso.map_or(&[], |t| &t.target),
            },
        }
    }

    /// Writes the gradient of the Huber loss against the TD targets (each agent's batch mean, each
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
                let f = torso_forward(on, &t.plan, &t.image, &batch.obs2.narrow(1, 0, b));
                let f_next = tch::no_grad(|| {
                    torso_forward(on, &t.plan, &t.image, &batch.obs2.narrow(1, b, b))
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
        let mut normed = Vec::with_capacity(self.params.online_norm.len() / 2);
        let mut h = head_input;
        for l in 0..layers {
            let (w, bias) = (&views.online[2 * l], &views.online[2 * l + 1]);
            let x = h.to_kind(w.kind());
            let mut z = bias.baddbmm(&x, w, 1.0, 1.0);
            inputs.push(x);
            if l + 1 < layers {
                if let [gain, beta] = self
                    .params
                    .online_norm
                    .get(2 * l..2 * l + 2)
                    .unwrap_or_default()
                {
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
        let targets = self.td_targets(&q_all.narrow(1, b, b), batch);
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
            let (gw, gb) = (
                &self.params.grad_views[2 * l],
                &self.params.grad_views[2 * l + 1],
            );
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
            head.mask(&self.params.grad_views[2 * (layers - 1)]);
        }
        (q_taken, targets)
    }

    /// LayerNorm `n`'s backward: writes its gain's and bias's gradients from `dy`, the
    /// gradient at its output `[K, B, H]`, and returns the gradient at its input (fp32):
    /// `dz = (dx̂ − mean(dx̂) − x̂ · mean(dx̂ · x̂)) / σ` with `dx̂ = dy · gain`.
    pub(super) fn layer_norm_backward(
        &self,
        n: usize,
        xhat: &Tensor,
        rstd: &Tensor,
        dy: &Tensor,
    ) -> Tensor {
        let dy = dy.to_kind(Kind::Float);
        let dims = [1i64].as_slice();
        let _ = (&dy * xhat).sum_intlist_out(&self.params.grad_norm[2 * n], dims, true, None);
        let _ = dy.sum_intlist_out(&self.params.grad_norm[2 * n + 1], dims, true, None);
        let dxhat = dy * &self.params.online_norm[2 * n];
        let last = [-1i64].as_slice();
        let mean = dxhat.mean_dim(last, true, Kind::Float);
        let mean_dot = (&dxhat * xhat).mean_dim(last, true, Kind::Float);
        (dxhat - mean - xhat * mean_dot) * rstd
    }

    /// The dueling head's Q-values from the last layer's outputs (the outputs as they
    /// are without one).
    pub(super) fn head(&self, z: Tensor) -> Tensor {
        match &self.dueling {
            Some(head) => head.q(&z),
            None => z,
        }
    }

    /// Q-values of the target network for next observations `[K, B, ...]` (no graph);
    /// fp32, the last layer's type.
    pub(super) fn target_q(&self, next_obs: &Tensor) -> Tensor {
        let views = self.pass_views();
        tch::no_grad(|| {
            let norms = &self.params.target_norm;
            let z = match &self.torso {
                Some(t) => forward(
                    views.target,
                    norms,
                    &torso_forward(views.torso_target, &t.plan, &t.image, next_obs),
                ),
                None => forward(views.target, norms, next_obs),
            };
            self.head(z)
        })
    }

    /// Q-values of the online network for `obs` `[K, N, ...]` (tests, export); with an
    /// IQN head, the mean over the acting fractions, as actors compute them.
    pub fn q_values(&self, obs: &Tensor) -> Tensor {
        if let Some(head) = self.iqn_head() {
            return self.iqn_q_values(&head, &obs.to_device(self.device));
        }
        tch::no_grad(|| {
            let obs = obs.to_device(self.device);
            let norms = &self.params.online_norm;
            self.head(match &self.torso {
                Some(t) => forward(
                    &self.params.online_views,
                    norms,
                    &torso_forward(&t.online, &t.plan, &t.image, &obs),
                ),
                None => forward(&self.params.online_views, norms, &obs),
            })
        })
    }
}
