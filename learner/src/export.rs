//! `learner export`: a saved policy as a PyTorch `nn.Sequential` `state_dict`
//! (safetensors) and a JSON file that describes the network, the observation
//! preprocessing and where the parameters came from, so that anyone can rebuild the
//! network and play it (`scripts/play_policy.py` does, in Gymnasium).
//!
//! The MLP `[obs_dim → hidden… → actions]` is `Sequential(Linear, ReLU, …, Linear)`:
//! keys `0.weight`, `0.bias`, `2.weight`, … with weights `[out, in]` (millrace keeps
//! them `[in, out]`, so they are transposed). A convolutional torso comes first,
//! `Sequential(Conv2d, ReLU, Conv2d, ReLU, Conv2d, ReLU, Flatten, Linear, ReLU, Linear)`,
//! its filters already in PyTorch's `[out, in, k, k]`. The IMPALA torso adds
//! `MaxPool2d`, `AdaptiveMaxPool2d` and `residual` modules, each a block `x + body(x)`
//! whose `body` is a `Sequential` of its own (keys `<index>.body.<index>.weight`). A
//! network with LayerNorm has a `LayerNorm` between each hidden `Linear` and its `ReLU`
//! (keys `<index>.weight` for the gain, `<index>.bias`).

use std::path::{Path, PathBuf};

use millrace_proto::{DType, NetworkSpec, TorsoStep};
use serde::Serialize;
use tch::Tensor;

use crate::checkpoint::files::{tensor_err, write_atomic, write_json};
use crate::checkpoint::{load_policy, CheckpointError, SavedPolicy, Which};
use crate::evaluation::EvalRecord;

/// Format name in the JSON, bumped on incompatible changes (2: convolutions' padding,
/// max-pools and residual blocks, for the IMPALA network).
pub const EXPORT_FORMAT: &str = "millrace-policy/2";

/// One module of the `nn.Sequential`, in order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Layer {
    Conv2d {
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        /// Zeros on every side (PyTorch's `padding`).
        padding: usize,
    },
    Relu,
    /// PyTorch's `nn.MaxPool2d(kernel, stride, padding)`.
    MaxPool2d {
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    /// PyTorch's `nn.AdaptiveMaxPool2d(size)`.
    AdaptiveMaxPool2d {
        size: usize,
    },
    /// A residual block, `x + body(x)`; its parameters are `body.<index>.weight` and
    /// `body.<index>.bias` under the block's index.
    Residual {
        body: Vec<Layer>,
    },
    /// IQN's fraction embedding (`--head iqn`): each row `x` becomes `quantiles` rows
    /// `x · ReLU(Linear(embedding → width)(cos(π·i·τ_j)))`, `τ_j = (j + ½)/quantiles`;
    /// its parameters are `linear.weight` and `linear.bias` under its index.
    IqnEmbedding {
        embedding: usize,
        width: usize,
        quantiles: usize,
    },
    /// The mean over each observation's `quantiles` rows: IQN's Q-values.
    QuantileMean {
        quantiles: usize,
    },
    Flatten,
    Linear {
        in_features: usize,
        out_features: usize,
    },
    /// PyTorch's `nn.LayerNorm(normalized_shape, eps)`, with its gain and bias.
    LayerNorm {
        normalized_shape: usize,
        eps: f64,
    },
}

/// How an observation from the environment becomes the network's input.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Preprocessing {
    /// The observation's element type as the environment returns it.
    pub dtype: &'static str,
    /// The observation's shape (`[C, H, W]` for images).
    pub shape: Vec<usize>,
    /// Multiply by this after converting to float32 (1/255 for `uint8` images).
    pub scale: f64,
}

/// Where the exported parameters came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Source {
    pub checkpoint: PathBuf,
    pub which: Which,
    pub params_version: u64,
    pub env_steps: u64,
    pub updates: u64,
    pub eval: Option<EvalRecord>,
    pub confirm: Option<EvalRecord>,
}

/// The JSON beside the safetensors file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Description {
    pub format: &'static str,
    /// The safetensors file holding the `state_dict`.
    pub weights: String,
    pub env_id: String,
    /// For `gym:` ids: the module imported before `gymnasium.make` and its keyword
    /// arguments (JSON), as the run built the environment.
    pub env_module: Option<String>,
    pub env_kwargs: Option<String>,
    pub num_actions: usize,
    pub max_episode_steps: u32,
    pub reward_threshold: Option<f32>,
    pub preprocessing: Preprocessing,
    /// `nn.Sequential` modules, in order; parameter keys are `<index>.weight` and
    /// `<index>.bias` of the `Linear`, `Conv2d` and `LayerNorm` modules.
    pub layers: Vec<Layer>,
    /// How to act: the greedy action, `argmax` over the outputs.
    pub action: &'static str,
    pub source: Source,
}

/// The `nn.Sequential` for `spec`, and the key prefix (`<index>`, or
/// `<index>.body.<index>` inside a residual block) of each parameterised module: the
/// convolutions and the linear layers in order, then the LayerNorms.
pub fn sequential(spec: &NetworkSpec) -> (Vec<Layer>, Vec<String>) {
    // The open blocks, outermost first: each one's layers so far, and its prefix.
    let mut stack: Vec<(Vec<Layer>, String)> = vec![(Vec::new(), String::new())];
    let mut indexed = Vec::new();
    let here = |stack: &[(Vec<Layer>, String)]| {
        let (layers, prefix) = stack.last().expect("the top level stays open");
        format!("{prefix}{}", layers.len())
    };
    for step in spec.torso_plan() {
        let layer = match step {
            TorsoStep::Conv {
                in_channels,
                out_channels,
                kernel,
                stride,
                padding,
                ..
            } => {
                indexed.push(here(&stack));
                Layer::Conv2d {
                    in_channels,
                    out_channels,
                    kernel,
                    stride,
                    padding,
                }
            }
            TorsoStep::Relu => Layer::Relu,
            TorsoStep::MaxPool {
                kernel,
                stride,
                padding,
            } => Layer::MaxPool2d {
                kernel,
                stride,
                padding,
            },
            TorsoStep::AdaptiveMaxPool { size } => Layer::AdaptiveMaxPool2d { size },
            TorsoStep::Save => {
                let prefix = format!("{}.body.", here(&stack));
                stack.push((Vec::new(), prefix));
                continue;
            }
            TorsoStep::AddSaved => {
                let (body, _) = stack.pop().expect("a residual sum follows its save");
                Layer::Residual { body }
            }
        };
        stack
            .last_mut()
            .expect("the top level stays open")
            .0
            .push(layer);
    }
    let (mut layers, _) = stack.pop().expect("the top level stays open");
    if spec.has_torso() {
        layers.push(Layer::Flatten);
    }
    let widths = spec.widths();
    let mut norms = Vec::new();
    let mut iqn = Vec::new();
    for (i, w) in widths.windows(2).enumerate() {
        indexed.push(layers.len().to_string());
        layers.push(Layer::Linear {
            in_features: w[0],
            out_features: w[1],
        });
        if i + 2 < widths.len() {
            if spec.layer_norm {
                norms.push(layers.len().to_string());
                layers.push(Layer::LayerNorm {
                    normalized_shape: w[1],
                    eps: millrace_proto::LAYER_NORM_EPS,
                });
            }
            layers.push(Layer::Relu);
            if let (0, Some(head)) = (i, &spec.iqn) {
                iqn.push(format!("{}.linear", layers.len()));
                layers.push(Layer::IqnEmbedding {
                    embedding: head.embedding,
                    width: w[1],
                    quantiles: head.quantiles,
                });
            }
        }
    }
    if let Some(head) = &spec.iqn {
        layers.push(Layer::QuantileMean {
            quantiles: head.quantiles,
        });
    }
    indexed.extend(norms);
    indexed.extend(iqn);
    (layers, indexed)
}

/// The `state_dict` of agent 0's parameters `flat` (millrace's layout).
pub fn state_dict(spec: &NetworkSpec, flat: &[f32]) -> Vec<(String, Tensor)> {
    let layout = spec.layout();
    let (_, indexed) = sequential(spec);
    let p = layout.len;
    let agent = &flat[..p.min(flat.len())];
    let slice = |offset: usize, len: usize| Tensor::from_slice(&agent[offset..offset + len]);
    let mut out = Vec::new();
    let convs = layout.conv.chunks(2);
    let linears = layout.entries.chunks(2);
    let norms = layout.norm.chunks(2);
    let iqn = layout.iqn.chunks(2);
    for (pair, index) in convs.chain(linears).chain(norms).chain(iqn).zip(indexed) {
        let (w, b) = (&pair[0], &pair[1]);
        let shape: Vec<i64> = w.shape.iter().map(|d| *d as i64).collect();
        let weight = slice(w.offset, w.len).view(shape.as_slice());
        // Linear weights are [in, out] here and [out, in] in PyTorch.
        let weight = if shape.len() == 2 {
            weight.transpose(0, 1).contiguous()
        } else {
            weight
        };
        out.push((format!("{index}.weight"), weight));
        out.push((format!("{index}.bias"), slice(b.offset, b.len)));
    }
    out
}

/// What `export` wrote.
#[derive(Clone, Debug)]
pub struct Exported {
    pub weights: PathBuf,
    pub description: PathBuf,
    pub policy: SavedPolicy,
}

/// The JSON path beside a `.safetensors` path.
pub fn description_path(weights: &Path) -> PathBuf {
    weights.with_extension("json")
}

/// Exports the saved policy `which` (default: solved, else best, else latest) of the
/// checkpoint at `checkpoint` to `out` and its description beside it.
pub fn export(
    checkpoint: &Path,
    which: Option<Which>,
    out: &Path,
) -> Result<Exported, CheckpointError> {
    let policy = load_policy(checkpoint, which)?;
    let spec = &policy.network;
    let tensors = state_dict(spec, &policy.online);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(crate::checkpoint::files::io(dir))?;
    }
    write_atomic(out, |tmp| {
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Tensor::write_safetensors(&named, tmp).map_err(tensor_err(tmp))
    })?;
    let (layers, _) = sequential(spec);
    let env = &policy.env;
    let description = Description {
        format: EXPORT_FORMAT,
        weights: out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        env_id: env.id.clone(),
        env_module: policy.env_config.module.clone(),
        env_kwargs: policy.env_config.kwargs.clone(),
        num_actions: env.num_actions,
        max_episode_steps: env.max_episode_steps,
        reward_threshold: env.reward_threshold,
        preprocessing: Preprocessing {
            dtype: match env.obs.dtype {
                DType::F32 => "float32",
                DType::U8 => "uint8",
            },
            shape: env.obs.shape.clone(),
            scale: match env.obs.dtype {
                DType::F32 => 1.0,
                DType::U8 => 1.0 / 255.0,
            },
        },
        layers,
        action: "argmax",
        source: Source {
            checkpoint: checkpoint.to_path_buf(),
            which: policy.which,
            params_version: policy.params_version,
            env_steps: policy.env_steps,
            updates: policy.updates,
            eval: policy.eval.clone(),
            confirm: policy.confirm.clone(),
        },
    };
    let json = description_path(out);
    write_json(&json, &description)?;
    Ok(Exported {
        weights: out.to_path_buf(),
        description: json,
        policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_core::dqn::{Dqn, DqnConfig};
    use millrace_proto::ObsSpec;
    use tch::{Device, Kind};

    /// Runs the exported `state_dict` as PyTorch's `nn.Sequential` would: `x @ W.T + b`
    /// for a Linear, `conv2d` for a Conv2d, `x + body(x)` for a residual block.
    fn sequential_forward(spec: &NetworkSpec, dict: &[(String, Tensor)], x: &Tensor) -> Tensor {
        run_layers(&sequential(spec).0, "", dict, x)
    }

    fn run_layers(layers: &[Layer], prefix: &str, dict: &[(String, Tensor)], x: &Tensor) -> Tensor {
        let get = |name: String| {
            &dict
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("no {name} in the state_dict"))
                .1
        };
        let mut h = x.shallow_clone();
        for (i, layer) in layers.iter().enumerate() {
            let key = |what: &str| format!("{prefix}{i}.{what}");
            h = match layer {
                Layer::Linear { .. } => h.linear(get(key("weight")), Some(get(key("bias")))),
                Layer::Conv2d {
                    stride, padding, ..
                } => h.conv2d(
                    get(key("weight")),
                    Some(get(key("bias"))),
                    [*stride as i64; 2],
                    [*padding as i64; 2],
                    [1, 1],
                    1,
                ),
                Layer::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                } => h.max_pool2d(
                    [*kernel as i64; 2],
                    [*stride as i64; 2],
                    [*padding as i64; 2],
                    [1, 1],
                    false,
                ),
                Layer::AdaptiveMaxPool2d { size } => h.adaptive_max_pool2d([*size as i64; 2]).0,
                Layer::Residual { body } => {
                    &h + run_layers(body, &format!("{prefix}{i}.body."), dict, &h)
                }
                Layer::LayerNorm {
                    normalized_shape,
                    eps,
                } => h.layer_norm(
                    [*normalized_shape as i64].as_slice(),
                    Some(get(key("weight"))),
                    Some(get(key("bias"))),
                    *eps,
                    false,
                ),
                Layer::Relu => h.relu(),
                Layer::Flatten => h.flatten(1, -1),
                Layer::IqnEmbedding {
                    embedding,
                    quantiles,
                    ..
                } => {
                    let m = *quantiles as i64;
                    let taus = (Tensor::arange(m, (Kind::Float, Device::Cpu)) + 0.5) / m as f64;
                    let i = Tensor::arange(*embedding as i64, (Kind::Float, Device::Cpu));
                    let cos = (taus.unsqueeze(1) * i.unsqueeze(0) * std::f64::consts::PI).cos();
                    let phi = cos
                        .linear(get(key("linear.weight")), Some(get(key("linear.bias"))))
                        .relu();
                    let width = h.size()[1];
                    (h.unsqueeze(1) * phi.unsqueeze(0)).reshape([-1, width])
                }
                Layer::QuantileMean { quantiles } => {
                    let a = h.size()[1];
                    h.reshape([-1, *quantiles as i64, a]).mean_dim(
                        [1i64].as_slice(),
                        false,
                        Kind::Float,
                    )
                }
            };
        }
        h
    }

    #[test]
    fn an_mlp_exports_as_a_sequential_with_the_same_outputs() {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let spec = NetworkSpec::mlp(&obs, &[8, 6], 3, 1).unwrap();
        let dqn = Dqn::new(spec.clone(), DqnConfig::default(), Device::Cpu, 3);
        let dict = state_dict(&spec, &dqn.online_params());
        let names: Vec<&str> = dict.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
        );
        assert_eq!(dict[0].1.size(), [8, 4], "PyTorch's [out, in]");
        let x = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
        let ours = dqn.q_values(&x.unsqueeze(0)).squeeze_dim(0);
        let theirs = sequential_forward(&spec, &dict, &x);
        assert!(ours.allclose(&theirs, 1e-5, 1e-6, false));
    }

    #[test]
    fn layer_norm_exports_between_each_hidden_linear_and_its_relu() {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let mut spec = NetworkSpec::mlp(&obs, &[8, 6], 3, 1).unwrap();
        spec.layer_norm = true;
        let (layers, indexed) = sequential(&spec);
        assert_eq!(indexed, ["0", "3", "6", "1", "4"]);
        assert_eq!(
            layers[1],
            Layer::LayerNorm {
                normalized_shape: 8,
                eps: 1e-5
            }
        );
        let dqn = Dqn::new(spec.clone(), DqnConfig::default(), Device::Cpu, 3);
        let mut flat = dqn.online_params();
        // Gains and biases other than 1 and 0, so that a swapped key would show.
        let norm0 = spec.layout().norm[0].offset;
        for (i, v) in flat[norm0..].iter_mut().enumerate() {
            *v = 0.5 + 0.1 * (i % 7) as f32 - 0.2 * (i % 3) as f32;
        }
        let dict = state_dict(&spec, &flat);
        let names: Vec<&str> = dict.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "0.weight", "0.bias", "3.weight", "3.bias", "6.weight", "6.bias", "1.weight",
                "1.bias", "4.weight", "4.bias"
            ]
        );
        let loaded = Dqn::from_state(
            spec.clone(),
            DqnConfig::default(),
            Device::Cpu,
            millrace_core::dqn::DqnState {
                online: Tensor::from_slice(&flat).view([1, -1]),
                target: Tensor::from_slice(&flat).view([1, -1]),
                adam_m: Tensor::zeros([1, flat.len() as i64], (Kind::Float, Device::Cpu)),
                adam_v: Tensor::zeros([1, flat.len() as i64], (Kind::Float, Device::Cpu)),
                adam_step: 0,
                updates: 0,
            },
        );
        let x = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
        let ours = loaded.q_values(&x.unsqueeze(0)).squeeze_dim(0);
        let theirs = sequential_forward(&spec, &dict, &x);
        assert!(
            ours.allclose(&theirs, 1e-5, 1e-6, false),
            "{ours} vs {theirs}"
        );
    }

    #[test]
    fn a_cnn_exports_with_its_torso_first() {
        let obs = ObsSpec {
            shape: vec![4, 36, 36],
            dtype: DType::U8,
        };
        let spec = NetworkSpec::nature_cnn(&obs, 2).unwrap();
        let (layers, indexed) = sequential(&spec);
        assert_eq!(indexed, ["0", "2", "4", "7", "9"]);
        assert_eq!(layers[6], Layer::Flatten);
        let dqn = Dqn::new(spec.clone(), DqnConfig::default(), Device::Cpu, 3);
        let dict = state_dict(&spec, &dqn.online_params());
        let x = Tensor::randint(256, [3, 4, 36, 36], (Kind::Uint8, Device::Cpu));
        let ours = dqn.q_values(&x.unsqueeze(0)).squeeze_dim(0);
        let theirs = sequential_forward(&spec, &dict, &(x.to_kind(Kind::Float) / 255.0));
        assert!(
            ours.allclose(&theirs, 1e-4, 1e-5, false),
            "{ours} vs {theirs}"
        );
    }

    #[test]
    fn the_impala_network_exports_with_nested_residual_blocks() {
        let obs = ObsSpec {
            shape: vec![4, 20, 20],
            dtype: DType::U8,
        };
        // 20 → 10 → 5 → 3, pooled to 2×2.
        let spec =
            NetworkSpec::impala_cnn(&obs, &millrace_proto::ImpalaTorso::new(1, 2), 3).unwrap();
        let (layers, indexed) = sequential(&spec);
        // Stage one: conv, pool, two blocks; the first block's convolutions are
        // body.1 and body.3 (after its ReLUs).
        assert_eq!(&indexed[..4], ["0", "2.body.1", "2.body.3", "3.body.1"]);
        assert!(matches!(
            layers[1],
            Layer::MaxPool2d {
                kernel: 3,
                stride: 2,
                padding: 1
            }
        ));
        assert!(matches!(&layers[2], Layer::Residual { body } if body.len() == 4));
        assert_eq!(
            layers[layers.len() - 5..layers.len() - 3],
            [Layer::AdaptiveMaxPool2d { size: 2 }, Layer::Flatten]
        );
        let dqn = Dqn::new(spec.clone(), DqnConfig::default(), Device::Cpu, 3);
        let dict = state_dict(&spec, &dqn.online_params());
        assert_eq!(
            dict.len(),
            2 * (15 + 2),
            "every convolution and linear layer"
        );
        let x = Tensor::randint(256, [3, 4, 20, 20], (Kind::Uint8, Device::Cpu));
        let ours = dqn.q_values(&x.unsqueeze(0)).squeeze_dim(0);
        let theirs = sequential_forward(&spec, &dict, &(x.to_kind(Kind::Float) / 255.0));
        assert!(
            ours.allclose(&theirs, 1e-4, 1e-5, false),
            "{ours} vs {theirs}"
        );
        // The JSON's shape of a block.
        let json = serde_json::to_value(&layers[2]).unwrap();
        assert_eq!(json["type"], "residual");
        assert_eq!(json["body"][1]["type"], "conv2d");
        assert_eq!(json["body"][1]["padding"], 1);
    }

    #[test]
    fn an_iqn_head_exports_with_its_embedding_and_quantile_mean() {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let mut spec = NetworkSpec::mlp(&obs, &[8, 6], 3, 1).unwrap();
        spec.layer_norm = true;
        spec.iqn = Some(millrace_proto::IqnHead {
            embedding: 5,
            quantiles: 7,
        });
        let (layers, indexed) = sequential(&spec);
        assert_eq!(
            layers[3],
            Layer::IqnEmbedding {
                embedding: 5,
                width: 8,
                quantiles: 7
            }
        );
        assert_eq!(layers.last(), Some(&Layer::QuantileMean { quantiles: 7 }));
        assert_eq!(indexed.last().map(String::as_str), Some("3.linear"));
        let dqn = Dqn::new(spec.clone(), DqnConfig::default(), Device::Cpu, 3);
        let dict = state_dict(&spec, &dqn.online_params());
        let (_, w) = dict.iter().find(|(n, _)| n == "3.linear.weight").unwrap();
        assert_eq!(w.size(), [8, 5], "PyTorch's Linear(5, 8)");
        let x = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
        let ours = dqn.q_values(&x.unsqueeze(0)).squeeze_dim(0);
        let theirs = sequential_forward(&spec, &dict, &x);
        assert!(
            ours.allclose(&theirs, 1e-4, 1e-5, false),
            "{ours} vs {theirs}"
        );
    }
}
