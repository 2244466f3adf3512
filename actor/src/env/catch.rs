//! `CatchPixels-v0`: a synthetic Atari-like pixel task that costs about what Atari
//! preprocessing costs, for benchmarking the pixel (Nature CNN) path without an emulator.
//!
//! The game is bsuite's Catch on an Atari-sized screen: a ball falls from a random
//! column; the agent moves a paddle along the bottom (no-op, left, right) and gets +1
//! for catching the ball and −1 for missing it, which ends the episode (about 10 agent
//! steps). The observation pipeline is the one `AtariPreprocessing` +
//! `FrameStackObservation(4)` apply to ALE frames: each agent step spans four frames
//! (frame skip), the last two are rendered as 210×160 RGB and max-pooled, converted to
//! luminance, resized to 84×84 by area averaging, and stacked with the three previous
//! frames into a `[4, 84, 84]` `u8` observation.

use millrace_proto::{DType, EnvSpec, ObsSpec};
use rand::rngs::SmallRng;
use rand::Rng;

use super::{Env, Step};

pub(super) const ID: &str = "CatchPixels-v0";

const SCREEN_H: usize = 210;
const SCREEN_W: usize = 160;
const OUT: usize = 84;
const STACK: usize = 4;
const FRAME_SKIP: usize = 4;
const BALL: usize = 6;
/// Pixels the ball falls per frame.
const BALL_SPEED: usize = 5;
const PADDLE_W: usize = 24;
const PADDLE_H: usize = 6;
const PADDLE_Y: usize = 190;
/// Pixels the paddle moves per frame.
const PADDLE_SPEED: usize = 4;
const MAX_EPISODE_STEPS: u32 = 100;

/// Area-averaging weights for resizing one axis: for each output index, the input
/// indices it covers and their weights (fixed point, summing to 2^16).
#[derive(Debug)]
struct AreaWeights {
    taps: Vec<Vec<(usize, u32)>>,
}

impl AreaWeights {
    fn new(input: usize, output: usize) -> Self {
        let scale = input as f64 / output as f64;
        let taps = (0..output)
            .map(|o| {
                let (lo, hi) = (o as f64 * scale, (o + 1) as f64 * scale);
                let mut taps: Vec<(usize, u32)> = (lo.floor() as usize
                    ..(hi.ceil() as usize).min(input))
                    .map(|i| {
                        let cover = (hi.min(i as f64 + 1.0) - lo.max(i as f64)) / scale;
                        (i, (cover * 65536.0).round() as u32)
                    })
                    .filter(|t| t.1 > 0)
                    .collect();
                // Make the weights sum to exactly 2^16 so flat areas stay flat.
                let sum: u32 = taps.iter().map(|t| t.1).sum();
                if let Some(last) = taps.last_mut() {
                    last.1 = (last.1 + 65536).saturating_sub(sum);
                }
                taps
            })
            .collect();
        Self { taps }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct CatchPixels {
    spec: EnvSpec,
    rng: SmallRng,
    ball: (usize, usize),
    paddle: usize,
    steps: u32,
    /// Two RGB frames (the last two of a frame skip), max-pooled into the first.
    rgb: [Vec<u8>; 2],
    gray: Vec<u8>,
    /// Horizontally resized rows, `[SCREEN_H, OUT]` in 16.16 fixed point.
    rows: Vec<u32>,
    resize_x: AreaWeights,
    resize_y: AreaWeights,
    /// The last `STACK` preprocessed frames, oldest first.
    stack: Vec<u8>,
}

impl CatchPixels {
    pub fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                id: ID.into(),
                obs: ObsSpec {
                    shape: vec![STACK, OUT, OUT],
                    dtype: DType::U8,
                },
                num_actions: 3,
                max_episode_steps: MAX_EPISODE_STEPS,
                reward_threshold: Some(0.9),
                reward_range: Some((-1.0, 1.0)),
                frame_stack: STACK,
            },
            rng: super::rng(seed),
            ball: (0, 0),
            paddle: 0,
            steps: 0,
            rgb: [
                vec![0; SCREEN_H * SCREEN_W * 3],
                vec![0; SCREEN_H * SCREEN_W * 3],
            ],
            gray: vec![0; SCREEN_H * SCREEN_W],
            rows: vec![0; SCREEN_H * OUT],
            resize_x: AreaWeights::new(SCREEN_W, OUT),
            resize_y: AreaWeights::new(SCREEN_H, OUT),
            stack: vec![0; STACK * OUT * OUT],
        }
    }

    /// Draws the current state into RGB frame `which`.
    fn render(&mut self, which: usize) {
        let frame = &mut self.rgb[which];
        // A dark playfield with a lighter band, like many Atari backgrounds.
        for (y, row) in frame.chunks_exact_mut(SCREEN_W * 3).enumerate() {
            let shade = if (40..44).contains(&y) { 90 } else { 20 };
            for px in row.chunks_exact_mut(3) {
                px.copy_from_slice(&[shade, shade, shade + 24]);
            }
        }
        let mut rect = |x0: usize, y0: usize, w: usize, h: usize, rgb: [u8; 3]| {
            for y in y0..(y0 + h).min(SCREEN_H) {
                for x in x0..(x0 + w).min(SCREEN_W) {
                    frame[(y * SCREEN_W + x) * 3..][..3].copy_from_slice(&rgb);
                }
            }
        };
        rect(self.ball.0, self.ball.1, BALL, BALL, [236, 236, 236]);
        rect(self.paddle, PADDLE_Y, PADDLE_W, PADDLE_H, [200, 72, 72]);
    }

    /// Max-pools the two RGB frames, converts to luminance, resizes to 84×84 and pushes
    /// the result onto the frame stack.
    fn preprocess(&mut self) {
        let [a, b] = &self.rgb;
        for (g, (pa, pb)) in self
            .gray
            .iter_mut()
            .zip(a.chunks_exact(3).zip(b.chunks_exact(3)))
        {
            let (r, gr, bl) = (pa[0].max(pb[0]), pa[1].max(pb[1]), pa[2].max(pb[2]));
            // ITU-R 601 luma, as OpenCV's RGB2GRAY, in fixed point.
            *g = ((u32::from(r) * 4899 + u32::from(gr) * 9617 + u32::from(bl) * 1868 + 8192) >> 14)
                as u8;
        }
        for y in 0..SCREEN_H {
            let src = &self.gray[y * SCREEN_W..(y + 1) * SCREEN_W];
            for (x, taps) in self.resize_x.taps.iter().enumerate() {
                self.rows[y * OUT + x] = taps.iter().map(|&(i, w)| u32::from(src[i]) * w).sum();
            }
        }
        self.stack.copy_within(OUT * OUT.., 0);
        let newest = &mut self.stack[(STACK - 1) * OUT * OUT..];
        for (oy, taps) in self.resize_y.taps.iter().enumerate() {
            for ox in 0..OUT {
                let acc: u64 = taps
                    .iter()
                    .map(|&(i, w)| u64::from(self.rows[i * OUT + ox]) * u64::from(w))
                    .sum();
                newest[oy * OUT + ox] = ((acc + (1 << 31)) >> 32).min(255) as u8;
            }
        }
    }
}

impl Env<u8> for CatchPixels {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [u8]) {
        if let Some(seed) = seed {
            self.rng = super::rng(seed);
        }
        self.ball = (self.rng.random_range(0..SCREEN_W - BALL), 0);
        self.paddle = (SCREEN_W - PADDLE_W) / 2;
        self.steps = 0;
        self.render(0);
        let [first, second] = &mut self.rgb;
        second.copy_from_slice(first);
        self.preprocess();
        // As FrameStackObservation's reset: the first frame fills the whole stack.
        let (older, newest) = self.stack.split_at_mut((STACK - 1) * OUT * OUT);
        for frame in older.chunks_exact_mut(OUT * OUT) {
            frame.copy_from_slice(newest);
        }
        obs.copy_from_slice(&self.stack);
    }

    fn step(&mut self, action: usize, obs: &mut [u8]) -> Step {
        let mut reward = 0.0;
        let mut terminated = false;
        for frame in 0..FRAME_SKIP {
            self.paddle = match action {
                1 => self.paddle.saturating_sub(PADDLE_SPEED),
                2 => (self.paddle + PADDLE_SPEED).min(SCREEN_W - PADDLE_W),
                _ => self.paddle,
            };
            self.ball.1 += BALL_SPEED;
            if self.ball.1 + BALL >= PADDLE_Y {
                let caught =
                    self.ball.0 + BALL > self.paddle && self.ball.0 < self.paddle + PADDLE_W;
                reward = if caught { 1.0 } else { -1.0 };
                terminated = true;
            }
            if frame >= FRAME_SKIP - 2 || terminated {
                self.render(frame % 2);
            }
            if terminated {
                break;
            }
        }
        self.preprocess();
        self.steps += 1;
        obs.copy_from_slice(&self.stack);
        Step {
            reward,
            terminated,
            truncated: !terminated && self.steps >= MAX_EPISODE_STEPS,
            life_lost: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64, policy: impl Fn(&CatchPixels) -> usize) -> (Vec<f32>, Vec<u8>) {
        let mut env = CatchPixels::new(seed);
        let mut obs = vec![0u8; STACK * OUT * OUT];
        let mut rewards = Vec::new();
        env.reset(Some(seed), &mut obs);
        for _ in 0..20 {
            let step = env.step(policy(&env), &mut obs);
            if step.done() {
                rewards.push(step.reward);
                env.reset(None, &mut obs);
            }
        }
        (rewards, obs)
    }

    fn track(env: &CatchPixels) -> usize {
        let (ball, paddle) = (env.ball.0 + BALL / 2, env.paddle + PADDLE_W / 2);
        if ball + 2 < paddle {
            1
        } else if ball > paddle + 2 {
            2
        } else {
            0
        }
    }

    #[test]
    fn tracking_the_ball_catches_it_and_standing_still_mostly_misses() {
        let (caught, _) = run(3, track);
        assert!(caught.len() >= 2, "episodes of about 10 steps");
        assert!(caught.iter().all(|r| *r == 1.0), "{caught:?}");
        let mut misses = 0;
        for seed in 0..10 {
            let (r, _) = run(seed, |_| 0);
            misses += r.iter().filter(|x| **x == -1.0).count();
        }
        assert!(misses >= 10, "a still paddle misses most balls ({misses})");
    }

    #[test]
    fn observations_are_reproducible_stacked_frames() {
        let (_, a) = run(7, track);
        let (_, b) = run(7, track);
        assert_eq!(a, b);
        // After a reset all four frames are equal; after a step the ball has moved, so
        // the newest frame differs from the oldest.
        let mut env = CatchPixels::new(1);
        let mut obs = vec![0u8; STACK * OUT * OUT];
        env.reset(Some(1), &mut obs);
        let frame = |o: &[u8], i: usize| o[i * OUT * OUT..(i + 1) * OUT * OUT].to_vec();
        assert_eq!(frame(&obs, 0), frame(&obs, 3));
        let before = frame(&obs, 3);
        env.step(0, &mut obs);
        assert_eq!(frame(&obs, 2), before, "the stack shifts by one frame");
        assert_ne!(frame(&obs, 3), before);
        // The ball is bright, the background dark.
        assert!(obs.iter().any(|p| *p > 200) && obs.iter().any(|p| *p < 40));
    }

    #[test]
    fn area_resize_keeps_flat_areas_flat() {
        let w = AreaWeights::new(SCREEN_W, OUT);
        assert_eq!(w.taps.len(), OUT);
        for taps in &w.taps {
            assert_eq!(taps.iter().map(|t| t.1).sum::<u32>(), 65536);
        }
        let mut env = CatchPixels::new(0);
        env.rgb[0].fill(77);
        env.rgb[1].fill(77);
        env.preprocess();
        assert!(env.stack[3 * OUT * OUT..].iter().all(|p| *p == 77));
    }
}
