//! Which Q-network a run trains, picked from the observation space unless a flag says.

use millrace_proto::{DType, EnvSpec, ImpalaTorso, NetworkSpec, SpecError};
use serde::Serialize;

/// `--network`: the architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NetworkChoice {
    /// From the observations: the MLP for vectors, the MinAtar CNN for images smaller
    /// than 36×36 (the Nature torso's smallest input), the Nature CNN otherwise.
    Auto,
    /// An MLP with `--hidden` layers (vector observations).
    Mlp,
    /// The Nature DQN (Mnih et al. 2015): three convolutions, 512 hidden units.
    Nature,
    /// The MinAtar DQN (Young & Tian 2019): one 3×3 convolution, 128 hidden units.
    Minatar,
    /// The IMPALA network (Espeholt et al. 2018): three residual stages of 16, 32 and
    /// 32 channels (times `--impala-width`), 256 hidden units.
    Impala,
}

/// The network for `env`: `choice`, or the one its observations call for, with a
/// LayerNorm in each hidden layer if `layer_norm`; `impala` is the residual torso that
/// `NetworkChoice::Impala` uses.
pub fn build(
    choice: NetworkChoice,
    env: &EnvSpec,
    hidden: &[usize],
    layer_norm: bool,
    impala: &ImpalaTorso,
) -> Result<NetworkSpec, SpecError> {
    let image = env.obs.dtype == DType::U8;
    let choice = match choice {
        NetworkChoice::Auto if !image => NetworkChoice::Mlp,
        NetworkChoice::Auto => match env.obs.shape[..] {
            [_, h, w] if h >= 36 && w >= 36 => NetworkChoice::Nature,
            _ => NetworkChoice::Minatar,
        },
        other => other,
    };
    let spec = match choice {
        NetworkChoice::Mlp if image => Err(SpecError::BadValue(format!(
            "{} has image observations {:?}: use --network nature, minatar or impala",
            env.id, env.obs.shape
        ))),
        NetworkChoice::Mlp | NetworkChoice::Auto => {
            NetworkSpec::mlp(&env.obs, hidden, env.num_actions, 1)
        }
        NetworkChoice::Nature => NetworkSpec::nature_cnn(&env.obs, env.num_actions),
        NetworkChoice::Minatar => NetworkSpec::minatar_cnn(&env.obs, env.num_actions),
        NetworkChoice::Impala => NetworkSpec::impala_cnn(&env.obs, impala, env.num_actions),
    }?;
    Ok(NetworkSpec { layer_norm, ..spec })
}

/// One line for the log: the torso's convolutions, the head's widths, the parameters.
pub fn describe(spec: &NetworkSpec) -> String {
    let conv: Vec<String> = spec
        .conv
        .iter()
        .map(|c| format!("{}x{}x{}/{}", c.out_channels, c.kernel, c.kernel, c.stride))
        .collect();
    let torso = match &spec.impala {
        Some(t) => format!(
            "IMPALA torso {:?} ({} residual blocks a stage{}) over {:?}, then ",
            t.channels,
            t.blocks,
            match spec.torso_plan().last() {
                Some(millrace_proto::TorsoStep::AdaptiveMaxPool { size }) =>
                    format!(", max-pooled to {size}x{size}"),
                _ => String::new(),
            },
            spec.image
        ),
        None if conv.is_empty() => String::new(),
        None => format!("conv [{}] over {:?}, then ", conv.join(", "), spec.image),
    };
    format!(
        "{torso}MLP {:?}{}: {} parameters",
        spec.widths(),
        if spec.layer_norm {
            " with LayerNorm"
        } else {
            ""
        },
        spec.checked_param_count().unwrap_or(0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::ObsSpec;

    fn impala() -> ImpalaTorso {
        ImpalaTorso::new(1, 6)
    }

    fn env(shape: &[usize], dtype: DType) -> EnvSpec {
        EnvSpec {
            id: "test".into(),
            obs: ObsSpec {
                shape: shape.to_vec(),
                dtype,
            },
            num_actions: 3,
            max_episode_steps: 100,
            reward_threshold: None,
            reward_range: None,
            frame_stack: 1,
        }
    }

    #[test]
    fn observations_pick_the_network() {
        let vector = build(
            NetworkChoice::Auto,
            &env(&[4], DType::F32),
            &[64],
            false,
            &impala(),
        )
        .unwrap();
        assert!(vector.conv.is_empty() && vector.hidden == [64] && !vector.layer_norm);
        let normed = build(
            NetworkChoice::Mlp,
            &env(&[4], DType::F32),
            &[64],
            true,
            &impala(),
        )
        .unwrap();
        assert!(normed.layer_norm);
        assert_eq!(
            describe(&normed),
            "MLP [4, 64, 3] with LayerNorm: 643 parameters"
        );
        let atari = build(
            NetworkChoice::Auto,
            &env(&[4, 84, 84], DType::U8),
            &[64],
            false,
            &impala(),
        )
        .unwrap();
        assert_eq!(
            (atari.conv.len(), atari.hidden.clone(), atari.obs_dim),
            (3, vec![512], 3136)
        );
        let minatar = build(
            NetworkChoice::Auto,
            &env(&[4, 10, 10], DType::U8),
            &[64],
            false,
            &impala(),
        )
        .unwrap();
        assert_eq!(
            (minatar.conv.len(), minatar.hidden.clone(), minatar.obs_dim),
            (1, vec![128], 1024)
        );
        assert!(build(
            NetworkChoice::Mlp,
            &env(&[4, 10, 10], DType::U8),
            &[64],
            false,
            &impala()
        )
        .is_err());
        assert!(build(
            NetworkChoice::Nature,
            &env(&[4, 10, 10], DType::U8),
            &[64],
            false,
            &impala()
        )
        .is_err());
        assert!(build(
            NetworkChoice::Minatar,
            &env(&[4], DType::F32),
            &[64],
            false,
            &impala()
        )
        .is_err());
        assert_eq!(
            describe(&minatar),
            "conv [16x3x3/1] over [4, 10, 10], then MLP [1024, 128, 3]: 132179 parameters"
        );
        let atari = build(
            NetworkChoice::Impala,
            &env(&[4, 84, 84], DType::U8),
            &[64],
            false,
            &ImpalaTorso::new(2, 6),
        )
        .unwrap();
        assert_eq!((atari.hidden.clone(), atari.obs_dim), (vec![256], 64 * 36));
        assert!(describe(&atari).starts_with(
            "IMPALA torso [32, 64, 64] (2 residual blocks a stage, max-pooled to 6x6) over [4, 84, 84], then MLP [2304, 256, 3]"
        ));
        assert!(build(
            NetworkChoice::Impala,
            &env(&[4], DType::F32),
            &[64],
            false,
            &impala()
        )
        .is_err());
    }
}
