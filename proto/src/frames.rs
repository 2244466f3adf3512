//! Frame streams: how a batch of stacked pixel observations carries each frame once.
//!
//! An Atari observation is a stack of the last 4 frames; consecutive observations of one
//! environment share 3 of them. In frame mode a [`TransitionBatch`](crate::TransitionBatch)
//! carries only frames it has not sent before, each with the number of the frame below it
//! in its stack, and names observations by the number of their newest frame. Walking
//! `stack − 1` links down from an observation's newest frame rebuilds its stack, so
//! replay stores about one frame per transition instead of a whole stack (or two).
//!
//! Numbers belong to an actor's stream: they rise through the stream, across batches,
//! and a link or an observation may name a frame an earlier batch of the same stream
//! carried. A stream whose numbers go back (an actor that reconnected and started
//! over) starts afresh; links into frames the receiver no longer has are broken, and
//! transitions that would walk through one are dropped, never rebuilt wrongly.

use serde::{Deserialize, Serialize};

use crate::spec::SpecError;

/// No frame: the bottom of a stack (a chain starts here).
pub const NO_FRAME: u64 = u64::MAX;

/// The frame-mode columns of a batch. Frame `j` of the batch is row `j` of its `obs`
/// column; transition `i` goes from the observation whose newest frame is `obs[i]` to the
/// one whose newest frame is `next[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameLinks {
    /// Frames per observation (the stack depth, oldest frame first in the observation).
    pub stack: u32,
    /// Per frame: its number in the stream (strictly rising).
    pub number: Vec<u64>,
    /// Per frame: the environment it came from (the actor's environment index).
    pub env: Vec<u32>,
    /// Per frame: the number of the frame below it in its stack, or [`NO_FRAME`].
    pub prev: Vec<u64>,
    /// Per transition: the environment it came from.
    pub item_env: Vec<u32>,
    /// Per transition: the newest frame of its observation.
    pub obs: Vec<u64>,
    /// Per transition: the newest frame of its next observation.
    pub next: Vec<u64>,
}

impl FrameLinks {
    pub fn new(stack: u32) -> Self {
        Self {
            stack,
            ..Self::default()
        }
    }

    /// Number of frames carried.
    pub fn frames(&self) -> usize {
        self.number.len()
    }

    /// Removes all frames and transitions, keeping the allocations.
    pub fn clear(&mut self) {
        self.number.clear();
        self.env.clear();
        self.prev.clear();
        self.item_env.clear();
        self.obs.clear();
        self.next.clear();
    }

    /// Checks the columns against `frames` rows of the obs column, `items` transitions
    /// and the expected stack depth: equal lengths, rising numbers, links that point
    /// down (to an earlier number), and observations no newer than the newest frame.
    pub fn validate(&self, stack: usize, frames: usize, items: usize) -> Result<(), SpecError> {
        if self.stack as usize != stack {
            return Err(SpecError::Length {
                what: "frame stack",
                expected: stack,
                got: self.stack as usize,
            });
        }
        let checks = [
            ("frame numbers", frames, self.number.len()),
            ("frame environments", frames, self.env.len()),
            ("frame links", frames, self.prev.len()),
            ("transition environments", items, self.item_env.len()),
            ("transition frames", items, self.obs.len()),
            ("next transition frames", items, self.next.len()),
        ];
        SpecError::check_lengths(&checks)?;
        if self.number.windows(2).any(|w| w[0] >= w[1]) {
            return Err(SpecError::BadValue("frame numbers do not rise".into()));
        }
        if self.number.last() == Some(&NO_FRAME) {
            return Err(SpecError::BadValue("frame number out of range".into()));
        }
        if let Some((n, p)) = self
            .number
            .iter()
            .zip(&self.prev)
            .find(|(n, p)| **p != NO_FRAME && *p >= *n)
        {
            return Err(SpecError::BadValue(format!(
                "frame {n} links to frame {p}, which is not older"
            )));
        }
        // An observation names a frame this batch or an earlier one of its stream carried.
        let newest = self.number.last().copied();
        if let Some(f) = self
            .obs
            .iter()
            .chain(&self.next)
            .find(|f| newest.is_some_and(|n| **f > n))
        {
            return Err(SpecError::BadValue(format!(
                "transition names frame {f}, newer than any carried"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> FrameLinks {
        FrameLinks {
            stack: 2,
            number: vec![10, 11, 12],
            env: vec![0, 1, 0],
            prev: vec![NO_FRAME, 7, 10],
            item_env: vec![0],
            obs: vec![10],
            next: vec![12],
        }
    }

    #[test]
    fn accepts_links_into_earlier_batches() {
        assert_eq!(links().validate(2, 3, 1), Ok(()));
    }

    #[test]
    fn rejects_what_cannot_be_a_stream() {
        assert!(links().validate(4, 3, 1).is_err(), "another stack depth");
        assert!(links().validate(2, 2, 1).is_err(), "a frame too many");
        let mut l = links();
        l.number[1] = 10;
        assert!(l.validate(2, 3, 1).is_err(), "numbers that do not rise");
        let mut l = links();
        l.prev[2] = 12;
        assert!(l.validate(2, 3, 1).is_err(), "a link to itself (a cycle)");
        let mut l = links();
        l.next[0] = 13;
        assert!(l.validate(2, 3, 1).is_err(), "a frame not sent yet");
        let mut l = links();
        l.number[2] = NO_FRAME;
        assert!(l.validate(2, 3, 1).is_err());
    }
}
