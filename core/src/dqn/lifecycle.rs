//! The agents' lifecycle and state: fresh networks seeded per agent, agents admitted
//! into a running population or dropped from it, and the state copied to and from the
//! host for checkpoints.

use super::*;

impl Dqn {
    /// Fresh networks for `spec.population` agents with `config`'s settings, agent 0
    /// seeded with `seed` (see [`AgentHparams::seeds`]).
    pub fn new(spec: NetworkSpec, config: DqnConfig, device: Device, seed: u64) -> Self {
        let agents: Vec<AgentHparams> = AgentHparams::seeds(seed, spec.population)
            .map(|s| AgentHparams::from_config(&config, s))
            .collect();
        Self::population(spec, config, &agents, device)
    }

    /// Fresh networks for a population, one agent per entry of `agents` (which must
    /// number `spec.population`), each initialised as PyTorch's `nn.Linear` and
    /// `nn.Conv2d` (uniform ±1/√fan_in for weights and biases) from its own seeded
    /// generator: no global state, so two learners in one process do not disturb each
    /// other, and an agent starts where a one-agent run with its seed starts.
    /// `config` gives what the agents share (Adam's betas and ε, Huber's δ).
    ///
    /// # Panics
    /// If `agents` does not number `spec.population`.
    pub fn population(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: &[AgentHparams],
        device: Device,
    ) -> Self {
        assert_eq!(agents.len(), spec.population, "one entry per agent");
        let head = config
            .dueling
            .then(|| DuelingHead::new(&spec, Device::Cpu))
            .and_then(Result::ok);
        let layout = head.as_ref().map_or(&spec, |h| h.internal()).layout();
        let (k, p) = (spec.population, layout.len);
        let mut values = vec![0.0f32; k * p];
        for (agent, hp) in values.chunks_exact_mut(p).zip(agents) {
            let mut rng = SmallRng::seed_from_u64(hp.seed);
            for layer in layout
                .entries
                .chunks(2)
                .chain(layout.conv.chunks(2))
                .chain(layout.iqn.chunks(2))
            {
                // [in, out] for a linear layer, [out, in, k, k] for a convolution.
                let fan_in: usize = match layer[0].shape.as_slice() {
                    [fan_in, _] => *fan_in,
                    [_, rest @ ..] => rest.iter().product(),
                    [] => 1,
                };
                let bound = 1.0 / (fan_in as f32).sqrt();
                for entry in layer {
                    for v in &mut agent[entry.offset..entry.offset + entry.len] {
                        *v = rng.random_range(-bound..bound);
                    }
                }
            }
            // LayerNorm starts as PyTorch's: gain 1, bias 0.
            for gain in layout.norm.iter().step_by(2) {
                agent[gain.offset..gain.offset + gain.len].fill(1.0);
            }
            if let Some(h) = &head {
                h.mask_host(agent);
            }
        }
        let host = Tensor::from_slice(&values).view([k as i64, p as i64]);
        let state = DqnState {
            target: host.copy(),
            adam_m: host.zeros_like(),
            adam_v: host.zeros_like(),
            online: host,
            adam_step: 0,
            updates: 0,
        };
        Self::restore(spec, config, agents, device, state)
    }

    /// The same population with fresh agents added after it (in the rows after the
    /// present ones), each started as [`Dqn::population`] starts it. A newcomer counts
    /// its own updates from here (for its target period and Adam's bias corrections),
    /// so it learns as it would in a population of its own: a sweep streams queued
    /// agents into the places of finished ones.
    pub fn admit(&self, newcomers: &[AgentHparams]) -> Self {
        let fresh: Vec<(AgentHparams, Option<DqnState>)> =
            newcomers.iter().map(|h| (*h, None)).collect();
        self.admit_states(fresh)
    }

    /// [`Dqn::admit`] where a newcomer may bring the state it had in another population
    /// (one agent's [`Dqn::agent_state`], read back from its checkpoint): it goes on
    /// from there, counting its own updates on from the state's.
    ///
    /// # Panics
    /// If a state is not one agent's of this network.
    pub fn admit_states(&self, newcomers: Vec<(AgentHparams, Option<DqnState>)>) -> Self {
        let mut spec = self.spec().clone();
        spec.population = newcomers.len();
        let fresh = Self::population_states(spec, self.config.clone(), newcomers, self.device);
        let hps = fresh.agents.hparams.clone();
        let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 0);
        let state = DqnState {
            online: cat(&self.params.online, &fresh.params.online),
            target: cat(&self.params.target, &fresh.params.target),
            adam_m: cat(&self.adam.m, &fresh.adam.m),
            adam_v: cat(&self.adam.v, &fresh.adam.v),
            adam_step: self.adam.step,
            updates: self.updates,
        };
        let mut agents = self.agents.hparams.clone();
        agents.extend_from_slice(&hps);
        let mut joined = self.agents.joined.clone();
        joined.extend(fresh.agents.joined.iter().map(|j| self.updates as i64 + j));
        self.rebuilt(state, &agents, &joined, |t, f| cat(t, f), &fresh)
    }

    /// A population of `agents`, each fresh (as [`Dqn::population`] starts it) or going
    /// on from the one-agent state it brings (see [`Dqn::admit_states`]).
    ///
    /// # Panics
    /// If `agents` does not number `spec.population`, or a state is not one agent's of
    /// this network.
    pub fn population_states(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: Vec<(AgentHparams, Option<DqnState>)>,
        device: Device,
    ) -> Self {
        let hps: Vec<AgentHparams> = agents.iter().map(|(h, _)| *h).collect();
        let fresh = Self::population(spec.clone(), config.clone(), &hps, device);
        if agents.iter().all(|(_, s)| s.is_none()) {
            return fresh;
        }
        let mut state = fresh.state();
        let mut joined = vec![0; agents.len()];
        tch::no_grad(|| {
            for (row, (_, s)) in agents.iter().enumerate() {
                let Some(s) = s else { continue };
                for (to, from) in [
                    (&mut state.online, &s.online),
                    (&mut state.target, &s.target),
                    (&mut state.adam_m, &s.adam_m),
                    (&mut state.adam_v, &s.adam_v),
                ] {
                    to.narrow(0, row as i64, 1).copy_(from);
                }
                // Its own updates so far: the population's count (0) less `joined`.
                joined[row] = -(s.updates as i64);
            }
        });
        Self::restore_joined(spec, config, &hps, &joined, device, state)
    }

    /// This population's settings around `state` (for [`Dqn::keep_agents`] and
    /// [`Dqn::admit`]): the skip counters are `counters` of this one's and `other`'s.
    pub(super) fn rebuilt(
        &self,
        state: DqnState,
        agents: &[AgentHparams],
        joined: &[i64],
        counters: impl Fn(&Tensor, &Tensor) -> Tensor,
        other: &Self,
    ) -> Self {
        let mut spec = self.spec().clone();
        spec.population = agents.len();
        let mut next = Self::restore_joined(
            spec,
            self.config.clone(),
            agents,
            joined,
            self.device,
            state,
        );
        next.host_optimizer = self.host_optimizer;
        next.stats.nonfinite = counters(&self.stats.nonfinite, &other.stats.nonfinite).contiguous();
        next.stats.nonfinite_streak =
            counters(&self.stats.nonfinite_streak, &other.stats.nonfinite_streak).contiguous();
        next
    }

    /// Restores from a checkpointed state (shapes checked by the caller), every agent
    /// with `config`'s settings.
    pub fn from_state(
        spec: NetworkSpec,
        config: DqnConfig,
        device: Device,
        state: DqnState,
    ) -> Self {
        let agents = vec![AgentHparams::from_config(&config, 0); spec.population];
        Self::restore(spec, config, &agents, device, state)
    }

    /// Restores a population's state with each agent's own settings.
    pub fn restore(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: &[AgentHparams],
        device: Device,
        state: DqnState,
    ) -> Self {
        let joined = vec![0; agents.len()];
        Self::restore_joined(spec, config, agents, &joined, device, state)
    }

    /// [`Dqn::restore`] for agents that joined after `joined[k]` of the population's
    /// updates.
    pub(super) fn restore_joined(
        spec: NetworkSpec,
        config: DqnConfig,
        agents: &[AgentHparams],
        joined: &[i64],
        device: Device,
        state: DqnState,
    ) -> Self {
        assert_eq!(agents.len(), spec.population, "one entry per agent");
        // A spec that cannot have a dueling head was refused when the flags were
        // checked.
        let dueling = config
            .dueling
            .then(|| DuelingHead::new(&spec, device).expect("a dueling head fits this network"));
        let spec = dueling.as_ref().map_or(spec, |h| h.internal().clone());
        let layout = spec.layout();
        let k = spec.population as i64;
        // Contiguous f32: the CPU's optimizer works on the flat storage.
        let online = state
            .online
            .to_kind(Kind::Float)
            .to_device(device)
            .detach()
            .contiguous();
        let target = state.target.to_device(device).detach();
        let target_views = param_views(&target, &layout, k);
        let online_views = param_views(&online, &layout, k);
        let online_wt = online_views
            .iter()
            .step_by(2)
            .map(|w| w.transpose(1, 2))
            .collect();
        let grad = online.zeros_like();
        let grad_views = param_views(&grad, &layout, k);
        let (online_norm, target_norm, grad_norm) = (
            norm_views(&online, &layout, k),
            norm_views(&target, &layout, k),
            norm_views(&grad, &layout, k),
        );
        let (online_iqn, target_iqn, grad_iqn) = (
            iqn_views(&online, &layout, k),
            iqn_views(&target, &layout, k),
            iqn_views(&grad, &layout, k),
        );
        let torso = Torso::new(&spec, &online, &target, &grad);
        let half = (config.precision == Precision::Bf16).then(|| {
            HalfCopies::new(
                &online,
                &target,
                |flat| param_views(flat, &layout, k),
                |flat| conv_views(flat, &layout, k),
            )
        });
        let rule = TargetRule::new(&config.bootstrap, agents, device);
        Self {
            spec,
            dueling,
            rule,
            config,
            device,
            params: FlatParams {
                online,
                online_views,
                online_wt,
                grad,
                grad_views,
                online_norm,
                target_norm,
                grad_norm,
                online_iqn,
                target_iqn,
                grad_iqn,
                target,
                target_views,
            },
            adam: AdamState {
                m: state
                    .adam_m
                    .to_kind(Kind::Float)
                    .to_device(device)
                    .contiguous(),
                v: state
                    .adam_v
                    .to_kind(Kind::Float)
                    .to_device(device)
                    .contiguous(),
                step: state.adam_step,
                t: Tensor::zeros([k, 1], (Kind::Double, device)),
            },
            torso,
            half,
            updates: state.updates,
            stats: StatSums {
                updates: 0,
                detail_sum: Tensor::zeros([3], (Kind::Float, device)),
                nonfinite: Tensor::zeros([k, 1], (Kind::Float, device)),
                nonfinite_streak: Tensor::zeros([k, 1], (Kind::Float, device)),
            },
            agents: AgentTensors::new(agents, joined, device),
            host_optimizer: device == Device::Cpu,
            fixed_io: Default::default(),
        }
        .with_step_counts()
    }

    /// Sets each agent's own Adam step on the device ([`AdamState::t`]) to its count now.
    pub(super) fn with_step_counts(mut self) -> Self {
        self.count_steps_on_device();
        self
    }

    /// Copies each agent's own Adam step into [`AdamState::t`] (the host path counts on
    /// the host; the device path from here on).
    pub(super) fn count_steps_on_device(&mut self) {
        let k = self.spec.population;
        let own: Vec<f64> = (0..k)
            .map(|a| self.agents.own(a, self.adam.step) as f64)
            .collect();
        let own = Tensor::from_slice(&own)
            .view([k as i64, 1])
            .to_device(self.device);
        tch::no_grad(|| self.adam.t.copy_(&own));
    }

    /// The same networks for only the agents in `rows` (in that order), each with its
    /// settings: a population drops its finished agents, so they stop costing compute.
    /// Parameters, targets, Adam's moments, the update count, when each agent joined and
    /// the agents' skip counters carry over (the loss statistics since the last read do
    /// not).
    pub fn keep_agents(&self, rows: &[usize]) -> Self {
        let index: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let index = Tensor::from_slice(&index).to_device(self.device);
        let pick = |t: &Tensor| t.index_select(0, &index);
        let state = DqnState {
            online: pick(&self.params.online),
            target: pick(&self.params.target),
            adam_m: pick(&self.adam.m),
            adam_v: pick(&self.adam.v),
            adam_step: self.adam.step,
            updates: self.updates,
        };
        let agents: Vec<AgentHparams> = rows.iter().map(|&r| self.agents.hparams[r]).collect();
        let joined: Vec<i64> = rows.iter().map(|&r| self.agents.joined[r]).collect();
        self.rebuilt(state, &agents, &joined, |t, _| pick(t), self)
    }

    /// Agent `row`'s state as a population of one on the host (its own update count):
    /// what its checkpoint saves, and [`Dqn::admit_states`] takes back.
    pub fn agent_state(&self, row: usize) -> DqnState {
        let pick = |t: &Tensor| t.narrow(0, row as i64, 1).to_device(Device::Cpu).copy();
        DqnState {
            online: pick(&self.params.online),
            target: pick(&self.params.target),
            adam_m: pick(&self.adam.m),
            adam_v: pick(&self.adam.v),
            adam_step: self.agents.own(row, self.adam.step),
            updates: self.agents.own(row, self.updates),
        }
    }

    /// A host copy of the full state, for a checkpoint.
    pub fn state(&self) -> DqnState {
        let host = |t: &Tensor| t.detach().to_device(Device::Cpu).copy();
        DqnState {
            online: host(&self.params.online),
            target: host(&self.params.target),
            adam_m: host(&self.adam.m),
            adam_v: host(&self.adam.v),
            adam_step: self.adam.step,
            updates: self.updates,
        }
    }
}
