//! From an [`EnvConfig`] to running environments: the Rust ports, ale-py's Atari
//! games, or anything Gymnasium knows through the bridge, behind one [`VecEnv`].

use millrace_proto::env::{EnvConfig, Family};
use millrace_proto::EnvSpec;

use super::{make, make_pixels, EnvError, NativeVec, VecEnv, KNOWN_IDS, PIXEL_IDS};

/// Environments of either observation type: `f32` vectors or `u8` images.
pub enum AnyVecEnv {
    Vector(Box<dyn VecEnv<f32>>),
    Pixels(Box<dyn VecEnv<u8>>),
}

impl std::fmt::Debug for AnyVecEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyVecEnv")
            .field("id", &self.spec().id)
            .field("num_envs", &self.num_envs())
            .finish()
    }
}

impl AnyVecEnv {
    pub fn spec(&self) -> &EnvSpec {
        match self {
            Self::Vector(v) => v.spec(),
            Self::Pixels(v) => v.spec(),
        }
    }

    pub fn num_envs(&self) -> usize {
        match self {
            Self::Vector(v) => v.num_envs(),
            Self::Pixels(v) => v.num_envs(),
        }
    }
}

/// Refuses options that the id's family does not take.
fn check_options(cfg: &EnvConfig) -> Result<(), EnvError> {
    let family = cfg.family();
    if family != Family::Gym && (cfg.module.is_some() || cfg.kwargs.is_some()) {
        return Err(EnvError::Options(format!(
            "--env-module and --env-kwargs are for gym: ids, not {}",
            cfg.id
        )));
    }
    if family != Family::Atari && cfg.terminal_on_life_loss {
        return Err(EnvError::Options(format!(
            "--terminal-on-life-loss is for Atari games, not {}",
            cfg.id
        )));
    }
    Ok(())
}

/// Builds `n` environments `cfg.id`, environment `i`'s generator derived from `seed`
/// (episodes still start from [`VecEnv::reset`]'s seeds).
pub fn make_vec(cfg: &EnvConfig, n: usize, seed: u64) -> Result<AnyVecEnv, EnvError> {
    check_options(cfg)?;
    if n == 0 {
        return Err(EnvError::Options(
            "at least one environment is needed".into(),
        ));
    }
    let seeds = (0..n).map(|i| crate::derive_seed(seed, i as u64));
    match cfg.family() {
        Family::Native if PIXEL_IDS.contains(&cfg.id.as_str()) => {
            let envs = seeds
                .map(|s| make_pixels(&cfg.id, s))
                .collect::<Result<_, _>>()?;
            Ok(AnyVecEnv::Pixels(Box::new(NativeVec::new(envs))))
        }
        Family::Native => {
            let envs = seeds.map(|s| make(&cfg.id, s)).collect::<Result<_, _>>()?;
            Ok(AnyVecEnv::Vector(Box::new(NativeVec::new(envs))))
        }
        #[cfg(feature = "gym")]
        Family::Atari => Ok(AnyVecEnv::Pixels(Box::new(super::gym::AtariVec::new(
            cfg, n,
        )?))),
        #[cfg(feature = "gym")]
        Family::Gym => super::gym::GymVec::make(cfg, n),
        #[cfg(not(feature = "gym"))]
        Family::Atari | Family::Gym => Err(EnvError::NoBridge(cfg.id.clone())),
    }
}

/// The spec of `cfg.id` (a bridged environment is built once to read its spaces).
pub fn spec_of(cfg: &EnvConfig) -> Result<EnvSpec, EnvError> {
    check_options(cfg)?;
    if cfg.family() == Family::Native && !PIXEL_IDS.contains(&cfg.id.as_str()) {
        return super::spec(&cfg.id);
    }
    make_vec(cfg, 1, 0).map(|e| e.spec().clone())
}

/// The ids (and id families) this build can run, as an actor announces them.
pub fn capabilities() -> Vec<String> {
    let mut ids: Vec<String> = KNOWN_IDS
        .iter()
        .chain(&PIXEL_IDS)
        .map(|s| s.to_string())
        .collect();
    if cfg!(feature = "gym") {
        ids.push(millrace_proto::env::ANY_GYM.into());
        ids.push(millrace_proto::env::ANY_ATARI.into());
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_build_without_python_and_options_are_checked() {
        let AnyVecEnv::Vector(envs) = make_vec(&EnvConfig::new("CartPole-v1"), 3, 0).unwrap()
        else {
            panic!("CartPole has vector observations");
        };
        assert_eq!(envs.num_envs(), 3);
        assert!(matches!(
            make_vec(&EnvConfig::new("CatchPixels-v0"), 1, 0),
            Ok(AnyVecEnv::Pixels(_))
        ));
        let life = EnvConfig {
            terminal_on_life_loss: true,
            ..EnvConfig::new("CartPole-v1")
        };
        assert!(matches!(make_vec(&life, 1, 0), Err(EnvError::Options(_))));
        assert!(matches!(
            make_vec(&EnvConfig::new("Pong-v5"), 1, 0),
            Err(EnvError::UnknownId(_))
        ));
    }

    #[test]
    fn capabilities_say_whether_the_bridge_is_built() {
        let caps = capabilities();
        assert!(caps.iter().any(|c| c == "CartPole-v1"));
        let bridged = caps.iter().any(|c| c == millrace_proto::env::ANY_GYM);
        assert_eq!(bridged, cfg!(feature = "gym"));
    }

    #[cfg(not(feature = "gym"))]
    #[test]
    fn without_the_bridge_bridged_ids_say_so() {
        for id in ["gym:CartPole-v1", "ALE/Pong-v5"] {
            let err = make_vec(&EnvConfig::new(id), 1, 0).unwrap_err();
            assert_eq!(err, EnvError::NoBridge(id.into()));
            assert!(
                err.to_string().contains("without the `gym` feature"),
                "{err}"
            );
        }
    }
}
