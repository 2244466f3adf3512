//! Environment and network specifications, and the flat parameter layout both the learner
//! (tch, on the device) and the actors (plain Rust, on the CPU) agree on.

use serde::{Deserialize, Serialize};

use crate::iqn::IqnHead;
use crate::torso::{ConvLayer, ImpalaTorso, Torso, TorsoStep, MINATAR_CONV, NATURE_CONV};

/// Element type of an observation column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    F32,
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::U8 => 1,
        }
    }
}

/// Shape and element type of one observation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObsSpec {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl ObsSpec {
    /// Number of elements in one observation.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of one observation row in tensor layout.
    pub fn row_bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// What the learner tells everybody about the environment being trained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvSpec {
    /// Gymnasium id, e.g. `CartPole-v1`.
    pub id: String,
    pub obs: ObsSpec,
    /// Size of the discrete action space.
    pub num_actions: usize,
    /// Time limit (Gymnasium's `max_episode_steps`): reaching it truncates the episode.
    pub max_episode_steps: u32,
    /// Gymnasium's `reward_threshold`, the default target return.
    pub reward_threshold: Option<f32>,
    /// The smallest and largest reward of one step, where the environment fixes them
    /// (the Rust ports): a reported episode return outside what they allow in
    /// `max_episode_steps` steps cannot be true ([`EnvSpec::plausible_return`]).
    #[serde(default)]
    pub reward_range: Option<(f32, f32)>,
    /// Frames stacked along the first axis of each observation (4 for Atari's stack of
    /// 84×84 frames), 1 where observations are not stacks. Replay stores each frame of a
    /// stacked observation once (see [`crate::frames`]).
    #[serde(default = "one")]
    pub frame_stack: usize,
}

fn one() -> usize {
    1
}

impl EnvSpec {
    /// Whether an episode of this environment can return `r`: finite, and within what
    /// [`EnvSpec::reward_range`] allows over at most `max_episode_steps` steps (any
    /// finite return where the range is unknown).
    pub fn plausible_return(&self, r: f32) -> bool {
        let Some((lo, hi)) = self.reward_range else {
            return r.is_finite();
        };
        let steps = self.max_episode_steps as f32;
        // Episodes may be short: 0 is always within reach.
        let (min, max) = ((steps * lo).min(0.0), (steps * hi).max(0.0));
        r.is_finite() && r >= min - 1e-3 * min.abs() && r <= max + 1e-3 * max.abs()
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("network needs a flat observation, got shape {0:?}")]
    NotFlat(Vec<usize>),
    #[error("hidden layer sizes must be positive, got {0:?}")]
    BadHidden(Vec<usize>),
    #[error("population must be at least 1")]
    EmptyPopulation,
    #[error("bad value: {0}")]
    BadValue(String),
    #[error("bad value: {0}")]
    Torso(#[from] crate::torso::TorsoError),
    #[error("bad value: {0}")]
    IqnHead(#[from] crate::iqn::IqnHeadError),
    #[error("{what}: expected {expected} values, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

impl SpecError {
    /// The first of `(what, expected, got)` whose lengths differ, as an error.
    pub fn check_lengths(checks: &[(&'static str, usize, usize)]) -> Result<(), SpecError> {
        match checks.iter().find(|(_, expected, got)| expected != got) {
            Some(&(what, expected, got)) => Err(SpecError::Length {
                what,
                expected,
                got,
            }),
            None => Ok(()),
        }
    }
}

/// Most actions a network may have ([`NetworkSpec::validate`]).
pub const MAX_ACTIONS: usize = 1 << 16;

/// Most parameters a network may hold, all agents together ([`NetworkSpec::validate`]):
/// 64 GiB of `f32`, far past any device.
pub const MAX_PARAMS: usize = 1 << 34;

/// A Q-network for a population of `population` independent agents (stacked
/// parameters, see design.md): an optional convolutional torso (plain convolutions or
/// the IMPALA network's residual stages, see [`crate::torso`]) over `u8` image
/// observations `[C, H, W]` (scaled to `[0, 1]`), flattened in `C, H, W` order, then an
/// MLP `obs_dim -> hidden... -> num_actions` with ReLU between layers, each hidden
/// layer `Linear -> LayerNorm -> ReLU` where `layer_norm` is set (as PQN's, Gallici
/// et al. 2024).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSpec {
    /// Input of the MLP: the observation size, or the torso's flattened output.
    pub obs_dim: usize,
    pub hidden: Vec<usize>,
    pub num_actions: usize,
    /// Number of stacked agents K; every parameter has a leading `[K]` dimension.
    pub population: usize,
    /// `[C, H, W]` of image observations; empty for an MLP on flat observations.
    #[serde(default)]
    pub image: Vec<usize>,
    #[serde(default)]
    pub conv: Vec<ConvLayer>,
    /// A LayerNorm (learned gain and bias, ε [`LAYER_NORM_EPS`]) after each hidden
    /// linear layer, before its ReLU.
    #[serde(default)]
    pub layer_norm: bool,
    /// The IMPALA network's residual torso, instead of `conv`.
    #[serde(default)]
    pub impala: Option<ImpalaTorso>,
    /// An implicit quantile head (IQN, [`crate::iqn`]): the first hidden layer's output
    /// times an embedding of the quantile fraction.
    #[serde(default)]
    pub iqn: Option<IqnHead>,
}

/// The LayerNorm's ε (PyTorch's default).
pub const LAYER_NORM_EPS: f64 = 1e-5;

impl NetworkSpec {
    pub fn mlp(
        obs: &ObsSpec,
        hidden: &[usize],
        num_actions: usize,
        population: usize,
    ) -> Result<Self, SpecError> {
        if obs.shape.len() != 1 {
            return Err(SpecError::NotFlat(obs.shape.clone()));
        }
        if hidden.contains(&0) {
            return Err(SpecError::BadHidden(hidden.to_vec()));
        }
        if population == 0 {
            return Err(SpecError::EmptyPopulation);
        }
        Ok(Self {
            obs_dim: obs.shape[0],
            hidden: hidden.to_vec(),
            num_actions,
            population,
            image: Vec::new(),
            conv: Vec::new(),
            layer_norm: false,
            impala: None,
            iqn: None,
        })
    }

    /// The Nature DQN: [`NATURE_CONV`] over `u8` observations `[C, H, W]` (84×84×4 in
    /// the paper), then a 512-unit hidden layer. One agent (the torso has no population
    /// dimension).
    pub fn nature_cnn(obs: &ObsSpec, num_actions: usize) -> Result<Self, SpecError> {
        Self::cnn(obs, &NATURE_CONV, &[512], num_actions)
    }

    /// The MinAtar DQN (Young & Tian 2019): [`MINATAR_CONV`] over `u8` observations
    /// `[C, 10, 10]`, then a 128-unit hidden layer.
    pub fn minatar_cnn(obs: &ObsSpec, num_actions: usize) -> Result<Self, SpecError> {
        Self::cnn(obs, &MINATAR_CONV, &[128], num_actions)
    }

    /// A convolutional torso `conv` over `u8` observations `[C, H, W]` (scaled to
    /// `[0, 1]`), then an MLP head with `hidden` layers. One agent.
    pub fn cnn(
        obs: &ObsSpec,
        conv: &[ConvLayer],
        hidden: &[usize],
        num_actions: usize,
    ) -> Result<Self, SpecError> {
        Self::with_torso(obs, conv.to_vec(), None, hidden, num_actions)
    }

    /// The IMPALA network (Espeholt et al. 2018): the residual torso `torso` over `u8`
    /// observations `[C, H, W]`, then 256 hidden units. One agent.
    pub fn impala_cnn(
        obs: &ObsSpec,
        torso: &ImpalaTorso,
        num_actions: usize,
    ) -> Result<Self, SpecError> {
        Self::with_torso(obs, Vec::new(), Some(torso.clone()), &[256], num_actions)
    }

    fn with_torso(
        obs: &ObsSpec,
        conv: Vec<ConvLayer>,
        impala: Option<ImpalaTorso>,
        hidden: &[usize],
        num_actions: usize,
    ) -> Result<Self, SpecError> {
        let [c, h, w] = obs.shape[..] else {
            return Err(SpecError::BadValue(format!(
                "a convolutional network needs [C, H, W] observations, got {:?}",
                obs.shape
            )));
        };
        if obs.dtype != DType::U8 {
            return Err(SpecError::BadValue("image observations must be u8".into()));
        }
        if hidden.contains(&0) {
            return Err(SpecError::BadHidden(hidden.to_vec()));
        }
        let mut spec = Self {
            obs_dim: 0,
            hidden: hidden.to_vec(),
            num_actions,
            population: 1,
            image: vec![c, h, w],
            conv,
            layer_norm: false,
            impala,
            iqn: None,
        };
        match spec.torso_features() {
            Some(n) if n > 0 => spec.obs_dim = n,
            _ => {
                return Err(SpecError::BadValue(format!(
                    "{:?} is too small for the torso {:?}",
                    obs.shape,
                    spec.torso_plan()
                )))
            }
        }
        Ok(spec)
    }

    /// The torso this network reads its image with ([`crate::torso`]).
    pub fn torso(&self) -> Torso<'_> {
        Torso {
            image: &self.image,
            conv: &self.conv,
            impala: self.impala.as_ref(),
        }
    }

    /// The torso's steps in order (empty for an MLP on flat observations).
    pub fn torso_plan(&self) -> Vec<TorsoStep> {
        self.torso().plan()
    }

    /// The activations' shape after each step of [`NetworkSpec::torso_plan`] (`None`
    /// from the first step that does not fit on).
    pub fn torso_shapes(&self) -> Vec<Option<(usize, usize, usize)>> {
        self.torso().shapes()
    }

    /// The torso's flattened output size, if it fits the image.
    pub fn torso_features(&self) -> Option<usize> {
        self.torso().features()
    }

    /// Whether the network has a convolutional torso.
    pub fn has_torso(&self) -> bool {
        self.torso().exists()
    }

    /// Checks a spec read from a file or a peer before anything is sized from it: at
    /// least one action and at most [`MAX_ACTIONS`], positive layer widths, kernels and
    /// strides, convolutions that fit the image and give the head's input, and at most
    /// [`MAX_PARAMS`] parameters in all. One line says what is wrong.
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |what: String| Err(SpecError::BadValue(what));
        if self.population == 0 {
            return Err(SpecError::EmptyPopulation);
        }
        if self.num_actions == 0 || self.num_actions > MAX_ACTIONS {
            return bad(format!(
                "{} actions (a network has 1..={MAX_ACTIONS})",
                self.num_actions
            ));
        }
        if self.hidden.contains(&0) {
            return Err(SpecError::BadHidden(self.hidden.clone()));
        }
        if let Some(l) = self
            .conv
            .iter()
            .find(|l| l.kernel == 0 || l.stride == 0 || l.out_channels == 0)
        {
            return bad(format!(
                "a convolution needs a positive kernel, stride and channel count, got {l:?}"
            ));
        }
        self.torso().check(self.obs_dim)?;
        if let Some(head) = &self.iqn {
            head.check()?;
            if self.hidden.is_empty() {
                return bad("an IQN head needs at least one hidden layer".into());
            }
        }
        if !self.has_torso() && self.obs_dim == 0 {
            return bad("a network needs at least one input".into());
        }
        match self
            .checked_param_count()
            .and_then(|p| p.checked_mul(self.population))
        {
            Some(n) if n <= MAX_PARAMS => Ok(()),
            _ => bad(format!(
                "{} agents of {:?} would hold more than {MAX_PARAMS} parameters",
                self.population,
                self.widths()
            )),
        }
    }

    /// Parameters per agent, or `None` if counting them overflows (for specs read from
    /// files or the network, before anything is allocated from them).
    pub fn checked_param_count(&self) -> Option<usize> {
        let mlp = self.widths().windows(2).try_fold(0usize, |acc, w| {
            acc.checked_add(w[0].checked_mul(w[1])?.checked_add(w[1])?)
        })?;
        let iqn = match (&self.iqn, self.hidden.first()) {
            (Some(head), Some(width)) => head.embedding.checked_add(1)?.checked_mul(*width)?,
            _ => 0,
        };
        let norms = if self.layer_norm {
            self.hidden
                .iter()
                .try_fold(0usize, |acc, h| acc.checked_add(h.checked_mul(2)?))?
        } else {
            0
        };
        self.torso_plan()
            .iter()
            .try_fold(
                mlp.checked_add(norms)?.checked_add(iqn)?,
                |acc, step| match *step {
                    TorsoStep::Conv {
                        in_channels,
                        out_channels,
                        kernel,
                        ..
                    } => {
                        let w = out_channels
                            .checked_mul(in_channels)?
                            .checked_mul(kernel)?
                            .checked_mul(kernel)?;
                        acc.checked_add(w)?.checked_add(out_channels)
                    }
                    _ => Some(acc),
                },
            )
    }

    /// `(channels, height, width)` after each convolution (0 where it does not fit).
    pub fn conv_shapes(&self) -> Vec<(usize, usize, usize)> {
        let mut dims = Vec::with_capacity(self.conv.len());
        if let [_, mut h, mut w] = self.image[..] {
            for l in &self.conv {
                // A stride of 0 (a crafted spec) fits nothing rather than dividing by 0.
                let out = |x: usize| {
                    x.checked_sub(l.kernel)
                        .and_then(|d| d.checked_div(l.stride))
                        .map_or(0, |q| q + 1)
                };
                (h, w) = (out(h), out(w));
                dims.push((l.out_channels, h, w));
            }
        }
        dims
    }

    /// Layer widths including input and output: `[obs_dim, hidden..., num_actions]`.
    pub fn widths(&self) -> Vec<usize> {
        let mut w = Vec::with_capacity(self.hidden.len() + 2);
        w.push(self.obs_dim);
        w.extend_from_slice(&self.hidden);
        w.push(self.num_actions);
        w
    }

    pub fn layout(&self) -> ParamLayout {
        let mut layout = ParamLayout::new(&self.widths());
        for step in self.torso_plan() {
            if let TorsoStep::Conv {
                index,
                in_channels,
                out_channels,
                kernel: k,
                ..
            } = step
            {
                let filters = vec![out_channels, in_channels, k, k];
                let entry = layout.entry(format!("conv{index}.w"), filters);
                layout.conv.push(entry);
                let entry = layout.entry(format!("conv{index}.b"), vec![out_channels]);
                layout.conv.push(entry);
            }
        }
        if self.layer_norm {
            for (i, &width) in self.hidden.iter().enumerate() {
                for name in [format!("ln{i}.g"), format!("ln{i}.b")] {
                    let entry = layout.entry(name, vec![width]);
                    layout.norm.push(entry);
                }
            }
        }
        if let (Some(head), Some(&width)) = (&self.iqn, self.hidden.first()) {
            let entry = layout.entry("iqn.w".into(), vec![head.embedding, width]);
            layout.iqn.push(entry);
            let entry = layout.entry("iqn.b".into(), vec![width]);
            layout.iqn.push(entry);
        }
        layout
    }
}

/// One parameter inside an agent's flat parameter vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamEntry {
    pub name: String,
    /// `[in, out]` for a weight (so a layer computes `x @ W + b`), `[out]` for a bias.
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
}

/// The flat layout of one agent's parameters: `w0, b0, w1, b1, ...` (the MLP), then the
/// torso's `conv0.w, conv0.b, ...` if any, then the LayerNorms' `ln0.g, ln0.b, ...`
/// if any, then the IQN embedding's `iqn.w, iqn.b` if any, each row-major.
///
/// The learner keeps all parameters of all agents in one `[K, P]` tensor (one fused
/// optimizer step, one copy to sync the target network, one copy to publish) and slices
/// it by this layout; actors read the same layout out of published bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayout {
    /// The MLP's weights and biases.
    pub entries: Vec<ParamEntry>,
    /// The torso's filters `[out, in, k, k]` and biases `[out]` (PyTorch's layout).
    pub conv: Vec<ParamEntry>,
    /// The LayerNorms' gains and biases `[width]`, one pair per hidden layer (empty
    /// without LayerNorm).
    pub norm: Vec<ParamEntry>,
    /// The IQN head's embedding: weight `[cosines, first hidden width]` and bias
    /// (empty without an IQN head).
    pub iqn: Vec<ParamEntry>,
    /// Parameters per agent, P.
    pub len: usize,
}

impl ParamLayout {
    /// A new entry at the end of the layout (which grows by its size).
    fn entry(&mut self, name: String, shape: Vec<usize>) -> ParamEntry {
        let len = shape.iter().product();
        let entry = ParamEntry {
            name,
            shape,
            offset: self.len,
            len,
        };
        self.len += len;
        entry
    }

    pub fn new(widths: &[usize]) -> Self {
        let mut entries = Vec::new();
        let mut offset = 0;
        for (i, pair) in widths.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            for (name, shape) in [
                (format!("w{i}"), vec![fan_in, fan_out]),
                (format!("b{i}"), vec![fan_out]),
            ] {
                let len = shape.iter().product();
                entries.push(ParamEntry {
                    name,
                    shape,
                    offset,
                    len,
                });
                offset += len;
            }
        }
        Self {
            entries,
            conv: Vec::new(),
            norm: Vec::new(),
            iqn: Vec::new(),
            len: offset,
        }
    }

    /// Number of layers (each a weight and a bias).
    pub fn num_layers(&self) -> usize {
        self.entries.len() / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(n: usize) -> ObsSpec {
        ObsSpec {
            shape: vec![n],
            dtype: DType::F32,
        }
    }

    #[test]
    fn layout_offsets_are_contiguous_and_sized() {
        let spec = NetworkSpec::mlp(&obs(4), &[64, 64], 2, 1).unwrap();
        let layout = spec.layout();
        let names: Vec<_> = layout.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["w0", "b0", "w1", "b1", "w2", "b2"]);
        assert_eq!(layout.len, 4 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2);
        let mut expected = 0;
        for e in &layout.entries {
            assert_eq!(e.offset, expected);
            expected += e.len;
        }
        assert_eq!(layout.num_layers(), 3);
    }

    #[test]
    fn layer_norm_adds_a_gain_and_bias_per_hidden_layer_at_the_end() {
        let mut spec = NetworkSpec::mlp(&obs(4), &[64, 32], 2, 1).unwrap();
        let plain = spec.layout();
        spec.layer_norm = true;
        let layout = spec.layout();
        assert_eq!(
            layout.entries, plain.entries,
            "the MLP's offsets do not move"
        );
        let names: Vec<_> = layout.norm.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["ln0.g", "ln0.b", "ln1.g", "ln1.b"]);
        assert_eq!(layout.norm[0].offset, plain.len);
        assert_eq!(layout.norm[3].shape, [32]);
        assert_eq!(layout.len, plain.len + 2 * (64 + 32));
        assert_eq!(spec.checked_param_count(), Some(layout.len));
        // Old specs (files, checkpoints) have no such field: off.
        let mut json = serde_json::to_value(&spec).unwrap();
        json.as_object_mut().unwrap().remove("layer_norm");
        assert!(
            !serde_json::from_value::<NetworkSpec>(json)
                .unwrap()
                .layer_norm
        );
    }

    #[test]
    fn rejects_bad_networks() {
        let image = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        assert!(matches!(
            NetworkSpec::mlp(&image, &[64], 2, 1),
            Err(SpecError::NotFlat(_))
        ));
        assert!(NetworkSpec::mlp(&obs(4), &[0], 2, 1).is_err());
        assert_eq!(
            NetworkSpec::mlp(&obs(4), &[8], 2, 0),
            Err(SpecError::EmptyPopulation)
        );
    }

    #[test]
    fn crafted_specs_are_refused_before_anything_is_sized_from_them() {
        let image = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        let good = NetworkSpec::nature_cnn(&image, 6).unwrap();
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(
            NetworkSpec::mlp(&obs(4), &[8], 2, 3).unwrap().validate(),
            Ok(())
        );
        // A stride of 0 fits nothing (it used to divide by zero) and is named.
        let mut zero = good.clone();
        zero.conv[1].stride = 0;
        assert!(zero.conv_shapes()[1..]
            .iter()
            .all(|&(_, h, w)| h == 0 && w == 0));
        let e = zero.validate().unwrap_err().to_string();
        assert!(e.contains("positive kernel, stride"), "{e}");
        let mut huge = NetworkSpec::mlp(&obs(4), &[8], 2, 1).unwrap();
        huge.num_actions = 200_000;
        assert!(huge
            .validate()
            .unwrap_err()
            .to_string()
            .contains("200000 actions"));
        huge.num_actions = 0;
        assert!(huge.validate().is_err());
        let mut wide = NetworkSpec::mlp(&obs(4), &[8], 2, 1).unwrap();
        wide.hidden = vec![1 << 20, 1 << 20];
        assert!(wide
            .validate()
            .unwrap_err()
            .to_string()
            .contains("parameters"));
        wide.hidden = vec![usize::MAX / 2, 4];
        assert!(wide.validate().is_err(), "overflow is refused too");
        let mut off = good.clone();
        off.obs_dim += 1;
        assert!(off.validate().unwrap_err().to_string().contains("head's"));
        // Sizes whose product overflows are refused, not wrapped.
        let mut vast = good.clone();
        vast.image = vec![4, usize::MAX / 2, usize::MAX / 2];
        vast.conv[2].out_channels = usize::MAX / 4;
        assert!(vast.validate().is_err());
    }

    #[test]
    fn nature_cnn_shapes_and_layout() {
        let image = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        let spec = NetworkSpec::nature_cnn(&image, 6).unwrap();
        assert_eq!(spec.conv_shapes(), [(32, 20, 20), (64, 9, 9), (64, 7, 7)]);
        assert_eq!(spec.obs_dim, 3136);
        let layout = spec.layout();
        let conv: Vec<_> = layout.conv.iter().map(|e| e.shape.clone()).collect();
        assert_eq!(conv[0], [32, 4, 8, 8]);
        assert_eq!(conv[4], [64, 64, 3, 3]);
        // 8,224 + 32,832 + 36,928 (torso) + 1,606,144 + 3,078 (head) for 6 actions.
        assert_eq!(layout.len, 1_687_206);
        assert_eq!(spec.checked_param_count(), Some(layout.len));
        assert_eq!(layout.conv[0].offset, 3136 * 512 + 512 + 512 * 6 + 6);
        let tiny = ObsSpec {
            shape: vec![4, 20, 20],
            dtype: DType::U8,
        };
        assert!(NetworkSpec::nature_cnn(&tiny, 2).is_err());
        assert!(NetworkSpec::nature_cnn(&obs(4), 2).is_err());
    }

    #[test]
    fn spec_serialises_round_trip() {
        let spec = EnvSpec {
            id: "CartPole-v1".into(),
            obs: obs(4),
            num_actions: 2,
            max_episode_steps: 500,
            reward_threshold: Some(475.0),
            reward_range: None,
            frame_stack: 1,
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<EnvSpec>(&text).unwrap(), spec);
        assert_eq!(spec.obs.row_bytes(), 16);
    }

    #[test]
    fn a_return_is_plausible_within_the_reward_range_over_an_episode() {
        let mut env = EnvSpec {
            id: "CartPole-v1".into(),
            obs: ObsSpec {
                shape: vec![4],
                dtype: DType::F32,
            },
            num_actions: 2,
            max_episode_steps: 500,
            reward_threshold: Some(475.0),
            reward_range: Some((1.0, 1.0)),
            frame_stack: 1,
        };
        for r in [0.0, 9.0, 500.0] {
            assert!(env.plausible_return(r), "{r}");
        }
        for r in [-1.0, 501.0, 1e9, f32::NAN, f32::INFINITY] {
            assert!(!env.plausible_return(r), "{r}");
        }
        env.reward_range = Some((-1.0, 0.0));
        assert!(env.plausible_return(-500.0) && !env.plausible_return(1.0));
        env.reward_range = None;
        assert!(env.plausible_return(1e9) && !env.plausible_return(f32::NAN));
    }
}
