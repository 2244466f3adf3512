//! Batched CPU inference for convolutional Q-networks (the Nature, MinAtar and IMPALA
//! networks) over `u8` image observations. The torso is the spec's plan of steps
//! ([`NetworkSpec::torso_plan`], as the learner runs it); each convolution is an im2col
//! followed by one SGEMM with its filters packed once per parameter version
//! ([`crate::gemm`]), in `C, H, W` layout as PyTorch's `conv2d`, and max-pools pad
//! with −∞ as PyTorch's do, so the flattened features match the learner's.

use millrace_proto::{NetworkSpec, Params, TorsoStep};

use crate::gemm::PackedRows;
use crate::packed::{PackShelf, PackedNet};
use crate::policy::{MlpPolicy, Policy, PolicyError};

/// A [`NetworkSpec`] with a convolutional torso, evaluated on the CPU; the MLP head is
/// an [`MlpPolicy`] over the flattened features.
#[derive(Debug)]
pub struct CnnPolicy {
    plan: Vec<TorsoStep>,
    /// `(channels, height, width)` of the input and after each step.
    shapes: Vec<(usize, usize, usize)>,
    /// The head, which also holds the packed filters ([`PackedNet`]).
    head: MlpPolicy,
    /// im2col matrix `[in·k·k, out_h·out_w]` and two activation buffers.
    cols: Vec<f32>,
    act: [Vec<f32>; 2],
    /// Residual blocks' inputs, innermost last; `depth` of them in use.
    saved: Vec<Vec<f32>>,
    features: Vec<f32>,
}

impl CnnPolicy {
    /// # Errors
    /// If `spec` has no torso, or its torso does not fit its images.
    pub fn new(spec: NetworkSpec) -> Result<Self, PolicyError> {
        let [c, h, w] = spec.image[..] else {
            return Err(PolicyError::NotConvolutional);
        };
        if !spec.has_torso() || spec.torso_features() != Some(spec.obs_dim) {
            return Err(PolicyError::NotConvolutional);
        }
        let mut shapes = vec![(c, h, w)];
        shapes.extend(spec.torso_shapes().into_iter().flatten());
        Ok(Self {
            plan: spec.torso_plan(),
            shapes,
            head: MlpPolicy::new(spec, 0)?,
            cols: Vec::new(),
            act: [Vec::new(), Vec::new()],
            saved: Vec::new(),
            features: Vec::new(),
        })
    }

    /// The torso on `m` observations at once (`images` is `[m, C, H, W]`): each
    /// convolution is one im2col over all of them and one SGEMM. Activations are kept
    /// channel-major across the batch (`[C, m, H·W]`), so a step's output is the next
    /// one's input as it stands; the flattened features of each image (`C, H, W`
    /// order, as PyTorch flattens) are appended to `self.features`.
    fn torso(&mut self, net: &PackedNet, images: &[u8], m: usize) {
        let [mut cur, mut next] = std::mem::take(&mut self.act);
        let (c0, h0, w0) = self.shapes[0];
        let plane = h0 * w0;
        cur.clear();
        cur.resize(c0 * m * plane, 0.0);
        for (b, image) in images.chunks_exact(c0 * plane).enumerate() {
            for c in 0..c0 {
                let src = &image[c * plane..(c + 1) * plane];
                let dst = &mut cur[(c * m + b) * plane..][..plane];
                for (d, p) in dst.iter_mut().zip(src) {
                    *d = f32::from(*p) * (1.0 / 255.0);
                }
            }
        }
        let mut depth = 0;
        for (i, step) in self.plan.iter().enumerate() {
            let (input, output) = (self.shapes[i], self.shapes[i + 1]);
            match *step {
                TorsoStep::Conv {
                    index,
                    kernel,
                    stride,
                    padding,
                    ..
                } => {
                    let (filters, bias) = (&net.filters[index], &net.conv_biases[index]);
                    let window = Window {
                        input,
                        output,
                        kernel,
                        stride,
                        padding,
                    };
                    conv(&cur, &mut next, &mut self.cols, m, window, filters, bias);
                    std::mem::swap(&mut cur, &mut next);
                }
                TorsoStep::Relu => {
                    for v in &mut cur {
                        *v = v.max(0.0);
                    }
                }
                TorsoStep::MaxPool {
                    kernel,
                    stride,
                    padding,
                } => {
                    let bins = |o: usize, n: usize| {
                        let lo = (o * stride).saturating_sub(padding);
                        (lo, (o * stride + kernel).saturating_sub(padding).min(n))
                    };
                    max_pool(&cur, &mut next, m, input, output, bins);
                    std::mem::swap(&mut cur, &mut next);
                }
                TorsoStep::AdaptiveMaxPool { size } => {
                    let bins = |o: usize, n: usize| (o * n / size, ((o + 1) * n).div_ceil(size));
                    max_pool(&cur, &mut next, m, input, output, bins);
                    std::mem::swap(&mut cur, &mut next);
                }
                TorsoStep::Save => {
                    if self.saved.len() == depth {
                        self.saved.push(Vec::new());
                    }
                    self.saved[depth].clone_from(&cur);
                    depth += 1;
                }
                TorsoStep::AddSaved => {
                    depth -= 1;
                    for (v, s) in cur.iter_mut().zip(&self.saved[depth]) {
                        *v += s;
                    }
                }
            }
        }
        // [C, m, H·W] -> m rows of [C, H, W].
        let (oc, oh, ow) = *self.shapes.last().expect("input shape");
        let p = oh * ow;
        for b in 0..m {
            for c in 0..oc {
                self.features
                    .extend_from_slice(&cur[(c * m + b) * p..(c * m + b + 1) * p]);
            }
        }
        self.act = [cur, next];
    }
}

/// A convolution's or pool's geometry: `(channels, height, width)` in and out.
#[derive(Clone, Copy)]
struct Window {
    input: (usize, usize, usize),
    output: (usize, usize, usize),
    kernel: usize,
    stride: usize,
    padding: usize,
}

/// One convolution of `m` images `[C, m, H·W]` into `out` (biases added, no ReLU):
/// im2col into `cols` (zeros where the window reaches into the padding), one SGEMM.
fn conv(
    input: &[f32],
    out: &mut Vec<f32>,
    cols: &mut Vec<f32>,
    m: usize,
    g: Window,
    filters: &PackedRows,
    bias: &[f32],
) {
    let ((ic, ih, iw), (oc, oh, ow)) = (g.input, g.output);
    let (k, s, pad) = (g.kernel, g.stride, g.padding);
    let (kk, p) = (ic * k * k, oh * ow);
    let cols_n = m * p;
    cols.resize(kk * cols_n, 0.0);
    for c in 0..ic {
        for ky in 0..k {
            for kx in 0..k {
                let row = &mut cols[((c * k + ky) * k + kx) * cols_n..][..cols_n];
                for b in 0..m {
                    let image = &input[(c * m + b) * ih * iw..][..ih * iw];
                    let dst = &mut row[b * p..(b + 1) * p];
                    for oy in 0..oh {
                        let line = &mut dst[oy * ow..(oy + 1) * ow];
                        if pad == 0 {
                            // Every window lies inside the image.
                            let src = &image[(oy * s + ky) * iw + kx..];
                            for (ox, v) in line.iter_mut().enumerate() {
                                *v = src[ox * s];
                            }
                            continue;
                        }
                        let y = (oy * s + ky).checked_sub(pad).filter(|y| *y < ih);
                        let Some(y) = y else {
                            line.fill(0.0);
                            continue;
                        };
                        let src = &image[y * iw..(y + 1) * iw];
                        for (ox, v) in line.iter_mut().enumerate() {
                            *v = (ox * s + kx)
                                .checked_sub(pad)
                                .and_then(|x| src.get(x))
                                .copied()
                                .unwrap_or(0.0);
                        }
                    }
                }
            }
        }
    }
    out.clear();
    for b in bias {
        out.extend(std::iter::repeat_n(*b, cols_n));
    }
    assert_eq!(filters.shape(), (oc, kk), "filters are not [out, in·k·k]");
    filters.mul_add_to(cols, cols_n, out);
}

/// A max-pool of `m` images `[C, m, H·W]` into `out`: output cell `o` of an axis of
/// length `n` is the max over input cells `bins(o, n)` (a half-open range, never
/// empty for a plan that fits).
fn max_pool(
    input: &[f32],
    out: &mut Vec<f32>,
    m: usize,
    (ic, ih, iw): (usize, usize, usize),
    (_, oh, ow): (usize, usize, usize),
    bins: impl Fn(usize, usize) -> (usize, usize),
) {
    out.clear();
    for plane in input.chunks_exact(ih * iw).take(ic * m) {
        for oy in 0..oh {
            let (y0, y1) = bins(oy, ih);
            for ox in 0..ow {
                let (x0, x1) = bins(ox, iw);
                let mut best = f32::NEG_INFINITY;
                for row in plane[y0 * iw..y1 * iw].chunks_exact(iw) {
                    for v in &row[x0..x1] {
                        best = best.max(*v);
                    }
                }
                out.push(best);
            }
        }
    }
}

/// Images per torso pass: large enough for SGEMM to run at speed, small enough that
/// the im2col matrix stays a few MB (Nature's first layer: 256 × 400 floats an image).
const TORSO_CHUNK: usize = 16;

impl Policy<u8> for CnnPolicy {
    fn num_actions(&self) -> usize {
        Policy::<f32>::num_actions(&self.head)
    }

    fn version(&self) -> Option<u64> {
        self.head.version()
    }

    fn load(&mut self, params: &Params) -> Result<(), PolicyError> {
        self.head.load(params)
    }

    fn load_shared(&mut self, params: &Params, shelf: &PackShelf) -> Result<(), PolicyError> {
        self.head.load_shared(params, shelf)
    }

    fn q_values(&mut self, obs: &[u8], q: &mut [f32]) {
        let (c, h, w) = self.shapes[0];
        let pixels = c * h * w;
        assert_eq!(obs.len() % pixels, 0, "obs is not [batch, C, H, W]");
        assert_eq!(
            q.len(),
            obs.len() / pixels * Policy::<u8>::num_actions(self),
            "q is not [batch, actions]"
        );
        // A count, not a copy: the head keeps its packing while the torso reads it.
        let Some(net) = self.head.packed().cloned() else {
            // No parameters yet: all of them zero.
            q.fill(0.0);
            return;
        };
        self.features.clear();
        for images in obs.chunks(pixels * TORSO_CHUNK) {
            self.torso(&net, images, images.len() / pixels);
        }
        let features = std::mem::take(&mut self.features);
        self.head.q_values(&features, q);
        self.features = features;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::{DType, ObsSpec};

    /// A direct (nested-loop) convolution to check im2col + SGEMM against.
    fn conv_ref(
        x: &[f32],
        (ic, ih, iw): (usize, usize, usize),
        w: &[f32],
        b: &[f32],
        k: usize,
        s: usize,
    ) -> Vec<f32> {
        let oc = b.len();
        let (oh, ow) = ((ih - k) / s + 1, (iw - k) / s + 1);
        let mut out = vec![0.0; oc * oh * ow];
        for o in 0..oc {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = b[o];
                    for c in 0..ic {
                        for ky in 0..k {
                            for kx in 0..k {
                                acc += w[((o * ic + c) * k + ky) * k + kx]
                                    * x[(c * ih + y * s + ky) * iw + xo * s + kx];
                            }
                        }
                    }
                    out[(o * oh + y) * ow + xo] = acc.max(0.0);
                }
            }
        }
        out
    }

    #[test]
    fn torso_matches_direct_convolution() {
        let obs = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        let spec = NetworkSpec::nature_cnn(&obs, 3).unwrap();
        let layout = spec.layout();
        let data: Vec<f32> = (0..layout.len)
            .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.45) * 0.1)
            .collect();
        let mut policy = CnnPolicy::new(spec.clone()).unwrap();
        policy.load(&Params::of_one(1, data.clone())).unwrap();
        let image: Vec<u8> = (0..4 * 84 * 84).map(|i| (i * 31 % 251) as u8).collect();
        let mut q = [0.0f32; 6];
        let two: Vec<u8> = image.iter().chain(image.iter().rev()).copied().collect();
        policy.q_values(&two, &mut q);

        let mut x: Vec<f32> = image.iter().map(|p| f32::from(*p) / 255.0).collect();
        let mut shape = (4, 84, 84);
        for (l, layer) in spec.conv.iter().enumerate() {
            let (we, be) = (&layout.conv[2 * l], &layout.conv[2 * l + 1]);
            x = conv_ref(
                &x,
                shape,
                &data[we.offset..][..we.len],
                &data[be.offset..][..be.len],
                layer.kernel,
                layer.stride,
            );
            shape = spec.conv_shapes()[l];
        }
        assert_eq!(x.len(), 3136);
        let mut head = MlpPolicy::new(spec, 0).unwrap();
        head.load(&Params::of_one(1, data)).unwrap();
        let mut want = [0.0f32; 3];
        head.q_values(&x, &mut want);
        for a in 0..3 {
            assert!(
                (q[a] - want[a]).abs() < 1e-4 * want[a].abs().max(1.0),
                "{q:?} vs {want:?}"
            );
        }
        assert_ne!(
            q[..3],
            q[3..],
            "the second image is a different observation"
        );
    }

    #[test]
    fn a_batch_gives_each_image_what_it_gives_alone() {
        // More images than one torso pass, MinAtar-sized (one convolution) and Nature-sized.
        for (obs, spec) in [
            (
                vec![4, 10, 10],
                NetworkSpec::minatar_cnn as fn(&ObsSpec, usize) -> _,
            ),
            (vec![4, 36, 36], NetworkSpec::nature_cnn),
            (vec![4, 10, 10], |obs: &ObsSpec, actions| {
                NetworkSpec::impala_cnn(obs, &millrace_proto::ImpalaTorso::new(1, 0), actions)
            }),
            (vec![4, 20, 20], |obs: &ObsSpec, actions| {
                NetworkSpec::impala_cnn(obs, &millrace_proto::ImpalaTorso::new(1, 2), actions)
            }),
        ] {
            let obs = ObsSpec {
                shape: obs,
                dtype: DType::U8,
            };
            let spec = spec(&obs, 3).unwrap();
            let data: Vec<f32> = (0..spec.layout().len)
                .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.45) * 0.1)
                .collect();
            let mut policy = CnnPolicy::new(spec).unwrap();
            policy.load(&Params::of_one(1, data)).unwrap();
            let n = TORSO_CHUNK + 5;
            let d = obs.numel();
            let images: Vec<u8> = (0..n * d).map(|i| (i * 31 % 251) as u8).collect();
            let mut batched = vec![0.0f32; n * 3];
            policy.q_values(&images, &mut batched);
            for i in 0..n {
                let mut alone = [0.0f32; 3];
                policy.q_values(&images[i * d..(i + 1) * d], &mut alone);
                assert_eq!(batched[i * 3..(i + 1) * 3], alone, "image {i}");
            }
        }
    }

    #[test]
    fn an_mlp_spec_is_refused() {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let spec = NetworkSpec::mlp(&obs, &[8], 2, 1).unwrap();
        assert_eq!(
            CnnPolicy::new(spec).err(),
            Some(PolicyError::NotConvolutional)
        );
    }
}
