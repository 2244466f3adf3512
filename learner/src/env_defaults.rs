//! Per-environment default hyperparameters (`learner/hyperparams.toml`, one file for
//! every environment, as rl-zoo3's `hyperparams/dqn.yml`) and `--preset`'s flags
//! ([`crate::presets`], which outrank them), applied beneath the command line: a flag
//! the user typed always wins, and the effective configuration is printed and saved
//! with the run as ever.
//!
//! The defaults become command-line arguments placed before the user's, for the flags
//! the user did not give, so that they are parsed and checked exactly as typed ones.

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::cli::Args;

/// The file, compiled in: a binary's defaults are the ones it was built with.
pub const HYPERPARAMS: &str = include_str!("../hyperparams.toml");

pub use crate::presets::Flags;

/// The defaults `HYPERPARAMS` gives `env` (empty when it has no table).
pub fn for_env(env: &str) -> Result<Flags, HyperparamsError> {
    let all: toml::Table =
        toml::from_str(HYPERPARAMS).map_err(|e| HyperparamsError::Toml(e.to_string()))?;
    let Some(table) = all.get(env) else {
        return Ok(Flags::new());
    };
    let table = table
        .as_table()
        .ok_or_else(|| HyperparamsError::NotATable(env.into()))?;
    table
        .iter()
        .map(|(k, v)| {
            let value = value(v).map_err(|v| HyperparamsError::Value {
                env: env.into(),
                key: k.clone(),
                value: v.to_string(),
            })?;
            Ok((k.clone(), value))
        })
        .collect()
}

/// What is wrong in `hyperparams.toml` (compiled in: a binary built from a broken
/// file says so at the first run of an environment it names).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HyperparamsError {
    #[error("hyperparams.toml: {0}")]
    Toml(String),
    #[error("hyperparams.toml: [{0:?}] is not a table")]
    NotATable(String),
    #[error("hyperparams.toml: [{env:?}] {key}: unsupported value {value}")]
    Value {
        env: String,
        key: String,
        value: String,
    },
    #[error("hyperparams.toml: [{env:?}] preset: {preset}")]
    Preset {
        env: String,
        preset: crate::presets::UnknownPreset,
    },
}

/// A TOML value as it would be typed after its flag; `Err`: the value (a table, a
/// date) that no flag takes.
fn value(v: &toml::Value) -> Result<String, &toml::Value> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => Ok(items
            .iter()
            .map(value)
            .collect::<Result<Vec<_>, _>>()?
            .join(",")),
        other => Err(other),
    }
}

/// What parsing with defaults applied: the arguments, and the defaults that took
/// effect (those the command line did not override), to print.
#[derive(Debug)]
pub struct Parsed {
    pub args: Args,
    pub applied: Flags,
}

/// Parses `argv` (the program name first) with `defaults` beneath it: each default
/// whose flag the command line does not give is inserted before the user's arguments.
/// A default naming no flag is an error, as is one clap refuses.
pub fn parse_with(argv: &[OsString], defaults: &Flags) -> Result<Parsed, clap::Error> {
    let mut cmd = Args::command();
    let given = cmd.try_get_matches_from_mut(argv)?;
    let mut inserted: Vec<OsString> = Vec::new();
    let mut applied = Flags::new();
    for (flag, v) in defaults {
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
        else {
            return Err(cmd.error(
                clap::error::ErrorKind::UnknownArgument,
                format!("a default names --{flag}, which `learner` does not have"),
            ));
        };
        if given.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        if arg.get_action().takes_values() {
            inserted.push(format!("--{flag}").into());
            inserted.push(v.into());
        } else if v == "true" {
            inserted.push(format!("--{flag}").into());
        } else if v != "false" {
            return Err(cmd.error(
                clap::error::ErrorKind::InvalidValue,
                format!("hyperparams.toml: --{flag} is a switch: true or false, not {v:?}"),
            ));
        }
        applied.insert(flag.clone(), v.clone());
    }
    if inserted.is_empty() {
        return Ok(Parsed {
            args: Args::from_arg_matches(&given)?,
            applied,
        });
    }
    let mut all = vec![argv.first().cloned().unwrap_or_else(|| "learner".into())];
    all.extend(inserted);
    all.extend(argv.iter().skip(1).cloned());
    let matches = Args::command().try_get_matches_from(all)?;
    Ok(Parsed {
        args: Args::from_arg_matches(&matches)?,
        applied,
    })
}

/// The command line with the environment's defaults beneath it (training only: a
/// subcommand's arguments are parsed as given).
pub fn parse(argv: &[OsString]) -> Result<Parsed, clap::Error> {
    let plain = parse_with(argv, &Flags::new())?;
    if plain.args.command.is_some() {
        return Ok(plain);
    }
    let invalid =
        |e: HyperparamsError| Args::command().error(clap::error::ErrorKind::InvalidValue, e);
    let defaults = layered(&plain.args.train.env, plain.args.train.preset).map_err(invalid)?;
    parse_with(argv, &defaults)
}

/// The defaults beneath the command line, lowest first: the preset the environment's
/// table names (`preset = "classic"`), the table's own keys, then the preset the user
/// asked for (`--preset`), each outranking the one before.
pub fn layered(
    env: &str,
    user_preset: Option<crate::presets::Preset>,
) -> Result<Flags, HyperparamsError> {
    let mut table = for_env(env)?;
    let mut defaults = Flags::new();
    if let Some(name) = table.remove("preset") {
        let preset = crate::presets::named(&name).map_err(|preset| HyperparamsError::Preset {
            env: env.into(),
            preset,
        })?;
        defaults.extend(crate::presets::flags(preset));
    }
    defaults.extend(table);
    if let Some(preset) = user_preset {
        defaults.extend(crate::presets::flags(preset));
    }
    Ok(defaults)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        std::iter::once("learner")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn every_table_parses_into_a_valid_configuration() {
        let all: toml::Table = toml::from_str(HYPERPARAMS).unwrap();
        assert!(all.len() >= 2, "Acrobot and MountainCar at least");
        for env in all.keys() {
            let parsed = parse(&argv(&["--cpu", "--env", env])).unwrap();
            assert_eq!(parsed.applied, layered(env, None).unwrap(), "{env}");
            parsed
                .args
                .train
                .into_config()
                .unwrap_or_else(|e| panic!("{env}: {e}"));
        }
    }

    #[test]
    fn defaults_apply_beneath_the_command_line() {
        let p = parse(&argv(&["--cpu", "--env", "Acrobot-v1", "--lr", "0.01"])).unwrap();
        let t = &p.args.train;
        assert_eq!(t.lr, 0.01, "the command line wins");
        assert_eq!(t.batch_size, 128, "the file's");
        assert_eq!(t.hidden, [256, 256], "a list replaced, not appended to");
        assert!(!p.applied.contains_key("lr"));
        assert_eq!(p.applied["batch-size"], "128");
        let p = parse(&argv(&["--cpu", "--env", "Acrobot-v1", "--hidden", "64"])).unwrap();
        assert_eq!(p.args.train.hidden, [64]);
        // An environment without a table: the flags' own defaults.
        let p = parse(&argv(&["--cpu", "--env", "gym:LunarLander-v3"])).unwrap();
        assert!(p.applied.is_empty());
        assert_eq!(p.args.train.lr, 2.3e-3);
    }

    #[test]
    fn a_table_naming_a_preset_gets_it_beneath_its_own_keys() {
        // CartPole-v1's table is the `classic` preset; the command line still wins.
        let p = parse(&argv(&["--cpu", "--batch-size", "64"])).unwrap();
        let t = &p.args.train;
        assert!(t.layer_norm);
        assert_eq!((t.lr, t.lr_final, t.batch_size), (1e-3, Some(5e-5), 64));
        assert_eq!(p.applied["replay"], "prioritized");
        assert!(!p.applied.contains_key("batch-size") && !p.applied.contains_key("preset"));
        let cfg = p.args.train.into_config().unwrap();
        assert!(cfg.replay.priority.is_some());
        // A switch the table's preset sets, turned off by the command line.
        let off = parse(&argv(&["--cpu", "--layer-norm", "false"])).unwrap();
        assert!(!off.args.train.layer_norm);
        // The user's preset outranks the table, and the table's preset.
        let apex = parse(&argv(&["--cpu", "--preset", "apex"])).unwrap();
        assert_eq!(apex.args.train.batch_size, 512);
        assert!(
            apex.args.train.layer_norm,
            "the table's preset, where apex is silent"
        );
        // MinAtar's tables: the `minatar` preset.
        let m = parse(&argv(&["--cpu", "--env", "gym:MinAtar/Breakout-v1"])).unwrap();
        assert_eq!((m.args.train.lr, m.args.train.n_step), (1e-4, 1));
        assert_eq!(
            m.args.train.target,
            millrace_core::dqn::TargetKind::Munchausen
        );
        let cfg = m.args.train.into_config().unwrap();
        assert!(matches!(
            cfg.dqn.bootstrap,
            millrace_core::dqn::Bootstrap::Munchausen(_)
        ));
    }

    #[test]
    fn every_preset_parses_into_a_valid_configuration() {
        use clap::ValueEnum;
        for preset in crate::presets::Preset::value_variants() {
            let name = preset.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(crate::presets::named(&name), Ok(*preset));
            let p = parse(&argv(&[
                "--cpu",
                "--env",
                "gym:CartPole-v1",
                "--preset",
                &name,
            ]))
            .unwrap();
            assert_eq!(p.applied, crate::presets::flags(*preset), "{name}");
            p.args
                .train
                .into_config()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let e = crate::presets::named("rainbow").unwrap_err().to_string();
        assert!(e.contains("rainbow") && e.contains("classic"), "{e}");
    }

    #[test]
    fn a_preset_outranks_the_environments_defaults_and_yields_to_flags() {
        let p = parse(&argv(&[
            "--cpu",
            "--env",
            "Acrobot-v1",
            "--preset",
            "apex",
            "--target-period",
            "100",
        ]))
        .unwrap();
        let t = &p.args.train;
        assert_eq!(t.batch_size, 512, "the preset's, over the file's 128");
        assert_eq!(t.target_period, 100, "the command line's");
        assert_eq!(
            t.hidden,
            [256, 256],
            "the file's, where the preset is silent"
        );
        assert!(t.dueling && t.apex_epsilon);
        // A switch the preset sets, turned off by the command line.
        let off = parse(&argv(&["--cpu", "--preset", "apex", "--dueling", "false"])).unwrap();
        assert!(!off.args.train.dueling && off.args.train.apex_epsilon);
        let on = parse(&argv(&["--cpu", "--dueling", "--seed", "3"])).unwrap();
        assert!(on.args.train.dueling, "a bare switch still means true");
        let cfg = p.args.train.into_config().unwrap();
        assert_eq!(cfg.dqn.optimizer, millrace_core::dqn::Optimizer::Rmsprop);
        assert_eq!(cfg.dqn.lr, 6.25e-5);
        assert_eq!(cfg.replay.priority.unwrap().alpha, 0.6);
        // Every environment's actors get Ape-X's fixed ε, one per environment.
        let eps = cfg.actor(0, 0).env_epsilons.unwrap();
        assert_eq!(eps.len(), cfg.actors.envs_per_actor);
        assert!((eps[0] - 0.4).abs() < 1e-6 && eps[eps.len() - 1] < eps[0]);
    }

    #[test]
    fn defaults_naming_unknown_flags_or_bad_values_are_refused() {
        let mut bad = Flags::new();
        bad.insert("learning-rate".into(), "0.1".into());
        let e = parse_with(&argv(&["--cpu"]), &bad).unwrap_err().to_string();
        assert!(e.contains("--learning-rate"), "{e}");
        let mut bad = Flags::new();
        bad.insert("lr".into(), "fast".into());
        assert!(parse_with(&argv(&["--cpu"]), &bad).is_err());
        let mut switch = Flags::new();
        switch.insert("deterministic".into(), "true".into());
        let p = parse_with(&argv(&["--cpu"]), &switch).unwrap();
        assert!(p.args.train.deterministic);
    }
}
