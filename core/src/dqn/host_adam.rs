//! The optimizer step of a population on the CPU in one pass over its parameters.
//!
//! On a GPU the step is a dozen element-wise tensor operations over the flat `[K, P]`
//! tensors (each a kernel launch, all queued without a host sync). On the CPU each of
//! those is a pass over every agent's parameters through memory, and for small networks
//! they cost as much as the gradient itself; here the same step (per-agent gradient-norm
//! clipping, the finite check, Adam with per-agent learning rates) reads the gradient
//! twice and the parameters and moments once.

/// Adam's settings shared by all agents.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
}

/// Adam's bias corrections for an agent's step number t.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bias {
    /// `√(1 − β2ᵗ) / (1 − β1ᵗ)`.
    pub correction: f32,
    /// `√(1 − β2ᵗ)`.
    pub bias2_sqrt: f32,
}

impl Bias {
    /// The corrections of step `t` (counted from 1) with betas `b1`, `b2`.
    pub fn at(t: u64, (b1, b2): (f64, f64)) -> Self {
        // powf on the float count: no overflow however long the run.
        let t = t as f64;
        let bias2_sqrt = (1.0 - b2.powf(t)).sqrt();
        Self {
            correction: (bias2_sqrt / (1.0 - b1.powf(t))) as f32,
            bias2_sqrt: bias2_sqrt as f32,
        }
    }
}

/// One optimizer step for `lr.len()` agents whose flat parameters, moments and
/// gradients are rows of `params.len() / lr.len()` values, and whose TD errors are
/// rows of `td`: each agent's gradient is clipped to its global norm `clip[k]`, then
/// Adam moves it with learning rate `lr[k]`. An agent whose gradient norm or TD errors
/// are not finite is left untouched. `bias` holds each agent's bias corrections (its
/// own step number: agents that joined the population later count fewer steps), or
/// one entry that every agent shares. Returns which agents stepped.
///
/// The same arithmetic as the device path: `p −= lr·√(1−β2ᵗ)/(1−β1ᵗ) · m / (√v +
/// ε·√(1−β2ᵗ))`.
#[allow(clippy::too_many_arguments)]
pub fn step(
    params: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grad: &[f32],
    td: &[f32],
    lr: &[f32],
    clip: &[f32],
    s: Step,
    bias: &[Bias],
) -> Vec<bool> {
    let k = lr.len();
    let p = params.len() / k.max(1);
    let b = td.len() / k.max(1);
    assert!(
        params.len() == k * p && m.len() == k * p && v.len() == k * p && grad.len() == k * p,
        "one row of parameters, moments and gradient per agent"
    );
    assert!(
        bias.len() == 1 || bias.len() == k,
        "one bias correction, or one per agent"
    );
    let (one_b1, one_b2) = (1.0 - s.beta1, 1.0 - s.beta2);
    // Moments of parameters that stopped learning (a dead ReLU's) decay towards 0 and
    // become denormal, which the CPU handles a hundred times slower: flush them.
    let _flush = FlushDenormals::new();
    (0..k)
        .map(|a| {
            let rows = a * p..(a + 1) * p;
            let g = &grad[rows.clone()];
            let norm = sum_of_squares(g).sqrt() as f32;
            let td_sum: f32 = td[a * b..(a + 1) * b].iter().sum();
            if !(norm + td_sum).is_finite() {
                return false;
            }
            let scale = clip[a] / norm.max(clip[a]);
            let bias = bias[a.min(bias.len() - 1)];
            let rate = lr[a] * bias.correction;
            let eps = s.eps * bias.bias2_sqrt;
            // Equal lengths up front: no bounds checks in the loop, which vectorises.
            let (pa, ma, va) = (
                &mut params[rows.clone()],
                &mut m[rows.clone()],
                &mut v[rows],
            );
            let (pa, ma, va, g) = (&mut pa[..p], &mut ma[..p], &mut va[..p], &g[..p]);
            for i in 0..p {
                let gi = g[i] * scale;
                ma[i] += one_b1 * (gi - ma[i]);
                va[i] += one_b2 * (gi * gi - va[i]);
                pa[i] -= rate * ma[i] / (va[i].sqrt() + eps);
            }
            true
        })
        .collect()
}

/// While alive, this thread's floating-point unit flushes denormal results to zero and
/// reads denormal inputs as zero (x86-64 MXCSR's FTZ and DAZ bits, as PyTorch's
/// `set_flush_denormal`); the previous mode comes back on drop. A no-op elsewhere.
struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    previous: u32,
}

impl FlushDenormals {
    #[allow(deprecated)] // the intrinsics' replacement is inline assembly
    fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            const FTZ: u32 = 1 << 15;
            const DAZ: u32 = 1 << 6;
            // SAFETY: reads and sets this thread's SSE control register, restored by
            // `drop` (also when unwinding). Changing the floating-point environment is
            // outside what LLVM assumes (why the intrinsic is deprecated): the code run
            // under it here is plain f32 arithmetic whose only change is that denormal
            // inputs and results become 0, which the optimizer step tolerates by design.
            let previous = unsafe { _mm_getcsr() };
            unsafe { _mm_setcsr(previous | FTZ | DAZ) };
            Self { previous }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Self {}
    }
}

impl Drop for FlushDenormals {
    #[allow(deprecated)]
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: restores the value read in `new`.
        unsafe {
            std::arch::x86_64::_mm_setcsr(self.previous)
        };
    }
}

/// `Σ x²`, in 16 independent f32 lanes (a float sum in one accumulator is a chain of
/// dependent additions that the compiler may not reorder, so it does not vectorise),
/// the lanes added in f64.
fn sum_of_squares(x: &[f32]) -> f64 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let tail: f64 = rest.iter().map(|v| f64::from(v * v)).sum();
    acc.iter().map(|a| f64::from(*a)).sum::<f64>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: Step = Step {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };

    fn bias(t: u64) -> Bias {
        Bias::at(t, (0.9, 0.999))
    }

    #[test]
    fn sum_of_squares_covers_every_lane_and_the_tail() {
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let want: f64 = (0..37).map(|i| f64::from(i * i)).sum();
        assert_eq!(sum_of_squares(&x), want);
        assert_eq!(sum_of_squares(&[]), 0.0);
    }

    #[test]
    fn first_step_moves_each_parameter_by_its_learning_rate() {
        // Adam's first step is lr · sign(g) (the moments' bias corrections cancel).
        let (mut p, mut m, mut v) = (vec![1.0f32; 4], vec![0.0; 4], vec![0.0; 4]);
        let grad = [0.5, -2.0, 3.0, -0.25];
        let ok = step(
            &mut p,
            &mut m,
            &mut v,
            &grad,
            &[0.1, 0.2],
            &[0.1, 0.01],
            &[100.0; 2],
            SETTINGS,
            &[bias(1)],
        );
        assert_eq!(ok, [true, true]);
        for (got, want) in p.iter().zip([0.9, 1.1, 0.99, 1.01]) {
            assert!((got - want).abs() < 1e-5, "{p:?}");
        }
    }

    #[test]
    fn clipping_is_per_agent_and_a_non_finite_agent_is_untouched() {
        let (mut p, mut m, mut v) = (vec![0.0f32; 4], vec![0.0; 4], vec![0.0; 4]);
        // Agent 0's gradient (norm 5) is clipped to 1: m = 0.1 · g / 5.
        let grad = [3.0, 4.0, 1.0, 1.0];
        let ok = step(
            &mut p,
            &mut m,
            &mut v,
            &grad,
            &[0.0, f32::NAN],
            &[0.1; 2],
            &[1.0, 1.0],
            SETTINGS,
            &[bias(1)],
        );
        assert_eq!(ok, [true, false]);
        assert!((m[0] - 0.1 * 0.6).abs() < 1e-6 && (m[1] - 0.1 * 0.8).abs() < 1e-6);
        assert_eq!(
            (&p[2..], &m[2..], &v[2..]),
            (&[0.0f32, 0.0][..], &[0.0f32, 0.0][..], &[0.0f32, 0.0][..])
        );
    }

    #[test]
    fn each_agent_corrects_for_its_own_step_number() {
        // Agent 1 joined later: its step is its first, agent 0's its fourth. Each moves
        // as it would alone with its own step number.
        let grad = [0.5f32, -2.0, 0.5, -2.0];
        let (mut p, mut m, mut v) = (
            vec![1.0f32; 4],
            vec![0.1f32, 0.1, 0.0, 0.0],
            vec![0.01f32, 0.01, 0.0, 0.0],
        );
        let ok = step(
            &mut p,
            &mut m,
            &mut v,
            &grad,
            &[0.0; 2],
            &[0.1; 2],
            &[100.0; 2],
            SETTINGS,
            &[bias(4), bias(1)],
        );
        assert_eq!(ok, [true, true]);
        for (a, t) in [(0, 4), (1, 1)] {
            let (mut p1, mut m1, mut v1) = (
                vec![1.0f32; 2],
                vec![[0.1f32, 0.0][a]; 2],
                vec![[0.01f32, 0.0][a]; 2],
            );
            step(
                &mut p1,
                &mut m1,
                &mut v1,
                &grad[..2],
                &[0.0],
                &[0.1],
                &[100.0],
                SETTINGS,
                &[bias(t)],
            );
            assert_eq!(
                (&p[2 * a..2 * a + 2], &m[2 * a..2 * a + 2]),
                (&p1[..], &m1[..])
            );
        }
        // A first step is lr · sign(g).
        assert!(
            (p[2] - 0.9).abs() < 1e-6 && (p[3] - 1.1).abs() < 1e-6,
            "{p:?}"
        );
    }
}
