//! Batched Q-value inference on the CPU.

use millrace_proto::{NetworkSpec, ParamLayout, Params, LAYER_NORM_EPS};

use std::sync::Arc;

use crate::packed::{PackShelf, PackedNet};

/// Batched action-value inference, run by actor and evaluation threads.
///
/// Contract: `q_values` computes `Q(obs)` for a batch in one call (one forward pass for all
/// ready observations, never one per environment) and allocates nothing once warmed up;
/// `load` swaps in a newer parameter snapshot. Implementations are `Send` and owned by one
/// thread; they need not be `Sync`.
pub trait Policy<O = f32>: Send {
    fn num_actions(&self) -> usize;

    /// Version of the loaded parameters; `None` before the first `load`.
    fn version(&self) -> Option<u64>;

    /// Loads a snapshot published by the learner.
    fn load(&mut self, params: &Params) -> Result<(), PolicyError>;

    /// Loads a snapshot as `load` does, sharing its packed form with the other actors
    /// of this process that read the same parameters (see [`PackShelf`]).
    fn load_shared(&mut self, params: &Params, shelf: &PackShelf) -> Result<(), PolicyError> {
        let _ = shelf;
        self.load(params)
    }

    /// Writes `Q[batch, num_actions]` into `q` for `obs[batch, ...]`.
    fn q_values(&mut self, obs: &[O], q: &mut [f32]);
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("parameters have {got} values, the network needs {expected}")]
    WrongSize { expected: usize, got: usize },
    #[error("agent {agent} is not in a population of {population}")]
    NoSuchAgent { agent: usize, population: usize },
    #[error("the network has no convolutional torso")]
    NotConvolutional,
}

/// The MLP Q-network of [`NetworkSpec`] for one agent of a [`Params`] snapshot, its
/// weights packed for the SGEMM ([`crate::gemm`]) once per parameter version
/// ([`PackedNet`], shared with the process's other actors through a [`PackShelf`]): a
/// step's forward pass neither allocates nor repacks.
#[derive(Debug)]
pub struct MlpPolicy {
    spec: NetworkSpec,
    layout: ParamLayout,
    /// `spec.widths()`, computed once: `q_values` runs every actor step.
    widths: Vec<usize>,
    agent: usize,
    /// The loaded version, packed: this policy's own, or shared through a shelf.
    net: Option<Arc<PackedNet>>,
    /// Two activation buffers, ping-ponged between layers.
    scratch: [Vec<f32>; 2],
}

impl MlpPolicy {
    /// A policy for agent `agent` of a population; it has no parameters until `load`
    /// (and gives Q = 0 until then).
    pub fn new(spec: NetworkSpec, agent: usize) -> Result<Self, PolicyError> {
        if agent >= spec.population {
            return Err(PolicyError::NoSuchAgent {
                agent,
                population: spec.population,
            });
        }
        Ok(Self {
            layout: spec.layout(),
            widths: spec.widths(),
            spec,
            agent,
            net: None,
            scratch: [Vec::new(), Vec::new()],
        })
    }

    fn check(&self, params: &Params) -> Result<(), PolicyError> {
        let expected = self.layout.len * self.spec.population;
        if params.data.len() != expected || params.population != self.spec.population {
            return Err(PolicyError::WrongSize {
                expected,
                got: params.data.len(),
            });
        }
        Ok(())
    }

    /// The loaded parameters, packed.
    pub(crate) fn packed(&self) -> Option<&Arc<PackedNet>> {
        self.net.as_ref()
    }
}

/// PyTorch's `LayerNorm` over one row, in place: `(x − mean) / √(var + ε) · gain + bias`
/// with the biased variance, accumulated in f64.
fn layer_norm(row: &mut [f32], gain: &[f32], bias: &[f32]) {
    let n = row.len() as f64;
    let mean = row.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
    let var = row
        .iter()
        .map(|v| (f64::from(*v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let rstd = 1.0 / (var + LAYER_NORM_EPS).sqrt();
    for ((v, g), b) in row.iter_mut().zip(gain).zip(bias) {
        *v = ((f64::from(*v) - mean) * rstd) as f32 * g + b;
    }
}

/// Index of the greedy action in each row of `q[batch, num_actions]` (first maximum).
pub fn argmax_rows(q: &[f32], num_actions: usize, out: &mut [usize]) {
    for (row, a) in q.chunks_exact(num_actions).zip(out.iter_mut()) {
        let mut best = 0;
        for (j, v) in row.iter().enumerate().skip(1) {
            if *v > row[best] {
                best = j;
            }
        }
        *a = best;
    }
}

impl Policy for MlpPolicy {
    fn num_actions(&self) -> usize {
        self.spec.num_actions
    }

    fn version(&self) -> Option<u64> {
        self.net.as_ref().and_then(|net| net.version())
    }

    fn load(&mut self, params: &Params) -> Result<(), PolicyError> {
        self.check(params)?;
        // Packed in place when this policy alone holds its packing.
        if self
            .net
            .as_mut()
            .is_none_or(|net| Arc::get_mut(net).is_none())
        {
            self.net = Some(Arc::default());
        }
        let net = self
            .net
            .as_mut()
            .and_then(Arc::get_mut)
            .expect("a packing of its own");
        net.pack(&self.spec, &self.layout, &self.widths, params, self.agent);
        Ok(())
    }

    fn load_shared(&mut self, params: &Params, shelf: &PackShelf) -> Result<(), PolicyError> {
        self.check(params)?;
        // Let go of the old version first: the shelf may pack the new one over it.
        self.net = None;
        let shape = (&self.spec, &self.layout, &self.widths[..]);
        self.net = Some(shelf.get(shape, params, self.agent));
        Ok(())
    }

    fn q_values(&mut self, obs: &[f32], q: &mut [f32]) {
        let widths = &self.widths;
        let batch = obs.len() / widths[0];
        assert_eq!(obs.len(), batch * widths[0], "obs is not [batch, obs_dim]");
        assert_eq!(
            q.len(),
            batch * self.spec.num_actions,
            "q is not [batch, actions]"
        );
        let Some(net) = &self.net else {
            // No parameters yet: all of them zero.
            q.fill(0.0);
            return;
        };
        let layers = net.dense.len();
        let [mut cur, mut next] = std::mem::take(&mut self.scratch);
        cur.clear();
        cur.extend_from_slice(obs);
        // Rows in flight: one per observation, then with an IQN head one per
        // observation and acting fraction after the first layer.
        let mut rows = batch;
        for l in 0..layers {
            let fan_out = widths[l + 1];
            let bias = &net.biases[l];
            next.clear();
            for _ in 0..rows {
                next.extend_from_slice(bias);
            }
            net.dense[l].mul_add_to(&cur, rows, &mut next);
            if l + 1 < layers {
                if let [gain, bias] = net.norms.get(2 * l..2 * l + 2).unwrap_or_default() {
                    for row in next.chunks_exact_mut(fan_out) {
                        layer_norm(row, gain, bias);
                    }
                }
                for v in &mut next {
                    *v = v.max(0.0);
                }
            }
            std::mem::swap(&mut cur, &mut next);
            if l == 0 && !net.iqn_phi.is_empty() {
                let phi = &net.iqn_phi;
                // ψ(s) times each fraction's embedding: [batch, H₀] -> [batch·m, H₀].
                next.clear();
                for psi in cur.chunks_exact(fan_out).take(batch) {
                    for embedding in phi.chunks_exact(fan_out) {
                        next.extend(psi.iter().zip(embedding).map(|(p, e)| p * e));
                    }
                }
                rows = next.len() / fan_out;
                std::mem::swap(&mut cur, &mut next);
            }
        }
        if rows > batch {
            // The mean over each observation's fractions.
            let m = rows / batch;
            let a = self.spec.num_actions;
            for (out, quantiles) in q.chunks_exact_mut(a).zip(cur.chunks_exact(m * a)) {
                out.fill(0.0);
                for row in quantiles.chunks_exact(a) {
                    for (o, v) in out.iter_mut().zip(row) {
                        *o += v;
                    }
                }
                for o in out.iter_mut() {
                    *o /= m as f32;
                }
            }
            self.scratch = [cur, next];
            return;
        }
        q.copy_from_slice(&cur[..q.len()]);
        self.scratch = [cur, next];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::{DType, ObsSpec};

    fn spec(population: usize) -> NetworkSpec {
        let obs = ObsSpec {
            shape: vec![2],
            dtype: DType::F32,
        };
        NetworkSpec::mlp(&obs, &[3], 2, population).unwrap()
    }

    /// A hand-written forward pass to check the SGEMM path against.
    fn reference(p: &[f32], x: &[f32]) -> [f32; 2] {
        let (w0, b0, w1, b1) = (&p[0..6], &p[6..9], &p[9..15], &p[15..17]);
        let mut h = [0.0f32; 3];
        for j in 0..3 {
            h[j] = (x[0] * w0[j] + x[1] * w0[3 + j] + b0[j]).max(0.0);
        }
        let mut q = [0.0f32; 2];
        for k in 0..2 {
            q[k] = (0..3).map(|j| h[j] * w1[j * 2 + k]).sum::<f32>() + b1[k];
        }
        q
    }

    #[test]
    fn forward_matches_hand_computation_for_each_agent() {
        let spec = spec(2);
        let p = spec.layout().len;
        assert_eq!(p, 17);
        let data: Vec<f32> = (0..2 * p)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
            .collect();
        let params = Params {
            version: 3,
            env_steps: 0,
            updates: 0,
            population: 2,
            data,
        };
        let obs = [0.5, -1.0, 2.0, 0.25, -0.3, 0.7];
        for agent in 0..2 {
            let mut policy = MlpPolicy::new(spec.clone(), agent).unwrap();
            assert_eq!(policy.version(), None);
            policy.load(&params).unwrap();
            assert_eq!(policy.version(), Some(3));
            let mut q = [0.0f32; 6];
            policy.q_values(&obs, &mut q);
            for row in 0..3 {
                let want = reference(params.agent(agent), &obs[row * 2..row * 2 + 2]);
                for k in 0..2 {
                    assert!(
                        (q[row * 2 + k] - want[k]).abs() < 1e-5,
                        "agent {agent} row {row}"
                    );
                }
            }
        }
    }

    #[test]
    fn layer_norm_normalises_each_hidden_row_before_the_relu() {
        let mut spec = spec(1);
        spec.layer_norm = true;
        let layout = spec.layout();
        assert_eq!(layout.len, 17 + 6);
        let mut data: Vec<f32> = (0..layout.len)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0)
            .collect();
        // Gain and bias of the one hidden layer.
        let (gain, bias) = ([1.5f32, 0.5, -1.0], [0.1f32, -0.2, 0.3]);
        data[17..20].copy_from_slice(&gain);
        data[20..23].copy_from_slice(&bias);
        let mut policy = MlpPolicy::new(spec, 0).unwrap();
        policy.load(&Params::of_one(1, data.clone())).unwrap();
        let x = [0.5f32, -1.0];
        let mut q = [0.0f32; 2];
        policy.q_values(&x, &mut q);
        let (w0, b0, w1, b1) = (&data[0..6], &data[6..9], &data[9..15], &data[15..17]);
        let z: Vec<f32> = (0..3)
            .map(|j| x[0] * w0[j] + x[1] * w0[3 + j] + b0[j])
            .collect();
        let mean = z.iter().sum::<f32>() / 3.0;
        let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 3.0;
        let h: Vec<f32> = (0..3)
            .map(|j| ((z[j] - mean) / (var + 1e-5).sqrt() * gain[j] + bias[j]).max(0.0))
            .collect();
        for k in 0..2 {
            let want = (0..3).map(|j| h[j] * w1[j * 2 + k]).sum::<f32>() + b1[k];
            assert!((q[k] - want).abs() < 1e-5, "{q:?} against {want} at {k}");
        }
    }

    #[test]
    fn rejects_mismatched_parameters() {
        let mut policy = MlpPolicy::new(spec(1), 0).unwrap();
        let bad = Params::of_one(1, vec![0.0; 5]);
        assert_eq!(
            policy.load(&bad),
            Err(PolicyError::WrongSize {
                expected: 17,
                got: 5
            })
        );
        assert!(MlpPolicy::new(spec(1), 1).is_err());
    }

    #[test]
    fn argmax_takes_first_maximum() {
        let mut out = [9; 3];
        argmax_rows(&[1.0, 2.0, 3.0, 3.0, 0.0, -1.0], 2, &mut out);
        assert_eq!(out[..3], [1, 0, 0]);
    }
}
