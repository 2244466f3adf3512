//! The actor's side of frame mode: each environment's stacked observations become a
//! stream of single frames (see [`millrace_proto::frames`]).

use millrace_proto::{FrameLinks, TransitionBatch, NO_FRAME};

use crate::nstep::Rows;

/// Turns stacked observations into frames, each sent once, and builds frame-mode
/// batches for the n-step windows ([`Rows`]).
///
/// An observation whose older frames are the previous observation's newer ones (the
/// stack shifted by one step) adds only its newest frame, linked to the previous one; an
/// observation equal to the previous one (a new chain after a lost life) adds nothing;
/// anything else (an episode's first observation) adds all its frames as a new chain.
/// The test is on the bytes, so rebuilt stacks equal the observations exactly, whatever
/// the environment does at resets. Frame numbers rise across batches, so the windows'
/// pending steps stay valid when a batch is handed on: nothing is carried.
#[derive(Debug)]
pub struct FrameWriter {
    stack: usize,
    frame_bytes: usize,
    /// Per environment: its last stored observation and the number of its newest frame.
    last: Vec<u8>,
    last_id: Vec<u64>,
    next_number: u64,
    batch: TransitionBatch,
    capacity: (usize, usize),
}

impl FrameWriter {
    /// A writer for `envs` environments whose observations of `obs_bytes` are `stack`
    /// frames; batches have room for `items` transitions and `frames` frames.
    ///
    /// # Panics
    /// If `stack` is 0 or does not divide `obs_bytes`.
    pub fn new(stack: usize, obs_bytes: usize, envs: usize, items: usize, frames: usize) -> Self {
        assert!(
            stack > 0 && obs_bytes.is_multiple_of(stack),
            "{obs_bytes} bytes are not {stack} frames"
        );
        let frame_bytes = obs_bytes / stack;
        Self {
            stack,
            frame_bytes,
            last: vec![0; envs * obs_bytes],
            last_id: vec![NO_FRAME; envs],
            next_number: 0,
            batch: Self::empty(stack, frame_bytes, items, frames),
            capacity: (items, frames),
        }
    }

    fn empty(stack: usize, frame_bytes: usize, items: usize, frames: usize) -> TransitionBatch {
        let mut batch = TransitionBatch::default();
        Self::reuse(&mut batch, stack, frame_bytes, (items, frames));
        batch
    }

    /// Empties `batch` as a frame-mode batch with room for `items` transitions and
    /// `frames` frames, keeping its allocations.
    fn reuse(
        batch: &mut TransitionBatch,
        stack: usize,
        frame_bytes: usize,
        (items, frames): (usize, usize),
    ) {
        batch.reuse(frame_bytes, items, frames);
        let links = batch
            .frames
            .get_or_insert_with(|| Box::new(FrameLinks::new(stack as u32)));
        links.clear();
        links.stack = stack as u32;
        links.number.reserve(frames);
        links.env.reserve(frames);
        links.prev.reserve(frames);
        links.item_env.reserve(items);
        links.obs.reserve(items);
        links.next.reserve(items);
    }

    /// The batch being built.
    pub fn batch(&self) -> &TransitionBatch {
        &self.batch
    }

    /// Hands on the batch built so far through `spare`, which becomes the next one
    /// (emptied, its allocations kept): the streams go on.
    pub fn swap_out(&mut self, spare: &mut TransitionBatch) {
        Self::reuse(spare, self.stack, self.frame_bytes, self.capacity);
        std::mem::swap(&mut self.batch, spare);
    }

    fn links(&mut self) -> &mut FrameLinks {
        self.batch.frames.as_mut().expect("a frame-mode batch")
    }

    fn push_frame(&mut self, env: usize, frame: &[u8], prev: u64) -> u64 {
        let number = self.next_number;
        self.next_number += 1;
        self.batch.push_obs_bytes(frame);
        let links = self.links();
        links.number.push(number);
        links.env.push(env as u32);
        links.prev.push(prev);
        number
    }
}

impl Rows for FrameWriter {
    fn store(&mut self, env: usize, obs: &[u8]) -> u64 {
        let fb = self.frame_bytes;
        let bytes = fb * self.stack;
        debug_assert_eq!(obs.len(), bytes);
        let last = &self.last[env * bytes..(env + 1) * bytes];
        let id = if self.last_id[env] == NO_FRAME {
            None
        } else if obs == last {
            return self.last_id[env];
        } else if obs[..bytes - fb] == last[fb..] {
            Some(self.last_id[env])
        } else {
            None
        };
        let newest = match id {
            Some(prev) => self.push_frame(env, &obs[bytes - fb..], prev),
            None => (0..self.stack).fold(NO_FRAME, |prev, f| {
                self.push_frame(env, &obs[f * fb..(f + 1) * fb], prev)
            }),
        };
        self.last[env * bytes..(env + 1) * bytes].copy_from_slice(obs);
        self.last_id[env] = newest;
        newest
    }

    fn transition(
        &mut self,
        env: usize,
        obs: u64,
        action: i64,
        reward: f32,
        discount: f32,
        next: u64,
    ) {
        let b = &mut self.batch;
        b.actions.push(action);
        b.rewards.push(reward);
        b.discounts.push(discount);
        let links = self.links();
        links.item_env.push(env as u32);
        links.obs.push(obs);
        links.next.push(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rebuilds the stack whose newest frame is `id` from the batches sent so far.
    fn rebuild(batches: &[TransitionBatch], id: u64, stack: usize) -> Vec<u8> {
        let mut frames: Vec<&[u8]> = Vec::new();
        let mut at = id;
        for _ in 0..stack {
            let (b, j) = batches
                .iter()
                .find_map(|b| {
                    let l = b.frames.as_ref().unwrap();
                    l.number.iter().position(|n| *n == at).map(|j| (b, j))
                })
                .expect("a linked frame was sent");
            frames.push(b.obs_row(j as u32));
            at = b.frames.as_ref().unwrap().prev[j];
        }
        frames.reverse();
        frames.concat()
    }

    fn take(w: &mut FrameWriter) -> TransitionBatch {
        let mut out = TransitionBatch::default();
        w.swap_out(&mut out);
        out
    }

    #[test]
    fn shifted_stacks_add_one_frame_and_rebuild_exactly() {
        let mut w = FrameWriter::new(3, 6, 2, 8, 8);
        let mut sent = Vec::new();
        // Environment 0 shifts; environment 1 starts a new chain (not a shift).
        let a = w.store(0, &[1, 1, 2, 2, 3, 3]);
        let b = w.store(0, &[2, 2, 3, 3, 4, 4]);
        assert_eq!(w.batch().obs_rows(), 4, "a chain of three, then one frame");
        let c = w.store(1, &[9, 9, 9, 9, 9, 9]);
        assert_eq!(w.store(1, &[9, 9, 9, 9, 9, 9]), c, "the same stack again");
        w.transition(0, a, 1, 0.5, 0.9, b);
        sent.push(take(&mut w));
        // Across the hand-over: links into the batch already sent.
        let d = w.store(0, &[3, 3, 4, 4, 5, 5]);
        let e = w.store(0, &[0, 0, 0, 0, 7, 7]);
        sent.push(take(&mut w));
        assert_eq!(
            sent[1].obs_rows(),
            4,
            "one frame, then a new chain of three"
        );
        for batch in &sent {
            batch.validate(6, 3).unwrap();
        }
        for (id, stack) in [
            (a, [1, 1, 2, 2, 3, 3]),
            (b, [2, 2, 3, 3, 4, 4]),
            (c, [9, 9, 9, 9, 9, 9]),
            (d, [3, 3, 4, 4, 5, 5]),
            (e, [0, 0, 0, 0, 7, 7]),
        ] {
            assert_eq!(rebuild(&sent, id, 3), stack);
        }
        let l = sent[0].frames.as_ref().unwrap();
        assert_eq!((l.obs.as_slice(), l.next.as_slice()), (&[a][..], &[b][..]));
    }
}
