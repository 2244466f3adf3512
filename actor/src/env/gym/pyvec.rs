//! [`PyVecEnv`]: a `bridge.py` object behind [`VecEnv`], and [`GymVec`], which makes one
//! from any Gymnasium id.

use std::marker::PhantomData;

use millrace_proto::env::GYM_PREFIX;
use millrace_proto::{DType, EnvConfig, EnvSpec, ObsSpec};
use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;

use super::{construct, py_err, with_python};
use crate::env::{AnyVecEnv, EnvError, Step, VecEnv};

/// N environments in Python, stepped together by one call per step; observations of
/// element type `O` (`f32` or `u8`, as `bridge.py` converted them).
pub struct PyVecEnv<O> {
    obj: Py<PyAny>,
    spec: EnvSpec,
    n: usize,
    /// Scratch for `first`: only the rows of ended episodes are copied out of it.
    first: Vec<O>,
    rewards: Vec<f32>,
    flags: [Vec<u8>; 3],
    actions: Vec<i64>,
    _obs: PhantomData<fn() -> O>,
}

impl<O: Element + Copy + Default + Send> PyVecEnv<O> {
    pub(crate) fn new(obj: Py<PyAny>, spec: EnvSpec, n: usize) -> Self {
        Self {
            obj,
            first: vec![O::default(); n * spec.obs.numel()],
            spec,
            n,
            rewards: vec![0.0; n],
            flags: [vec![0; n], vec![0; n], vec![0; n]],
            actions: vec![0; n],
            _obs: PhantomData,
        }
    }

    /// Sets environment `i`'s `unwrapped.state` (classic control: tests start the port
    /// and the bridged environment from one state).
    pub fn set_state(&mut self, i: usize, state: &[f64]) -> Result<(), EnvError> {
        with_python(|py| {
            self.obj
                .bind(py)
                .call_method1("set_state", (i, state.to_vec()))
                .map(drop)
                .map_err(|e| py_err(py, e))
        })
    }
}

/// Copies the array attribute `name` of `obj` into `out` (exactly its size and type).
fn copy_out<T: Element>(obj: &Bound<'_, PyAny>, name: &str, out: &mut [T]) -> PyResult<()> {
    let array = obj.getattr(name)?;
    PyBuffer::<T>::get(&array)?.copy_to_slice(obj.py(), out)
}

impl<O: Element + Copy + Default + Send> VecEnv<O> for PyVecEnv<O> {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn num_envs(&self) -> usize {
        self.n
    }

    fn reset(&mut self, seeds: &[u64], obs: &mut [O]) -> Result<(), EnvError> {
        with_python(|py| {
            let obj = self.obj.bind(py);
            obj.call_method1("reset", (seeds.to_vec(),))
                .and_then(|_| copy_out(obj, "first", obs))
                .map_err(|e| py_err(py, e))
        })
    }

    fn step(
        &mut self,
        actions: &[usize],
        next: &mut [O],
        first: &mut [O],
        steps: &mut [Step],
    ) -> Result<(), EnvError> {
        for (a, b) in self.actions.iter_mut().zip(actions) {
            *a = *b as i64;
        }
        let (obj, actions, scratch) = (&self.obj, &self.actions, &mut self.first);
        let (rewards, flags) = (&mut self.rewards, &mut self.flags);
        with_python(|py| {
            let obj = obj.bind(py);
            (|| {
                obj.call_method1("step", (actions.clone(),))?;
                copy_out(obj, "next", next)?;
                copy_out(obj, "rewards", rewards)?;
                for (flag, name) in flags
                    .iter_mut()
                    .zip(["terminated", "truncated", "life_lost"])
                {
                    copy_out(obj, name, flag)?;
                }
                // First observations only matter where an episode ended: most steps
                // copy nothing more (64 Atari stacks are 1.8 MB).
                if flags[0].iter().chain(&flags[1]).any(|f| *f != 0) {
                    copy_out(obj, "first", scratch)?;
                }
                Ok(())
            })()
            .map_err(|e| py_err(py, e))
        })?;
        let d = self.spec.obs.numel();
        for (i, step) in steps.iter_mut().enumerate().take(self.n) {
            *step = Step {
                reward: self.rewards[i],
                terminated: self.flags[0][i] != 0,
                truncated: self.flags[1][i] != 0,
                life_lost: self.flags[2][i] != 0,
            };
            if step.done() {
                first[i * d..(i + 1) * d].copy_from_slice(&self.first[i * d..(i + 1) * d]);
            }
        }
        Ok(())
    }
}

/// Reads the spec `bridge.py` worked out for its environments.
fn spec_from(obj: &Bound<'_, PyAny>, id: &str) -> PyResult<EnvSpec> {
    let layout = obj.getattr("layout")?;
    let shape: Vec<usize> = layout.getattr("shape")?.extract()?;
    let image = layout
        .getattr("dtype")?
        .getattr("__name__")?
        .extract::<String>()?
        == "uint8";
    let max_steps: u64 = obj.getattr("max_episode_steps")?.extract()?;
    Ok(EnvSpec {
        id: id.to_string(),
        obs: ObsSpec {
            shape,
            dtype: if image { DType::U8 } else { DType::F32 },
        },
        num_actions: obj.getattr("num_actions")?.extract()?,
        // 0 (no time limit) becomes "never": episodes end when the task does.
        max_episode_steps: u32::try_from(max_steps)
            .ok()
            .filter(|m| *m > 0)
            .unwrap_or(u32::MAX),
        reward_threshold: obj.getattr("reward_threshold")?.extract()?,
        reward_range: None,
        // A stacking wrapper's frames are not known to be frames: whole observations.
        frame_stack: 1,
    })
}

/// Any environment registered with Gymnasium (`gym:<id>`), `n` instances stepped one
/// after another in Python.
#[derive(Debug)]
pub struct GymVec;

impl GymVec {
    /// Makes `n` environments `cfg.id` (which starts with `gym:`): float observations
    /// become an `f32` vector env, uint8/bool images a `u8` one.
    pub fn make(cfg: &EnvConfig, n: usize) -> Result<AnyVecEnv, EnvError> {
        let (obj, spec) = Self::build(cfg, n)?;
        Ok(match spec.obs.dtype {
            DType::U8 => AnyVecEnv::Pixels(Box::new(PyVecEnv::<u8>::new(obj, spec, n))),
            DType::F32 => AnyVecEnv::Vector(Box::new(PyVecEnv::<f32>::new(obj, spec, n))),
        })
    }

    /// Like [`GymVec::make`] for float observations, keeping the concrete type (tests
    /// reach [`PyVecEnv::set_state`] through it).
    pub fn make_vector(cfg: &EnvConfig, n: usize) -> Result<PyVecEnv<f32>, EnvError> {
        let (obj, spec) = Self::build(cfg, n)?;
        if spec.obs.dtype != DType::F32 {
            return Err(EnvError::Options(format!(
                "{} has image observations",
                cfg.id
            )));
        }
        Ok(PyVecEnv::new(obj, spec, n))
    }

    /// The `bridge.GymVec` object and the spec it worked out.
    fn build(cfg: &EnvConfig, n: usize) -> Result<(Py<PyAny>, EnvSpec), EnvError> {
        let gym_id = cfg.id.strip_prefix(GYM_PREFIX).unwrap_or(&cfg.id);
        with_python(|py| {
            let obj = construct(
                py,
                "GymVec",
                (gym_id, n, cfg.module.clone(), cfg.kwargs.clone()),
            )?;
            let spec = spec_from(&obj, &cfg.id).map_err(|e| py_err(py, e))?;
            Ok((obj.unbind(), spec))
        })
    }
}
