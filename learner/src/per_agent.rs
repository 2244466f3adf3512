//! The settings a sweep may give each agent of a population, each listed once.
//!
//! An entry of [`SETTINGS`] says everything about one setting: its name (in a sweep
//! file, and its column in `population.csv` and TensorBoard's HParams view), the flag
//! that sets it for every agent, how a sweep's value is read and checked into an
//! agent's values (the range checks live on the core types, which the command line
//! calls too), how the agent's value applies to its configuration, and how it is
//! reported. The sweep parser ([`crate::sweep`]), `population.csv`
//! ([`crate::population_results`]), the HParams view ([`crate::population_board`]) and
//! the presets ([`crate::presets`], through the flags) read this table, so a new
//! per-agent setting is one entry here (and a field where the agent keeps it).
//!
//! The model is ripgrep's `crates/core/flags/defs.rs`: one definition per flag, listed
//! once.

use millrace_actor::EpsilonSchedule;
use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::iqn::IqnSampling;
use millrace_core::dqn::{Munchausen, TargetUpdate};
use millrace_replay::PriorityConfig;

use crate::config::RunConfig;
use crate::population_results::{target_rule, AgentSetup};
use crate::sweep::{Settings, Value};
use crate::tensorboard_hparams::HValue;

/// What a sweep's values are read against: the run's own settings where a per-agent
/// value starts from them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Base {
    /// The run's Munchausen settings, under `--target munchausen`.
    pub munchausen: Option<Munchausen>,
}

/// One agent's values as a sweep sets them: its learner hyperparameters and the rest.
pub struct Values<'a> {
    pub hp: &'a mut AgentHparams,
    pub settings: &'a mut Settings,
}

/// One per-agent setting.
pub struct PerAgent {
    /// Its name in a sweep file, `population.csv` and the HParams view.
    pub name: &'static str,
    /// The learner's flag (without dashes) that sets it for every agent.
    pub flag: &'static str,
    /// Reads and checks a sweep's value into one agent's values; why not, if not.
    set: fn(&Value, &mut Values<'_>, &Base) -> Result<(), String>,
    /// Puts an agent's value (where its sweep gave one) into its configuration.
    apply: fn(&AgentHparams, &Settings, &mut RunConfig),
    /// Its column, or `None` where another entry reports it (`tau` and
    /// `target_period` are one target rule).
    column: Option<Column>,
}

/// How a setting is reported, from an agent's hyperparameters and setup.
struct Column {
    /// Its name in `population.csv` and the HParams view.
    header: &'static str,
    /// The `population.csv` cell (empty where the agent has no such setting).
    csv: fn(&AgentHparams, &AgentSetup) -> String,
    /// The HParams value; `None` where the run has no such setting (then no agent of
    /// it has the column).
    hparam: fn(&AgentHparams, &AgentSetup) -> Option<HValue>,
}

impl PerAgent {
    /// Reads and checks a sweep's `value` for this setting into `values`.
    pub fn set(&self, value: &Value, values: &mut Values<'_>, base: &Base) -> Result<(), String> {
        (self.set)(value, values, base)
    }

    /// The name of the column this setting reports under, if it has its own.
    pub fn column_name(&self) -> Option<&'static str> {
        self.column.as_ref().map(|c| c.header)
    }
}

/// The setting a sweep calls `name`, if there is one.
pub fn named(name: &str) -> Option<&'static PerAgent> {
    SETTINGS.iter().copied().find(|s| s.name == name)
}

/// An agent's configuration with every setting its sweep gave it (its seed apart).
pub fn apply(hp: &AgentHparams, settings: &Settings, cfg: &mut RunConfig) {
    for s in SETTINGS {
        (s.apply)(hp, settings, cfg);
    }
}

/// The columns of `population.csv` for the settings, in the table's order.
pub fn csv_header() -> Vec<&'static str> {
    SETTINGS.iter().filter_map(|s| s.column_name()).collect()
}

/// An agent's `population.csv` cells for the settings, in [`csv_header`]'s order.
pub fn csv_cells(hp: &AgentHparams, setup: &AgentSetup) -> Vec<String> {
    SETTINGS
        .iter()
        .filter_map(|s| s.column.as_ref().map(|c| (c.csv)(hp, setup)))
        .collect()
}

/// An agent's settings as HParams, in the table's order; a setting the run does not
/// have is left out.
pub fn hparams(hp: &AgentHparams, setup: &AgentSetup) -> Vec<(&'static str, HValue)> {
    SETTINGS
        .iter()
        .filter_map(|s| {
            let c = s.column.as_ref()?;
            Some((c.header, (c.hparam)(hp, setup)?))
        })
        .collect()
}

/// A whole number in `lo..=hi`, if `v` is one.
fn whole(v: f64, lo: u64, hi: u64) -> Option<u64> {
    (v.fract() == 0.0 && v >= lo as f64 && v <= hi as f64).then_some(v as u64)
}

/// The number a setting other than `hidden` takes.
fn number(value: &Value) -> Result<f64, String> {
    match value {
        Value::Number(v) => Ok(*v),
        Value::List(_) => Err("must be a number, not a list".into()),
    }
}

fn positive(value: &Value) -> Result<f64, String> {
    let v = number(value)?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err("must be positive".into())
    }
}

fn probability(value: &Value) -> Result<f64, String> {
    let v = number(value)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be in [0, 1]".into())
    }
}

/// A number as HParams holds it.
fn n(x: f64) -> Option<HValue> {
    Some(HValue::Number(x))
}

/// An f32 setting as the f64 its decimal form reads as (0.95, not 0.949999988).
fn decimal(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// An agent's Munchausen setting: its own, checked on the core type; `needs
/// --target munchausen` without the run's.
fn munchausen(
    values: &mut Values<'_>,
    base: &Base,
    change: impl FnOnce(&mut Munchausen),
) -> Result<(), String> {
    let run = base.munchausen.ok_or("needs --target munchausen")?;
    let mut m = values.hp.munchausen.unwrap_or(run);
    change(&mut m);
    values.hp.munchausen =
        Some(Munchausen::new(m.tau, m.alpha, m.clip).map_err(|e| e.to_string())?);
    Ok(())
}

/// A count of IQN fractions, checked on the core type.
fn iqn_count(value: &Value, which: &'static str) -> Result<usize, String> {
    let count = whole(number(value)?, 0, u64::MAX).ok_or("must be a whole number")?;
    IqnSampling::checked_count(usize::try_from(count).unwrap_or(usize::MAX), which)
        .map_err(|e| e.to_string())
}

/// The ε schedule with one of its parts replaced (a constant ε becomes a linear one).
fn epsilon_part(cfg: &mut RunConfig, part: Option<f64>, which: usize) {
    let Some(v) = part else {
        return;
    };
    let (mut start, mut end, mut steps) = cfg.actors.epsilon.as_linear();
    match which {
        0 => start = v as f32,
        1 => end = v as f32,
        _ => steps = v as u64,
    }
    cfg.actors.epsilon = EpsilonSchedule::Linear { start, end, steps };
}

pub const LR: PerAgent = PerAgent {
    name: "lr",
    flag: "lr",
    set: |v, a, _| {
        a.hp.lr = positive(v)?;
        Ok(())
    },
    apply: |hp, _, cfg| cfg.dqn.lr = hp.lr,
    column: Some(Column {
        header: "lr",
        csv: |hp, _| hp.lr.to_string(),
        hparam: |hp, _| n(hp.lr),
    }),
};

pub const MAX_GRAD_NORM: PerAgent = PerAgent {
    name: "max_grad_norm",
    flag: "max-grad-norm",
    set: |v, a, _| {
        a.hp.max_grad_norm = positive(v)?;
        Ok(())
    },
    apply: |hp, _, cfg| cfg.dqn.max_grad_norm = hp.max_grad_norm,
    column: Some(Column {
        header: "max_grad_norm",
        csv: |hp, _| hp.max_grad_norm.to_string(),
        hparam: |hp, _| n(hp.max_grad_norm),
    }),
};

/// A hard copy of the target network every so many updates; reported with [`TAU`]
/// as one rule, `target_update`.
pub const TARGET_PERIOD: PerAgent = PerAgent {
    name: "target_period",
    flag: "target-period",
    set: |v, a, _| {
        let period =
            whole(number(v)?, 1, 1 << 40).ok_or("must be a whole number of updates, at least 1")?;
        a.hp.target = TargetUpdate::Hard { period };
        Ok(())
    },
    apply: |hp, _, cfg| cfg.dqn.target = hp.target,
    column: Some(Column {
        header: "target_update",
        csv: |hp, _| target_rule(&hp.target),
        hparam: |hp, _| Some(HValue::Text(target_rule(&hp.target))),
    }),
};

/// Polyak averaging of the target network; its column is [`TARGET_PERIOD`]'s.
pub const TAU: PerAgent = PerAgent {
    name: "tau",
    flag: "tau",
    set: |v, a, _| {
        let tau = number(v)?;
        if !(tau > 0.0 && tau <= 1.0) {
            return Err("must be in (0, 1]".into());
        }
        a.hp.target = TargetUpdate::Polyak { tau };
        Ok(())
    },
    apply: |hp, _, cfg| cfg.dqn.target = hp.target,
    column: None,
};

pub const GAMMA: PerAgent = PerAgent {
    name: "gamma",
    flag: "gamma",
    set: |v, a, _| {
        a.settings.gamma = Some(probability(v)? as f32);
        Ok(())
    },
    apply: |_, s, cfg| cfg.actors.gamma = s.gamma.unwrap_or(cfg.actors.gamma),
    column: Some(Column {
        header: "gamma",
        csv: |_, setup| setup.gamma.to_string(),
        hparam: |_, setup| n(decimal(setup.gamma)),
    }),
};

pub const N_STEP: PerAgent = PerAgent {
    name: "n_step",
    flag: "n-step",
    set: |v, a, _| {
        let steps = whole(number(v)?, 1, 100).ok_or("must be a whole number from 1 to 100")?;
        a.settings.n_step = Some(steps as usize);
        Ok(())
    },
    apply: |_, s, cfg| cfg.actors.n_step = s.n_step.unwrap_or(cfg.actors.n_step),
    column: Some(Column {
        header: "n_step",
        csv: |_, setup| setup.n_step.to_string(),
        hparam: |_, setup| n(setup.n_step as f64),
    }),
};

pub const EPS_START: PerAgent = PerAgent {
    name: "eps_start",
    flag: "eps-start",
    set: |v, a, _| {
        a.settings.eps_start = Some(probability(v)? as f32);
        Ok(())
    },
    apply: |_, s, cfg| epsilon_part(cfg, s.eps_start.map(f64::from), 0),
    column: Some(Column {
        header: "eps_start",
        csv: |_, setup| setup.epsilon.as_linear().0.to_string(),
        hparam: |_, setup| n(decimal(setup.epsilon.as_linear().0)),
    }),
};

pub const EPS_END: PerAgent = PerAgent {
    name: "eps_end",
    flag: "eps-end",
    set: |v, a, _| {
        a.settings.eps_end = Some(probability(v)? as f32);
        Ok(())
    },
    apply: |_, s, cfg| epsilon_part(cfg, s.eps_end.map(f64::from), 1),
    column: Some(Column {
        header: "eps_end",
        csv: |_, setup| setup.epsilon.as_linear().1.to_string(),
        hparam: |_, setup| n(decimal(setup.epsilon.as_linear().1)),
    }),
};

pub const EPS_DECAY_STEPS: PerAgent = PerAgent {
    name: "eps_decay_steps",
    flag: "eps-decay-steps",
    set: |v, a, _| {
        let steps = whole(number(v)?, 0, 1 << 40).ok_or("must be a whole number of env steps")?;
        a.settings.eps_decay_steps = Some(steps);
        Ok(())
    },
    apply: |_, s, cfg| epsilon_part(cfg, s.eps_decay_steps.map(|v| v as f64), 2),
    column: Some(Column {
        header: "eps_decay_steps",
        csv: |_, setup| setup.epsilon.as_linear().2.to_string(),
        hparam: |_, setup| n(setup.epsilon.as_linear().2 as f64),
    }),
};

pub const BATCH_SIZE: PerAgent = PerAgent {
    name: "batch_size",
    flag: "batch-size",
    set: |v, a, _| {
        let size = whole(number(v)?, 1, 1 << 16).ok_or("must be a whole number from 1 to 65536")?;
        a.settings.batch_size = Some(size as usize);
        Ok(())
    },
    apply: |_, s, cfg| cfg.batch_size = s.batch_size.unwrap_or(cfg.batch_size),
    column: Some(Column {
        header: "batch_size",
        csv: |_, setup| setup.batch_size.to_string(),
        hparam: |_, setup| n(setup.batch_size as f64),
    }),
};

pub const HIDDEN: PerAgent = PerAgent {
    name: "hidden",
    flag: "hidden",
    set: |v, a, _| {
        let Value::List(sizes) = v else {
            return Err("must be a list of layer sizes, e.g. [64, 64]".into());
        };
        let sizes: Option<Vec<usize>> = sizes
            .iter()
            .map(|x| whole(*x, 1, 1 << 16).map(|x| x as usize))
            .collect();
        match sizes {
            Some(sizes) if (1..=8).contains(&sizes.len()) => {
                a.settings.hidden = Some(sizes);
                Ok(())
            }
            _ => Err("must be 1 to 8 layer sizes, each a whole number from 1 to 65536".into()),
        }
    },
    apply: |_, s, cfg| {
        if let Some(hidden) = &s.hidden {
            cfg.hidden.clone_from(hidden);
        }
    },
    column: Some(Column {
        header: "hidden",
        csv: |_, setup| hidden_text(&setup.hidden),
        hparam: |_, setup| Some(HValue::Text(hidden_text(&setup.hidden))),
    }),
};

fn hidden_text(hidden: &[usize]) -> String {
    let sizes: Vec<String> = hidden.iter().map(usize::to_string).collect();
    sizes.join("x")
}

pub const SAMPLES_PER_INSERT: PerAgent = PerAgent {
    name: "samples_per_insert",
    flag: "samples-per-insert",
    set: |v, a, _| {
        a.settings.samples_per_insert = Some(positive(v)?);
        Ok(())
    },
    apply: |_, s, cfg| {
        cfg.replay.samples_per_insert = s
            .samples_per_insert
            .unwrap_or(cfg.replay.samples_per_insert);
    },
    column: Some(Column {
        header: "samples_per_insert",
        csv: |_, setup| setup.samples_per_insert.to_string(),
        hparam: |_, setup| n(setup.samples_per_insert),
    }),
};

/// Munchausen's τ, α and clip: the CSV has an agent's own (empty for the run's
/// `--munchausen-*`), the HParams view its own or the run's, under `--target
/// munchausen`.
pub const MUNCHAUSEN_TAU: PerAgent = PerAgent {
    name: "munchausen_tau",
    flag: "munchausen-tau",
    set: |v, a, base| {
        let tau = number(v)?;
        munchausen(a, base, |m| m.tau = tau)
    },
    apply: |_, _, _| {},
    column: Some(Column {
        header: "munchausen_tau",
        csv: |hp, _| hp.munchausen.map_or(String::new(), |m| m.tau.to_string()),
        hparam: |hp, setup| hp.munchausen.or(setup.munchausen).and_then(|m| n(m.tau)),
    }),
};

pub const MUNCHAUSEN_ALPHA: PerAgent = PerAgent {
    name: "munchausen_alpha",
    flag: "munchausen-alpha",
    set: |v, a, base| {
        let alpha = number(v)?;
        munchausen(a, base, |m| m.alpha = alpha)
    },
    apply: |_, _, _| {},
    column: Some(Column {
        header: "munchausen_alpha",
        csv: |hp, _| hp.munchausen.map_or(String::new(), |m| m.alpha.to_string()),
        hparam: |hp, setup| hp.munchausen.or(setup.munchausen).and_then(|m| n(m.alpha)),
    }),
};

pub const MUNCHAUSEN_CLIP: PerAgent = PerAgent {
    name: "munchausen_clip",
    flag: "munchausen-clip",
    set: |v, a, base| {
        let clip = number(v)?;
        munchausen(a, base, |m| m.clip = clip)
    },
    apply: |_, _, _| {},
    column: Some(Column {
        header: "munchausen_clip",
        csv: |hp, _| hp.munchausen.map_or(String::new(), |m| m.clip.to_string()),
        hparam: |hp, setup| hp.munchausen.or(setup.munchausen).and_then(|m| n(m.clip)),
    }),
};

/// The IQN head's sampled fractions, N and N′ (with `--head iqn`).
pub const IQN_TAUS: PerAgent = PerAgent {
    name: "iqn_taus",
    flag: "iqn-taus",
    set: |v, a, _| {
        a.settings.iqn_taus = Some(iqn_count(v, "online")?);
        Ok(())
    },
    apply: |_, s, cfg| cfg.dqn.iqn.online = s.iqn_taus.unwrap_or(cfg.dqn.iqn.online),
    column: Some(Column {
        header: "iqn_taus",
        csv: |_, setup| setup.iqn.map_or(String::new(), |i| i.online.to_string()),
        hparam: |_, setup| setup.iqn.and_then(|i| n(i.online as f64)),
    }),
};

pub const IQN_TARGET_TAUS: PerAgent = PerAgent {
    name: "iqn_target_taus",
    flag: "iqn-target-taus",
    set: |v, a, _| {
        a.settings.iqn_target_taus = Some(iqn_count(v, "target")?);
        Ok(())
    },
    apply: |_, s, cfg| cfg.dqn.iqn.target = s.iqn_target_taus.unwrap_or(cfg.dqn.iqn.target),
    column: Some(Column {
        header: "iqn_target_taus",
        csv: |_, setup| setup.iqn.map_or(String::new(), |i| i.target.to_string()),
        hparam: |_, setup| setup.iqn.and_then(|i| n(i.target as f64)),
    }),
};

/// Prioritized replay's exponent α, each agent's replay its own (with `--replay
/// prioritized`).
pub const PRIORITY_ALPHA: PerAgent = PerAgent {
    name: "priority_alpha",
    flag: "priority-alpha",
    set: |v, a, _| {
        let alpha = PriorityConfig::checked_alpha(number(v)?).map_err(|e| e.to_string())?;
        a.settings.priority_alpha = Some(alpha);
        Ok(())
    },
    apply: |_, s, cfg| {
        if let (Some(alpha), Some(p)) = (s.priority_alpha, cfg.replay.priority.as_mut()) {
            p.alpha = alpha;
        }
    },
    column: Some(Column {
        header: "priority_alpha",
        csv: |_, setup| {
            setup
                .priority_alpha
                .map_or(String::new(), |a| a.to_string())
        },
        hparam: |_, setup| setup.priority_alpha.and_then(n),
    }),
};

/// Every per-agent setting, in the order of `population.csv`'s columns.
pub const SETTINGS: [&PerAgent; 18] = [
    &LR,
    &MAX_GRAD_NORM,
    &TARGET_PERIOD,
    &TAU,
    &GAMMA,
    &N_STEP,
    &EPS_START,
    &EPS_END,
    &EPS_DECAY_STEPS,
    &BATCH_SIZE,
    &HIDDEN,
    &SAMPLES_PER_INSERT,
    &MUNCHAUSEN_TAU,
    &MUNCHAUSEN_ALPHA,
    &MUNCHAUSEN_CLIP,
    &IQN_TAUS,
    &IQN_TARGET_TAUS,
    &PRIORITY_ALPHA,
];

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn names_are_unique_and_each_flag_is_the_learners() {
        let cmd = crate::cli::Args::command();
        for (i, s) in SETTINGS.iter().enumerate() {
            assert!(
                SETTINGS[..i].iter().all(|t| t.name != s.name),
                "{} twice",
                s.name
            );
            assert_eq!(s.flag, s.name.replace('_', "-"), "{}", s.name);
            assert!(
                cmd.get_arguments().any(|a| a.get_long() == Some(s.flag)),
                "--{} is not a flag of the learner",
                s.flag
            );
            assert_eq!(named(s.name).map(|t| t.name), Some(s.name));
        }
        assert!(named("buffer_size").is_none());
    }

    #[test]
    fn the_header_is_one_column_per_setting_and_one_for_the_target_rule() {
        let header = csv_header();
        assert_eq!(header.len(), SETTINGS.len() - 1);
        assert_eq!(&header[..3], ["lr", "max_grad_norm", "target_update"]);
        assert_eq!(header.last(), Some(&"priority_alpha"));
    }
}
