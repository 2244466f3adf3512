//! The run's train return: what `charts/episode_return`, the console and the summary's
//! `train_return_100` say.
//!
//! The last 100 training episodes, as SB3 and Sample Factory keep them, but summarised
//! per actor: each actor's mean over its episodes in the window, then the median of
//! those means. With one actor (lock-step, a single remote actor) that is the plain
//! mean of the last 100 episodes. With three or more, no one actor can move the figure
//! outside the range of the others' means, whatever finite returns it reports: a buggy
//! or hostile actor reporting 1e9 on an environment whose reward range is unknown
//! (`gym:` ids, Atari: the server can bound only the Rust ports' returns, see
//! `EnvSpec::plausible_return`) no longer becomes the run's figure. With two, the
//! median is the mean of the two: there is no majority to side with.

use std::collections::{BTreeMap, VecDeque};

/// Training episodes the figure covers.
pub const WINDOW: usize = 100;

#[derive(Debug, Default)]
pub struct TrainReturns {
    /// (actor, return), oldest first.
    window: VecDeque<(u32, f32)>,
}

impl TrainReturns {
    /// A finished training episode of `actor`.
    pub fn push(&mut self, actor: u32, episode_return: f32) {
        if self.window.len() == WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((actor, episode_return));
    }

    /// The median over actors of their mean return in the window; `None` before the
    /// first episode.
    pub fn figure(&self) -> Option<f32> {
        let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
        for &(actor, r) in &self.window {
            let e = sums.entry(actor).or_default();
            *e = (e.0 + f64::from(r), e.1 + 1);
        }
        let mut means: Vec<f64> = sums.values().map(|(s, n)| s / f64::from(*n)).collect();
        if means.is_empty() {
            return None;
        }
        means.sort_by(f64::total_cmp);
        let mid = means.len() / 2;
        let median = if means.len() % 2 == 1 {
            means[mid]
        } else {
            (means[mid - 1] + means[mid]) / 2.0
        };
        Some(median as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_actor_gets_the_plain_mean_of_its_last_100_episodes() {
        let mut t = TrainReturns::default();
        assert_eq!(t.figure(), None);
        for r in 0..150 {
            t.push(7, r as f32);
        }
        // Episodes 50..150: a mean of 99.5.
        assert_eq!(t.figure(), Some(99.5));
    }

    #[test]
    fn one_actor_of_several_cannot_move_the_figure_outside_the_others() {
        let mut t = TrainReturns::default();
        for _ in 0..10 {
            for actor in 0..4 {
                t.push(actor, 100.0 + actor as f32);
            }
            t.push(9, 1e9);
        }
        let got = t.figure().unwrap();
        assert!((101.0..=103.0).contains(&got), "{got}");
        // The plain mean would have said 2e8.
        let mean: f64 = t.window.iter().map(|(_, r)| f64::from(*r)).sum::<f64>() / 50.0;
        assert!(mean > 1e8);
    }

    #[test]
    fn two_actors_have_no_majority() {
        let mut t = TrainReturns::default();
        t.push(0, 10.0);
        t.push(1, 30.0);
        t.push(1, 50.0);
        assert_eq!(t.figure(), Some(25.0));
    }
}
