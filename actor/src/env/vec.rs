//! [`VecEnv`]: N environments stepped together, the interface actors and evaluation
//! drive. Native ports loop over their instances ([`NativeVec`]); ale-py steps all of
//! its games in C++ threads; the Gymnasium bridge steps its environments in Python. A
//! native implementation can replace a bridged one without touching the actors.

use millrace_proto::EnvSpec;

use super::{Env, EnvError, Step};

/// `num_envs` environments of one kind, observations of element type `O` laid out
/// row after row (`spec().obs.numel()` elements each).
///
/// Environments reset themselves when an episode ends (Gymnasium's "same step"
/// autoreset): [`VecEnv::step`] reports the observation that ended the episode *and*
/// the first one of the next, so an actor can both close its n-step window and go on.
pub trait VecEnv<O>: Send {
    fn spec(&self) -> &EnvSpec;

    fn num_envs(&self) -> usize;

    /// Starts an episode in every environment, environment `i` seeded with `seeds[i]`,
    /// writing its first observation into row `i` of `obs`.
    fn reset(&mut self, seeds: &[u64], obs: &mut [O]) -> Result<(), EnvError>;

    /// Takes `actions[i]` in environment `i`. Row `i` of `next` receives the
    /// observation that follows (the last of the episode if it ended) and `steps[i]`
    /// the outcome; where the episode ended, the environment has started the next one
    /// and row `i` of `first` receives its first observation (other rows of `first`
    /// are left as they were).
    fn step(
        &mut self,
        actions: &[usize],
        next: &mut [O],
        first: &mut [O],
        steps: &mut [Step],
    ) -> Result<(), EnvError>;
}

/// Single environments (the Rust ports) stepped one after another.
pub struct NativeVec<O> {
    envs: Vec<Box<dyn Env<O>>>,
    spec: EnvSpec,
}

impl<O> NativeVec<O> {
    /// # Panics
    /// If `envs` is empty.
    pub fn new(envs: Vec<Box<dyn Env<O>>>) -> Self {
        let spec = envs
            .first()
            .expect("at least one environment")
            .spec()
            .clone();
        Self { envs, spec }
    }

    /// The environment at `i` (tests set start states through it).
    pub fn env_mut(&mut self, i: usize) -> &mut dyn Env<O> {
        &mut *self.envs[i]
    }
}

impl<O: Copy> VecEnv<O> for NativeVec<O> {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn num_envs(&self) -> usize {
        self.envs.len()
    }

    fn reset(&mut self, seeds: &[u64], obs: &mut [O]) -> Result<(), EnvError> {
        let d = self.spec.obs.numel();
        for ((env, seed), row) in self.envs.iter_mut().zip(seeds).zip(obs.chunks_mut(d)) {
            env.reset(Some(*seed), row);
        }
        Ok(())
    }

    fn step(
        &mut self,
        actions: &[usize],
        next: &mut [O],
        first: &mut [O],
        steps: &mut [Step],
    ) -> Result<(), EnvError> {
        let d = self.spec.obs.numel();
        for (i, env) in self.envs.iter_mut().enumerate() {
            let step = env.step(actions[i], &mut next[i * d..(i + 1) * d]);
            if step.done() {
                env.reset(None, &mut first[i * d..(i + 1) * d]);
            }
            steps[i] = step;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{make, CartPole};

    #[test]
    fn native_vec_steps_like_its_environments_and_resets_where_done() {
        let mut single = CartPole::new(0);
        let mut vec = NativeVec::new(vec![make("CartPole-v1", 0).unwrap()]);
        let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
        single.reset(Some(9), &mut a);
        vec.reset(&[9], &mut b).unwrap();
        assert_eq!(a, b);
        let (mut next, mut first, mut steps) = ([0f32; 4], [0f32; 4], [Step::default(); 1]);
        let mut ended = 0;
        for t in 0..300 {
            let step = single.step(t % 2, &mut a);
            vec.step(&[t % 2], &mut next, &mut first, &mut steps)
                .unwrap();
            assert_eq!((step, a), (steps[0], next));
            if step.done() {
                ended += 1;
                single.reset(None, &mut a);
                assert_eq!(
                    a, first,
                    "the next episode starts where the single env's does"
                );
            }
        }
        assert!(ended > 0);
    }
}
