//! How an environment is built, as the learner tells its actors: the id and what a
//! bridged environment needs besides (a module to import, keyword arguments).
//!
//! Ids name three families:
//! - Rust ports of Gymnasium tasks (`CartPole-v1`): a plain Gymnasium id means the port;
//! - Atari games through ale-py's vectorised C++ interface (`ALE/Pong-v5`,
//!   `PongNoFrameskip-v4`), the two conventions Gymnasium and the DQN literature use;
//! - anything registered with Gymnasium, through embedded Python: `gym:<id>`.

use serde::{Deserialize, Serialize};

/// Prefix of ids served by the Gymnasium bridge.
pub const GYM_PREFIX: &str = "gym:";

/// What an actor announces (in its capabilities) to say it runs every `gym:` id.
pub const ANY_GYM: &str = "gym:*";

/// What an actor announces to say it runs every Atari id.
pub const ANY_ATARI: &str = "atari:*";

/// An environment to build.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvConfig {
    /// `CartPole-v1`, `ALE/Pong-v5`, `PongNoFrameskip-v4`, `gym:MinAtar/Breakout-v1`, ...
    pub id: String,
    /// For `gym:` ids: a module imported before `gymnasium.make` (`pkg`, or
    /// `pkg:register_fn` to also call a registration function).
    #[serde(default)]
    pub module: Option<String>,
    /// For `gym:` ids: keyword arguments of `gymnasium.make`, a JSON object.
    #[serde(default)]
    pub kwargs: Option<String>,
    /// Atari: a lost life ends the transition chain (terminal for bootstrapping), as
    /// SB3's `AtariWrapper` and the DQN papers train; episodes and scores still run to
    /// game over.
    #[serde(default)]
    pub terminal_on_life_loss: bool,
}

impl EnvConfig {
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ..Self::default()
        }
    }

    /// The family the id belongs to.
    pub fn family(&self) -> Family {
        family(&self.id)
    }
}

/// Which implementation serves an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// A Rust port (or an id nobody knows: the port registry says so).
    Native,
    /// ale-py's vectorised interface.
    Atari,
    /// Gymnasium through embedded Python.
    Gym,
}

/// `ALE/<Game>-v5` or `<Game>NoFrameskip-v4`: the Atari game and whether it follows
/// Gymnasium's v5 convention (sticky actions, full action set).
pub fn atari_game(id: &str) -> Option<(&str, bool)> {
    let game = |g: &str| !g.is_empty() && g.chars().all(|c| c.is_ascii_alphanumeric());
    if let Some(g) = id.strip_prefix("ALE/").and_then(|r| r.strip_suffix("-v5")) {
        return game(g).then_some((g, true));
    }
    id.strip_suffix("NoFrameskip-v4")
        .filter(|g| game(g))
        .map(|g| (g, false))
}

pub fn family(id: &str) -> Family {
    if id.starts_with(GYM_PREFIX) {
        Family::Gym
    } else if atari_game(id).is_some() {
        Family::Atari
    } else {
        Family::Native
    }
}

/// Whether an actor announcing `capabilities` (ids, or [`ANY_GYM`] / [`ANY_ATARI`])
/// can run `id`.
pub fn supported(capabilities: &[String], id: &str) -> bool {
    let wildcard = match family(id) {
        Family::Gym => Some(ANY_GYM),
        Family::Atari => Some(ANY_ATARI),
        Family::Native => None,
    };
    capabilities
        .iter()
        .any(|c| c == id || wildcard.is_some_and(|w| c == w))
}

/// The Python modules that building `cfg` imports because the configuration names
/// them: its `module` (`pkg`, or the `pkg` of `pkg:register_fn`) and, for a
/// `gym:pkg:Env-v0` id, `pkg` (Gymnasium imports the part before the colon). Native and
/// Atari ids name none; the bridge's own fixed registrations (`minatar.gym` for
/// `MinAtar/…` ids, ale-py) are not chosen by the configuration and are not listed.
pub fn imported_modules(cfg: &EnvConfig) -> Vec<&str> {
    let mut modules = Vec::new();
    if let Some(m) = &cfg.module {
        modules.push(m.split(':').next().unwrap_or(m));
    }
    if let Some((pkg, _)) = cfg
        .id
        .strip_prefix(GYM_PREFIX)
        .and_then(|id| id.split_once(':'))
    {
        modules.push(pkg);
    }
    modules
}

/// Refuses to build `cfg` when it would import a module that `allowed` does not name
/// (a listed package allows its submodules): what a process imports is decided by its
/// own command line, never by a peer or a file alone.
pub fn check_modules_allowed(
    cfg: &EnvConfig,
    allowed: &[String],
    flag: &'static str,
) -> Result<(), ModuleNotAllowed> {
    let covers = |module: &str| {
        allowed.iter().any(|a| {
            module == a
                || module
                    .strip_prefix(a.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    };
    match imported_modules(cfg).into_iter().find(|m| !covers(m)) {
        None => Ok(()),
        Some(m) => Err(ModuleNotAllowed {
            env: cfg.id.clone(),
            module: m.to_string(),
            flag,
        }),
    }
}

/// An environment whose Python module the command line does not allow
/// ([`check_modules_allowed`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{env} would import the Python module {module:?}, which this command line does not allow (add {flag} {module} if you trust it)"
)]
pub struct ModuleNotAllowed {
    pub env: String,
    pub module: String,
    /// The flag that allows it.
    pub flag: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_modules_the_command_line_names_are_imported() {
        let mut cfg = EnvConfig::new("gym:MyPkg/Corridor-v0");
        cfg.module = Some("my_corridor:register".into());
        assert_eq!(imported_modules(&cfg), ["my_corridor"]);
        let flag = "--allow-env-module";
        assert!(check_modules_allowed(&cfg, &[], flag).is_err());
        assert!(check_modules_allowed(&cfg, &["my_corridor".into()], flag).is_ok());
        assert!(check_modules_allowed(&cfg, &["my_corr".into()], flag).is_err());
        // Gymnasium imports `evil` for `gym:evil:Env-v0`.
        let sneaky = EnvConfig::new("gym:evil.sub:Env-v0");
        assert_eq!(imported_modules(&sneaky), ["evil.sub"]);
        let err = check_modules_allowed(&sneaky, &["other".into()], flag)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"evil.sub\"") && err.contains(flag), "{err}");
        assert!(check_modules_allowed(&sneaky, &["evil".into()], flag).is_ok());
        for plain in [
            "CartPole-v1",
            "gym:CartPole-v1",
            "ALE/Pong-v5",
            "gym:MinAtar/Breakout-v1",
        ] {
            assert!(
                imported_modules(&EnvConfig::new(plain)).is_empty(),
                "{plain}"
            );
        }
    }

    #[test]
    fn families() {
        assert_eq!(family("CartPole-v1"), Family::Native);
        assert_eq!(family("gym:CartPole-v1"), Family::Gym);
        assert_eq!(family("gym:ALE/Pong-v5"), Family::Gym);
        assert_eq!(atari_game("ALE/Pong-v5"), Some(("Pong", true)));
        assert_eq!(atari_game("PongNoFrameskip-v4"), Some(("Pong", false)));
        assert_eq!(
            atari_game("ALE/SpaceInvaders-v5"),
            Some(("SpaceInvaders", true))
        );
        assert_eq!(atari_game("ALE/-v5"), None);
        assert_eq!(atari_game("ALE/Po ng-v5"), None);
        assert_eq!(atari_game("NoFrameskip-v4"), None);
        assert_eq!(atari_game("Pong-v4"), None);
    }

    #[test]
    fn capabilities_match_ids_and_families() {
        let native = vec!["CartPole-v1".to_string()];
        let all = vec!["CartPole-v1".into(), ANY_GYM.into(), ANY_ATARI.into()];
        assert!(supported(&native, "CartPole-v1"));
        assert!(!supported(&native, "gym:CartPole-v1"));
        assert!(!supported(&native, "ALE/Pong-v5"));
        assert!(supported(&all, "gym:MinAtar/Breakout-v1"));
        assert!(supported(&all, "PongNoFrameskip-v4"));
        assert!(!supported(&all, "Acrobot-v1"));
    }
}
