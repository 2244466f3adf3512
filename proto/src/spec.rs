//! Environment and network specifications, and the flat parameter layout both the learner
//! (tch, on the device) and the actors (plain Rust, on the CPU) agree on.

use serde::{Deserialize, Serialize};

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
    #[error("{what}: expected {expected} values, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// A Q-network: an MLP `obs -> hidden... -> num_actions` with ReLU between layers,
/// for a population of `population` independent agents (stacked parameters, see design.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSpec {
    pub obs_dim: usize,
    pub hidden: Vec<usize>,
    pub num_actions: usize,
    /// Number of stacked agents K; every parameter has a leading `[K]` dimension.
    pub population: usize,
}

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
        })
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
        ParamLayout::new(&self.widths())
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

/// The flat layout of one agent's parameters: `w0, b0, w1, b1, ...`, each row-major.
///
/// The learner keeps all parameters of all agents in one `[K, P]` tensor (one fused
/// optimizer step, one copy to sync the target network, one copy to publish) and slices
/// it by this layout; actors read the same layout out of published bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayout {
    pub entries: Vec<ParamEntry>,
    /// Parameters per agent, P.
    pub len: usize,
}

impl ParamLayout {
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
    fn spec_serialises_round_trip() {
        let spec = EnvSpec {
            id: "CartPole-v1".into(),
            obs: obs(4),
            num_actions: 2,
            max_episode_steps: 500,
            reward_threshold: Some(475.0),
        };
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<EnvSpec>(&text).unwrap(), spec);
        assert_eq!(spec.obs.row_bytes(), 16);
    }
}
