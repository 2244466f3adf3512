//! The implicit quantile network's update (IQN, Dabney et al. 2018; see
//! `millrace_proto::iqn` for the network): quantile values at sampled fractions, the
//! quantile Huber loss, and its gradient.
//!
//! Unlike the Q-network's written-out backward pass, this one goes through autograd:
//! the head runs once per sampled fraction, so its arithmetic is several times the
//! Q-network's and graph bookkeeping is a smaller share. Its cost against double DQN is
//! measured by the ceiling bench (`--head q,iqn`).

use millrace_proto::IqnHead;
use tch::{Kind, Tensor};

use super::net::{layer_norm, torso_forward};
use super::{Batch, Dqn, TargetRule};

/// How many fractions the learner samples (Dabney et al.'s N and N′, 8 each) and the
/// Huber loss's κ (1).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IqnSampling {
    /// Fractions for the online network's quantiles at `s`, N.
    pub online: usize,
    /// Fractions for the target's quantiles at `s′`, N′.
    pub target: usize,
    pub kappa: f64,
}

/// Fractions an IQN update may sample, N and N′ each.
pub const MAX_FRACTIONS: usize = 256;

/// A count of fractions out of `1..=MAX_FRACTIONS` ([`IqnSampling::new`]): which one
/// (`online` or `target`) and the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be in 1..={MAX_FRACTIONS}: a whole number from 1 to {MAX_FRACTIONS}, got {count}")]
pub struct FractionsError {
    pub which: &'static str,
    pub count: usize,
}

impl IqnSampling {
    /// N fractions for the online network's quantiles and N′ for the target's, each
    /// in `1..=MAX_FRACTIONS`; κ 1. The command line and a sweep's per-agent values
    /// are both checked here.
    pub fn new(online: usize, target: usize) -> Result<Self, FractionsError> {
        Ok(Self {
            online: Self::checked_count(online, "online")?,
            target: Self::checked_count(target, "target")?,
            ..Self::default()
        })
    }

    /// `count` fractions for the `which` network (`online` or `target`), if in range.
    pub fn checked_count(count: usize, which: &'static str) -> Result<usize, FractionsError> {
        if (1..=MAX_FRACTIONS).contains(&count) {
            Ok(count)
        } else {
            Err(FractionsError { which, count })
        }
    }
}

impl Default for IqnSampling {
    fn default() -> Self {
        Self {
            online: 8,
            target: 8,
            kappa: 1.0,
        }
    }
}

/// `cos(π·i·τ)` for `i < n`: `[..., n]` for fractions `[...]`.
pub fn cosines(taus: &Tensor, n: i64) -> Tensor {
    let i = Tensor::arange(n, (Kind::Float, taus.device())) * std::f64::consts::PI;
    (taus.unsqueeze(-1) * i).cos()
}

/// The quantile values `[K, N, T, outputs]` of the MLP head for inputs `x` `[K, N, F]`
/// (the torso's features, or flat observations) at fractions `taus` `[K, N, T]`.
/// `views` alternate weights `[K, in, out]` and biases `[K, 1, out]`, `norms` the
/// LayerNorms' gains and biases (empty without), `embed` the embedding's weight
/// `[K, n, H₀]` and bias `[K, 1, H₀]`. The first hidden layer's output (after its
/// LayerNorm and ReLU) is multiplied by `ReLU(cos(π·i·τ) · W + b)`; the other layers
/// run on the products.
pub fn quantiles(
    views: &[Tensor],
    norms: &[Tensor],
    embed: &[Tensor],
    x: &Tensor,
    taus: &Tensor,
) -> Tensor {
    let layers = views.len() / 2;
    let (k, n, t) = (taus.size()[0], taus.size()[1], taus.size()[2]);
    let hidden_layer = |l: usize, z: Tensor| {
        let z = match norms.get(2 * l..2 * l + 2) {
            Some([gain, bias]) => layer_norm(&z, gain, bias).0,
            _ => z,
        };
        z.relu()
    };
    let psi = hidden_layer(0, views[1].baddbmm(x, &views[0], 1.0, 1.0));
    let width = psi.size()[2];
    let c = cosines(taus, embed[0].size()[1]).view([k, n * t, -1]);
    let phi = embed[1].baddbmm(&c, &embed[0], 1.0, 1.0).relu();
    let mut h = (psi.unsqueeze(2) * phi.view([k, n, t, width])).view([k, n * t, width]);
    for l in 1..layers {
        h = views[2 * l + 1].baddbmm(&h, &views[2 * l], 1.0, 1.0);
        if l + 1 < layers {
            h = hidden_layer(l, h);
        }
    }
    h.view([k, n, t, -1])
}

/// The quantile Huber loss of each item, `[K, B]`: for online quantiles `z` `[K, B, N]`
/// at fractions `taus` `[K, B, N]` and target quantiles `y` `[K, B, N′]`, with
/// `δ_ij = y_j − z_i`, `Σ_i mean_j |τ_i − 1{δ_ij < 0}| · Huber_κ(δ_ij) / κ`; and the
/// mean `|δ_ij|` of each item (its priority), `[K, B]`.
pub fn quantile_huber(z: &Tensor, taus: &Tensor, y: &Tensor, kappa: f64) -> (Tensor, Tensor) {
    let delta = y.unsqueeze(2) - z.unsqueeze(3);
    let abs = delta.abs();
    let huber = (delta.square() * 0.5).where_self(&abs.le(kappa), &((&abs - 0.5 * kappa) * kappa));
    let below = delta.detach().lt(0.0).to_kind(Kind::Float);
    let weight = (taus.unsqueeze(3) - below).abs();
    let loss = (weight * huber / kappa)
        .mean_dim([3i64].as_slice(), false, Kind::Float)
        .sum_dim_intlist([2i64].as_slice(), false, Kind::Float);
    let priority = abs
        .detach()
        .mean_dim([2i64, 3].as_slice(), false, Kind::Float);
    (loss, priority)
}

impl Dqn {
    /// The IQN head's settings, if the network has one.
    pub(super) fn iqn_head(&self) -> Option<IqnHead> {
        self.spec.iqn
    }

    /// Quantile values `[K, N, T, A]` of the online (or target) network for `obs`
    /// `[K, N, ...]` at fractions `taus`, through the dueling head if any; no graph.
    fn quantiles_of(&self, target: bool, obs: &Tensor, taus: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let (views, norms, embed) = if target {
                (
                    &self.params.target_views,
                    &self.params.target_norm,
                    &self.params.target_iqn,
                )
            } else {
                (
                    &self.params.online_views,
                    &self.params.online_norm,
                    &self.params.online_iqn,
                )
            };
            let x = match &self.torso {
                Some(t) => {
                    let conv = if target { &t.target } else { &t.online };
                    torso_forward(conv, &t.plan, &t.image, obs)
                }
                None => obs.shallow_clone(),
            };
            self.head(quantiles(views, norms, embed, &x, taus))
        })
    }

    /// Q-values `[K, N, A]` of the online network for `obs`: the mean over the fixed
    /// acting fractions ([`IqnHead::act_fractions`]), as actors compute them.
    pub(super) fn iqn_q_values(&self, head: &IqnHead, obs: &Tensor) -> Tensor {
        let (k, n) = (obs.size()[0], obs.size()[1]);
        let taus = Tensor::from_slice(&head.act_fractions())
            .to_device(self.device)
            .view([1, 1, -1])
            .expand([k, n, head.quantiles as i64], false);
        self.quantiles_of(false, obs, &taus)
            .mean_dim([2i64].as_slice(), false, Kind::Float)
    }

    /// The target quantiles `[K, B, N′]` of `batch` at the target's fractions `t_next`
    /// `[K, B, N′]`: double DQN's (the online network's greedy action at `s′`, by its
    /// mean over the same fractions) or Munchausen's (M-IQN: the policy is the softmax
    /// of the target network's mean quantiles, at `s` for the bonus and at `s′`).
    pub(super) fn iqn_targets(&self, batch: &Batch, t_next: &Tensor) -> Tensor {
        let b = batch.batch_size();
        let (k, n) = (t_next.size()[0], t_next.size()[2]);
        let next = batch.obs2.narrow(1, b, b);
        tch::no_grad(|| {
            match &self.rule {
                TargetRule::Double => {
                    // The online network's greedy action at s′ (its mean over the
                    // same fractions), the target's quantiles of it.
                    let zt = self.quantiles_of(true, &next, t_next);
                    let best = self
                        .quantiles_of(false, &next, t_next)
                        .mean_dim([2i64].as_slice(), false, Kind::Float)
                        .argmax(-1, true)
                        .unsqueeze(2)
                        .expand([k, b, n, 1], false);
                    let zt = zt.gather(3, &best, false).squeeze_dim(3);
                    batch.rewards.addcmul(&batch.discounts, &zt)
                }
                TargetRule::Munchausen([tau, alpha, clip]) => {
                    // M-IQN: the policy is the softmax of the target network's mean
                    // quantiles, at s (for the bonus) and at s′, in one pass; each
                    // agent's τ, α and clip `[K, 1, 1]`.
                    let both = Tensor::cat(&[t_next, t_next], 1);
                    let zt = self.quantiles_of(true, &batch.obs2, &both);
                    let qbar = zt.mean_dim([2i64].as_slice(), false, Kind::Float);
                    let tau_log_pi = |q: &Tensor| (q / tau).log_softmax(-1, Kind::Float) * tau;
                    let bonus = tau_log_pi(&qbar.narrow(1, 0, b))
                        .gather(2, &batch.actions, false)
                        .maximum(clip)
                        .clamp_max(0.0)
                        * alpha;
                    let next_log_pi = tau_log_pi(&qbar.narrow(1, b, b));
                    let pi = (&next_log_pi / tau).exp();
                    // Σ_a π(a|s′) (z_j(s′, a) − τ log π(a|s′)): [K, B, N′].
                    let soft = ((zt.narrow(1, b, b) - next_log_pi.unsqueeze(2)) * pi.unsqueeze(2))
                        .sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
                    (&batch.rewards + bonus).addcmul(&batch.discounts, &soft)
                }
            }
        })
    }

    /// Writes the quantile Huber loss's gradient (each agent's batch mean, each item's
    /// loss scaled by its importance weight where the batch has them) into the flat
    /// gradient buffer; returns each item's mean online quantile at the action taken
    /// and that less its mean `|δ|` (so that their difference is the item's priority),
    /// both `[K, B, 1]`, and the loss summed over agents.
    pub(super) fn iqn_gradient(&mut self, batch: &Batch) -> (Tensor, Tensor, Tensor) {
        let b = batch.batch_size();
        let k = self.spec.population as i64;
        let sampling = self.config.iqn;
        let device = self.device;
        let leaf = |v: &Tensor| v.detach().set_requires_grad(true);
        let views: Vec<Tensor> = self.params.online_views.iter().map(leaf).collect();
        let norms: Vec<Tensor> = self.params.online_norm.iter().map(leaf).collect();
        let embed: Vec<Tensor> = self.params.online_iqn.iter().map(leaf).collect();
        let obs = batch.obs2.narrow(1, 0, b);
        let conv: Vec<Tensor> = self
            .torso
            .as_ref()
            .map(|t| t.online.iter().map(leaf).collect())
            .unwrap_or_default();
        let x = match &self.torso {
            Some(t) => torso_forward(&conv, &t.plan, &t.image, &obs),
            None => obs.shallow_clone(),
        };
        let taus = Tensor::rand([k, b, sampling.online as i64], (Kind::Float, device));
        let z = self.head(quantiles(&views, &norms, &embed, &x, &taus));
        let actions = batch
            .actions
            .unsqueeze(2)
            .expand([k, b, taus.size()[2], 1], false);
        let z_taken = z.gather(3, &actions, false).squeeze_dim(3);

        let t_next = Tensor::rand([k, b, sampling.target as i64], (Kind::Float, device));
        let targets = self.iqn_targets(batch, &t_next);
        let (loss, priority) = quantile_huber(&z_taken, &taus, &targets, sampling.kappa);
        let loss = match &batch.weights {
            Some(w) => loss * w.squeeze_dim(2),
            None => loss,
        };
        // Each agent's batch mean, summed: agents' gradients stay their own.
        let total = loss
            .mean_dim([1i64].as_slice(), false, Kind::Float)
            .sum(Kind::Float);
        let mut leaves: Vec<&Tensor> = views.iter().chain(&norms).chain(&embed).collect();
        leaves.extend(&conv);
        let grads = Tensor::run_backward(&[&total], &leaves, false, false);
        let mut outs: Vec<&Tensor> = self
            .params
            .grad_views
            .iter()
            .chain(&self.params.grad_norm)
            .chain(&self.params.grad_iqn)
            .collect();
        if let Some(t) = &self.torso {
            outs.extend(&t.grad);
        }
        for (g, out) in grads.iter().zip(outs) {
            out.detach().copy_(g);
        }
        if let Some(head) = &self.dueling {
            head.mask(&self.params.grad_views[self.params.grad_views.len() - 2]);
        }
        let q = z_taken
            .detach()
            .mean_dim([2i64].as_slice(), true, Kind::Float);
        let shifted = &q - priority.unsqueeze(2);
        (q, shifted, total.detach())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dqn::{Bootstrap, DqnConfig, Munchausen, TargetUpdate};
    use millrace_proto::{DType, NetworkSpec, ObsSpec};
    use tch::Device;

    fn head() -> IqnHead {
        IqnHead {
            embedding: 16,
            quantiles: 32,
        }
    }

    fn mlp(k: usize, layer_norm: bool) -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let mut spec = NetworkSpec::mlp(&obs, &[16, 16], 2, k).unwrap();
        spec.layer_norm = layer_norm;
        spec.iqn = Some(head());
        spec
    }

    fn config() -> DqnConfig {
        DqnConfig {
            lr: 1e-2,
            target: TargetUpdate::Hard { period: 1000 },
            ..DqnConfig::default()
        }
    }

    #[test]
    fn the_quantile_huber_loss_is_the_papers() {
        tch::manual_seed(1);
        let z = Tensor::randn([2, 3, 4], (Kind::Float, Device::Cpu)) * 2.0;
        let taus = Tensor::rand([2, 3, 4], (Kind::Float, Device::Cpu));
        let y = Tensor::randn([2, 3, 5], (Kind::Float, Device::Cpu)) * 2.0;
        let (loss, priority) = quantile_huber(&z, &taus, &y, 1.0);
        let v = |t: &Tensor, idx: &[i64]| t.double_value(idx);
        for k in 0..2 {
            for b in 0..3 {
                let (mut want, mut abs) = (0.0, 0.0);
                for i in 0..4 {
                    let mut row = 0.0;
                    for j in 0..5 {
                        let d = v(&y, &[k, b, j]) - v(&z, &[k, b, i]);
                        let huber = if d.abs() <= 1.0 {
                            0.5 * d * d
                        } else {
                            d.abs() - 0.5
                        };
                        let below = if d < 0.0 { 1.0 } else { 0.0 };
                        row += (v(&taus, &[k, b, i]) - below).abs() * huber;
                        abs += d.abs();
                    }
                    want += row / 5.0;
                }
                assert!((v(&loss, &[k, b]) - want).abs() < 1e-5);
                assert!((v(&priority, &[k, b]) - abs / 20.0).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn the_forward_pass_matches_the_actor_cpu_policy() {
        use millrace_actor::{CnnPolicy, MlpPolicy, Policy};
        for (layer_norm, dueling) in [(false, false), (true, true)] {
            let cfg = DqnConfig {
                dueling,
                ..config()
            };
            let spec = mlp(2, layer_norm);
            let mut dqn = Dqn::new(spec.clone(), cfg, Device::Cpu, 3);
            // Train a little, so that no layer is at its initial values.
            let obs = Tensor::randn([2, 6, 3], (Kind::Float, Device::Cpu));
            let batch = Batch {
                obs2: Tensor::cat(&[&obs, &obs], 1),
                actions: Tensor::zeros([2, 6, 1], (Kind::Int64, Device::Cpu)),
                rewards: Tensor::randn([2, 6, 1], (Kind::Float, Device::Cpu)),
                discounts: Tensor::full([2, 6, 1], 0.9, (Kind::Float, Device::Cpu)),
                weights: None,
            };
            for _ in 0..5 {
                let _ = dqn.update(&batch);
            }
            let want = dqn.q_values(&obs);
            let params = dqn.params(0, 0);
            for agent in 0..2 {
                let mut policy = MlpPolicy::new(dqn.spec().clone(), agent).unwrap();
                policy.load(&params).unwrap();
                let host: Vec<f32> = Vec::try_from(obs.get(agent as i64).view([-1])).unwrap();
                let mut q = vec![0.0f32; 12];
                policy.q_values(&host, &mut q);
                let w: Vec<f32> = Vec::try_from(want.get(agent as i64).view([-1])).unwrap();
                for (a, b) in q.iter().zip(&w) {
                    assert!((a - b).abs() < 1e-4 * b.abs().max(1.0), "{q:?} vs {w:?}");
                }
            }
        }
        // With the MinAtar CNN's torso.
        let image = ObsSpec {
            shape: vec![4, 10, 10],
            dtype: DType::U8,
        };
        let mut spec = NetworkSpec::minatar_cnn(&image, 3).unwrap();
        spec.iqn = Some(head());
        let dqn = Dqn::new(spec.clone(), config(), Device::Cpu, 4);
        let obs = Tensor::randint(256, [1, 5, 4, 10, 10], (Kind::Uint8, Device::Cpu));
        let want: Vec<f32> = Vec::try_from(dqn.q_values(&obs).view([-1])).unwrap();
        let mut policy = CnnPolicy::new(spec).unwrap();
        policy
            .load(&millrace_proto::Params::of_one(0, dqn.online_params()))
            .unwrap();
        let host: Vec<u8> = Vec::try_from(obs.view([-1])).unwrap();
        let mut q = vec![0.0f32; 15];
        policy.q_values(&host, &mut q);
        for (a, b) in q.iter().zip(&want) {
            assert!((a - b).abs() < 1e-4 * b.abs().max(1.0), "{q:?} vs {want:?}");
        }
    }

    /// One state, one action, returns 0 or 4 with equal odds: the low fractions'
    /// quantiles go to 0, the high ones' to 4, and the mean (the Q-value) to 2.
    fn learns_a_two_point_return(bootstrap: Bootstrap) {
        let cfg = DqnConfig {
            bootstrap,
            ..config()
        };
        let mut dqn = Dqn::new(mlp(1, false), cfg, Device::Cpu, 0);
        let b = 64;
        let rewards: Vec<f32> = (0..b).map(|i| if i % 2 == 0 { 0.0 } else { 4.0 }).collect();
        let batch = Batch {
            obs2: Tensor::ones([1, 2 * b, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([1, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::from_slice(&rewards).view([1, b, 1]),
            discounts: Tensor::zeros([1, b, 1], (Kind::Float, Device::Cpu)),
            weights: Some(Tensor::ones([1, b, 1], (Kind::Float, Device::Cpu))),
        };
        tch::manual_seed(5);
        let mut td = Tensor::zeros([1], (Kind::Float, Device::Cpu));
        for _ in 0..1500 {
            td = dqn.update(&batch).td_errors;
        }
        let obs = Tensor::ones([1, 1, 3], (Kind::Float, Device::Cpu));
        let taus = Tensor::from_slice(&[0.1f32, 0.25, 0.75, 0.9]).view([1, 1, 4]);
        let z = dqn.quantiles_of(false, &obs, &taus);
        let at = |i: i64| z.double_value(&[0, 0, i, 0]);
        // A smooth network approximates the step at ½: near 0 and 4 at the ends, past
        // the midpoint's 2 at ¼ and ¾ (a scalar Q-network's "quantiles" would all be 2).
        assert!(at(0).abs() < 0.4 && (at(3) - 4.0).abs() < 0.4, "ends {z}");
        assert!(at(1) < 1.0 && at(2) > 3.0, "quarters {z}");
        let q = dqn.q_values(&obs).double_value(&[0, 0, 0]);
        assert!((q - 2.0).abs() < 0.3, "Q(s, 0) = {q}");
        // The priority is the mean |δ|: about 2 for a return 2 away from half the
        // quantiles.
        let p = td.abs().mean(Kind::Float).double_value(&[]);
        assert!((p - 2.0).abs() < 0.5, "mean |δ| {p}");
        assert_eq!(dqn.take_stats().nonfinite, 0);
    }

    #[test]
    fn iqn_learns_a_two_point_return() {
        learns_a_two_point_return(Bootstrap::Double);
    }

    #[test]
    fn m_iqn_learns_a_two_point_return() {
        // Terminal transitions, one action taken: the Munchausen bonus τ·log π(a|s)
        // goes to 0 as the taken action's value (2) leaves the untaken one's behind.
        learns_a_two_point_return(Bootstrap::Munchausen(Munchausen::default()));
    }

    #[test]
    fn targets_match_hand_computed_ones() {
        // K = 1, B = 2 (obs2: s then s′), N′ = 2 fixed fractions; item 0 continues
        // (discount 0.9), item 1 terminated.
        let obs = Tensor::randn([1, 4, 3], (Kind::Float, Device::Cpu));
        let batch = Batch {
            obs2: obs.shallow_clone(),
            actions: Tensor::from_slice(&[1i64, 0]).view([1, 2, 1]),
            rewards: Tensor::from_slice(&[0.5f32, -1.0]).view([1, 2, 1]),
            discounts: Tensor::from_slice(&[0.9f32, 0.0]).view([1, 2, 1]),
            weights: None,
        };
        let t_next = Tensor::from_slice(&[0.2f32, 0.7, 0.4, 0.9]).view([1, 2, 2]);
        let m = Munchausen::default();
        for bootstrap in [Bootstrap::Double, Bootstrap::Munchausen(m)] {
            let cfg = DqnConfig {
                bootstrap,
                ..config()
            };
            let mut dqn = Dqn::new(mlp(1, false), cfg, Device::Cpu, 9);
            let other = Dqn::new(mlp(1, false), config(), Device::Cpu, 10);
            dqn.params.target.copy_(&other.params.online);
            let y = dqn.iqn_targets(&batch, &t_next);
            // The networks' quantiles at every observation and both items' fractions.
            let both = Tensor::cat(&[&t_next, &t_next], 1);
            let zt = dqn.quantiles_of(true, &obs, &both);
            let zo = dqn.quantiles_of(false, &obs, &both);
            let v = |t: &Tensor, i: i64, j: i64, a: i64| t.double_value(&[0, i, j, a]);
            for item in 0..2i64 {
                let (r, d) = ([0.5, -1.0][item as usize], [0.9, 0.0][item as usize]);
                let next = 2 + item;
                let mean = |t: &Tensor, i: i64, a: i64| (v(t, i, 0, a) + v(t, i, 1, a)) / 2.0;
                for j in 0..2 {
                    let want = match bootstrap {
                        Bootstrap::Double => {
                            let best = if mean(&zo, next, 0) >= mean(&zo, next, 1) {
                                0
                            } else {
                                1
                            };
                            r + d * v(&zt, next, j, best)
                        }
                        Bootstrap::Munchausen(m) => {
                            let log_pi = |i: i64| {
                                let q = [mean(&zt, i, 0), mean(&zt, i, 1)];
                                let top = q[0].max(q[1]);
                                let lse = top / m.tau
                                    + q.iter()
                                        .map(|x| (x / m.tau - top / m.tau).exp())
                                        .sum::<f64>()
                                        .ln();
                                [m.tau * (q[0] / m.tau - lse), m.tau * (q[1] / m.tau - lse)]
                            };
                            let action = [1, 0][item as usize];
                            let bonus = m.alpha * log_pi(item)[action].clamp(m.clip, 0.0);
                            let lp = log_pi(next);
                            let soft: f64 = (0..2)
                                .map(|a| {
                                    (lp[a] / m.tau).exp() * (v(&zt, next, j, a as i64) - lp[a])
                                })
                                .sum();
                            r + bonus + d * soft
                        }
                    };
                    let got = y.double_value(&[0, item, j]);
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{bootstrap:?} item {item}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
