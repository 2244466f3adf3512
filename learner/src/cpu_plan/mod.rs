//! The CPU plan: which CPUs the learner thread, its service threads and the actor
//! threads run on, decided once at start, printed, and kept in the run's `config.json`.
//!
//! Why: on a GPU the learner thread is launch-bound (about 150 small operations per
//! Nature CNN update), so any thread sharing its core slows it directly (one busy
//! neighbour halved the ceiling, docs/results/gpu.md). The plan gives it a physical core
//! of its own (its SMT siblings left idle; not CPU 0, which takes the interrupts), puts
//! the sampler, publisher, checkpoint writer, evaluator and server on a second, and the
//! actors on the rest. It starts from what this process may use (its affinity mask, so
//! cpusets, containers and Slurm allocations are honoured, and a cgroup CPU quota, which
//! a mask does not show), never from `nproc`.
//!
//! [`plan`] is pure (a [`Machine`] in, a [`CpuPlan`] out); [`host`] reads the machine
//! and pins threads.

pub mod auto;
pub mod host;

use std::fmt;

use serde::{Deserialize, Serialize};

/// `--cpu-plan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanChoice {
    On,
    Off,
}

/// `--actors N` or `--actors auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActorCount {
    Auto,
    Count(usize),
}

impl std::str::FromStr for ActorCount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        s.parse()
            .map(Self::Count)
            .map_err(|_| format!("expected a number of actor threads or `auto`, got {s:?}"))
    }
}

/// One CPU this process may run on, with the physical core it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    pub id: usize,
    /// `(physical package, core id)`: CPUs that share it are SMT siblings.
    pub core: (usize, usize),
}

/// What the plan starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// The CPUs in this process's affinity mask.
    pub cpus: Vec<Cpu>,
    /// A cgroup CPU quota, in CPUs (`cpu.max` 150000/100000 is 1.5); `None` without one.
    pub quota: Option<f64>,
}

/// Where each kind of thread runs. Empty sets mean "not pinned" (the whole mask).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuPlan {
    /// The CPUs this process may use (its affinity mask).
    pub allowed: Vec<usize>,
    /// Physical cores among them.
    pub cores: usize,
    /// A cgroup CPU quota, in CPUs.
    pub quota: Option<f64>,
    /// One CPU per learner thread (one, or one per population group thread).
    pub learner: Vec<usize>,
    /// SMT siblings of the learners' cores, left idle.
    pub idle: Vec<usize>,
    /// Sampler, publisher, checkpoint writer, evaluator, server, metrics.
    pub service: Vec<usize>,
    /// Actor threads.
    pub actors: Vec<usize>,
    /// How the plan degraded from the ideal (fewer cores than it wants), one line each.
    pub notes: Vec<String>,
}

impl CpuPlan {
    /// No pinning at all (`--cpu-plan off`, or a machine of one CPU).
    pub fn off(machine: &Machine, why: &str) -> Self {
        Self {
            allowed: machine.cpus.iter().map(|c| c.id).collect(),
            cores: cores(machine).len(),
            quota: machine.quota,
            notes: vec![why.to_string()],
            ..Self::default()
        }
    }

    /// Whether any thread is pinned.
    pub fn pins(&self) -> bool {
        !self.learner.is_empty()
    }

    /// CPUs' worth of time the actors may use: their CPUs, or under a quota what the
    /// quota leaves after the learner threads and one for the service threads.
    pub fn actor_budget(&self) -> usize {
        let cpus = if self.pins() {
            self.actors.len()
        } else {
            self.allowed.len()
        };
        let by_quota = self.quota.map_or(usize::MAX, |q| {
            let rest = q.floor() as usize;
            rest.saturating_sub(self.learner.len() + usize::from(self.pins()))
        });
        cpus.min(by_quota).max(1)
    }
}

/// The physical cores among the machine's CPUs, each a list of its CPUs (ascending),
/// in the order of their lowest CPU.
fn cores(machine: &Machine) -> Vec<Vec<usize>> {
    let mut cores: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    let mut cpus = machine.cpus.clone();
    cpus.sort_by_key(|c| c.id);
    for cpu in cpus {
        match cores.iter_mut().find(|(k, _)| *k == cpu.core) {
            Some((_, ids)) => ids.push(cpu.id),
            None => cores.push((cpu.core, vec![cpu.id])),
        }
    }
    cores.into_iter().map(|(_, ids)| ids).collect()
}

/// The plan for `learners` learner threads (1, or a population's group threads).
///
/// - Cores for every learner, a service core and at least one for actors: each
///   learner pinned to the first CPU of a core of its own (CPU 0's core last in line),
///   its SMT siblings idle; the service threads on the next core (CPU 0's, if it is
///   free); actors on every CPU of the rest.
/// - One core short: with SMT, the service threads on the learners' siblings and the
///   actors on the other core (never the actors on a learner's core); without, the
///   service threads and the actors share the other core.
/// - Fewer physical cores than learners + 1 (SMT only): the learners on distinct CPUs,
///   the rest shared; fewer CPUs than learners + 1: nothing pinned.
pub fn plan(machine: &Machine, learners: usize) -> CpuPlan {
    let learners = learners.max(1);
    let all: Vec<usize> = {
        let mut ids: Vec<usize> = machine.cpus.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    };
    let mut cores = cores(machine);
    if all.len() < learners + 1 {
        return CpuPlan::off(
            machine,
            &format!(
                "{} CPU(s) for {learners} learner thread(s) and the rest: nothing pinned",
                all.len()
            ),
        );
    }
    let mut notes = Vec::new();
    let n_cores = cores.len();
    // CPU 0 takes the interrupts: its core is the learners' last choice, and the
    // service threads' first.
    cores.sort_by_key(|c| c.contains(&0));
    let shared = |cpus: &[usize], notes: &mut Vec<String>| {
        notes.push(format!(
            "one core left after the learner: service threads and actors share CPU(s) {}",
            list(cpus)
        ));
        (cpus.to_vec(), cpus.to_vec())
    };
    let (learner, idle, service, actors): (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>) =
        if n_cores > learners {
            let (mine, others) = cores.split_at(learners);
            let learner: Vec<usize> = mine.iter().map(|c| c[0]).collect();
            let siblings: Vec<usize> = mine.iter().flat_map(|c| c[1..].to_vec()).collect();
            let mut others = others.to_vec();
            others.sort_by_key(|c| (!c.contains(&0), c[0]));
            if n_cores >= learners + 2 {
                // The ideal: siblings idle, a core for the service threads, the rest
                // for actors.
                let mut actors: Vec<usize> = others[1..].iter().flatten().copied().collect();
                actors.sort_unstable();
                (learner, siblings, others[0].clone(), actors)
            } else if !siblings.is_empty() {
                // One core short with SMT: the light service threads on the learners'
                // siblings, the actors on the other core.
                notes.push(format!(
                    "one core left after the learner: service threads on its SMT sibling(s) {}, actors on {}",
                    list(&siblings),
                    list(&others[0])
                ));
                (learner, Vec::new(), siblings, others[0].clone())
            } else {
                let (service, actors) = shared(&others[0], &mut notes);
                (learner, Vec::new(), service, actors)
            }
        } else {
            // Fewer physical cores than learners + 1 (SMT): the learners on distinct
            // CPUs, none of them CPU 0 where that can be avoided.
            let mut order = all.clone();
            order.sort_by_key(|&id| id == 0);
            let learner: Vec<usize> = order[..learners].to_vec();
            notes.push(format!(
                "{n_cores} physical core(s) for {learners} learner thread(s) and the rest: the learner shares its core with an SMT sibling"
            ));
            let rest: Vec<usize> = all
                .iter()
                .copied()
                .filter(|id| !learner.contains(id))
                .collect();
            let (service, actors) = shared(&rest, &mut notes);
            (learner, Vec::new(), service, actors)
        };
    CpuPlan {
        allowed: all,
        cores: n_cores,
        quota: machine.quota,
        learner,
        idle,
        service,
        actors,
        notes,
    }
}

/// `0-3,8,10-11`, as `taskset` and `/sys` write CPU lists.
pub fn list(ids: &[usize]) -> String {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

impl fmt::Display for CpuPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CPU plan: {} CPU(s) allowed ({}), {} physical core(s)",
            self.allowed.len(),
            list(&self.allowed),
            self.cores
        )?;
        if let Some(q) = self.quota {
            write!(f, ", cgroup quota {q:.2} CPU(s)")?;
        }
        if self.pins() {
            write!(
                f,
                "; learner on {}{}; sampler, publisher, priorities, writer, server on {}; actors on {}",
                list(&self.learner),
                if self.idle.is_empty() {
                    String::new()
                } else {
                    format!(" (siblings {} idle)", list(&self.idle))
                },
                list(&self.service),
                list(&self.actors)
            )?;
        }
        for note in &self.notes {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` cores of `smt` CPUs each, numbered as Linux does on x86 (siblings `n` apart).
    fn machine(n: usize, smt: usize) -> Machine {
        Machine {
            cpus: (0..n * smt)
                .map(|id| Cpu {
                    id,
                    core: (0, id % n),
                })
                .collect(),
            quota: None,
        }
    }

    #[test]
    fn the_learner_gets_a_core_of_its_own_off_cpu_zero() {
        // 8 cores × 2 threads (an H100 host's 16 CPUs).
        let p = plan(&machine(8, 2), 1);
        assert_eq!(p.learner, [1]);
        assert_eq!(p.idle, [9], "its SMT sibling idle");
        assert_eq!(
            p.service,
            [0, 8],
            "CPU 0's core: interrupts and service threads"
        );
        assert_eq!(p.actors, [2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]);
        assert!(p.notes.is_empty(), "{:?}", p.notes);
        assert_eq!(p.actor_budget(), 12);
    }

    #[test]
    fn two_cpus_pin_the_learner_to_cpu_one_and_share_the_other() {
        // This VM: two CPUs, two core ids.
        let p = plan(&machine(2, 1), 1);
        assert_eq!(
            (p.learner.as_slice(), p.service.as_slice()),
            (&[1][..], &[0][..])
        );
        assert_eq!(p.actors, [0]);
        assert_eq!(p.notes.len(), 1, "{:?}", p.notes);
    }

    #[test]
    fn one_core_short_with_smt_keeps_actors_off_the_learners_core() {
        // 2 cores × 2 threads (a 4-vCPU cloud GPU host): CPUs 0 and 2 share a core, 1 and 3.
        let p = plan(&machine(2, 2), 1);
        assert_eq!(p.learner, [1]);
        assert_eq!(p.service, [3], "the light threads on the learner's sibling");
        assert_eq!(p.actors, [0, 2], "the actors on the other core");
        assert_eq!(p.notes.len(), 1, "{:?}", p.notes);
    }

    #[test]
    fn one_cpu_pins_nothing() {
        let p = plan(&machine(1, 1), 1);
        assert!(!p.pins());
        assert_eq!(p.actor_budget(), 1);
    }

    #[test]
    fn a_cpuset_is_honoured() {
        // A container limited to CPUs 4-7 of an 8-core host.
        let mut m = machine(8, 1);
        m.cpus.retain(|c| (4..8).contains(&c.id));
        let p = plan(&m, 1);
        assert_eq!(p.learner, [4]);
        assert_eq!(p.service, [5]);
        assert_eq!(p.actors, [6, 7]);
    }

    #[test]
    fn smt_only_shares_the_learners_core() {
        // One core, two hyperthreads.
        let p = plan(&machine(1, 2), 1);
        assert_eq!(p.learner, [1]);
        assert_eq!(p.service, [0]);
        assert_eq!(p.notes.len(), 2, "{:?}", p.notes);
    }

    #[test]
    fn population_groups_get_a_core_each() {
        let p = plan(&machine(8, 1), 3);
        assert_eq!(p.learner, [1, 2, 3]);
        assert_eq!(p.service, [0]);
        assert_eq!(p.actors, [4, 5, 6, 7]);
        let crowded = plan(&machine(2, 1), 4);
        assert!(!crowded.pins());
    }

    #[test]
    fn a_quota_bounds_the_actors_budget() {
        let mut m = machine(16, 1);
        m.quota = Some(4.5);
        let p = plan(&m, 1);
        assert_eq!(p.actors.len(), 14);
        assert_eq!(
            p.actor_budget(),
            2,
            "4 CPUs of time, less learner and service"
        );
    }

    #[test]
    fn cpu_lists_read_as_taskset_writes_them() {
        assert_eq!(list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(list(&[3, 1, 2, 2]), "1-3");
        assert_eq!(list(&[]), "none");
    }
}
