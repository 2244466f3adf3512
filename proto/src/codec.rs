//! Bytes on the wire, and the only place that turns them into messages and back.
//!
//! A frame is a little-endian `u32` payload length followed by the payload, a bincode
//! 2.0.1 (serde, standard config) encoding of one message. Every length is checked
//! against an explicit maximum before anything is allocated for it, and decoding runs
//! with bincode's byte limit. Memory a hostile frame can cost is therefore bounded: the
//! frame itself, plus what decoding expands it to (at most ~24 bytes per encoded byte,
//! for a sequence of empty strings; 8 for varint-coded integers). Servers should read
//! the pre-authentication handshake with a small frame limit for that reason. Handlers
//! never see bytes.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Hard ceiling on any frame (and the decoder's byte limit): 64 MiB. Nature-DQN's
/// parameters (~6.7 MB) fit with room; larger networks are chunked by the sender.
pub const MAX_FRAME_CEILING: usize = 64 << 20;
/// Default frame limit for a connection.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;
/// Bytes of the length prefix.
pub const HEADER_BYTES: usize = 4;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_CEILING>()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: usize, max: usize },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("cannot encode message: {0}")]
    Encode(String),
    #[error("{0} bytes left over after the message")]
    TrailingBytes(usize),
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode<M: Serialize>(msg: &M, max_frame: usize) -> Result<Vec<u8>, CodecError> {
    // Encode straight after a placeholder header: one buffer, no copy of the payload.
    let mut frame = vec![0u8; HEADER_BYTES];
    bincode::serde::encode_into_std_write(msg, &mut frame, config())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    let len = frame.len() - HEADER_BYTES;
    let max = max_frame.min(MAX_FRAME_CEILING);
    if len > max {
        return Err(CodecError::FrameTooLarge { len, max });
    }
    frame[..HEADER_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(frame)
}

/// Reads a frame header, checking the length before the caller allocates for it.
pub fn payload_len(header: [u8; HEADER_BYTES], max_frame: usize) -> Result<usize, CodecError> {
    let len = u32::from_le_bytes(header) as usize;
    let max = max_frame.min(MAX_FRAME_CEILING);
    if len > max {
        return Err(CodecError::FrameTooLarge { len, max });
    }
    Ok(len)
}

/// Decodes one message from a whole payload; the payload must hold exactly one.
pub fn decode<M: DeserializeOwned>(payload: &[u8]) -> Result<M, CodecError> {
    let (msg, used) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(CodecError::TrailingBytes(payload.len() - used));
    }
    Ok(msg)
}

/// Splits a byte stream into frames, whatever the chunking of the reads.
///
/// The buffer never holds more than one header plus one frame's payload.
#[derive(Debug)]
pub struct Framer {
    max_frame: usize,
    buf: Vec<u8>,
}

impl Framer {
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame: max_frame.min(MAX_FRAME_CEILING),
            buf: Vec::new(),
        }
    }

    /// How many more bytes the current frame needs (at least 1): read at most this much
    /// before calling [`Framer::next_frame`], so the buffer stays bounded.
    pub fn wanted(&self) -> Result<usize, CodecError> {
        if self.buf.len() < HEADER_BYTES {
            return Ok(HEADER_BYTES - self.buf.len());
        }
        let len = payload_len(self.header(), self.max_frame)?;
        Ok((HEADER_BYTES + len).saturating_sub(self.buf.len()).max(1))
    }

    fn header(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h.copy_from_slice(&self.buf[..HEADER_BYTES]);
        h
    }

    /// Appends bytes read from the stream. Callers that respect [`Framer::wanted`]
    /// never push past the current frame; extra bytes are kept for the next one.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete payload, if there is one.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        if self.buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let len = payload_len(self.header(), self.max_frame)?;
        if self.buf.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        let rest = self.buf.split_off(HEADER_BYTES + len);
        let mut frame = std::mem::replace(&mut self.buf, rest);
        frame.drain(..HEADER_BYTES);
        Ok(Some(frame))
    }

    /// Bytes of an incomplete frame left in the buffer (a truncated stream if the
    /// connection ends now).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Compares two tokens in time that depends only on their lengths, not their contents.
pub fn tokens_equal(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        ActorMsg, ActorStats, Capabilities, Hello, LearnerMsg, Welcome, PROTOCOL_VERSION,
    };
    use crate::{DType, EnvSpec, NetworkSpec, ObsSpec, Params, TransitionBatch};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn hello() -> ActorMsg {
        ActorMsg::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            token: "s3cret".into(),
            actor_name: "actor-7".into(),
            capabilities: Capabilities {
                envs: 64,
                env_ids: vec!["CartPole-v1".into()],
            },
        })
    }

    fn transitions(rows: usize) -> ActorMsg {
        let mut b = TransitionBatch::with_capacity(16, rows, 2 * rows);
        for i in 0..rows {
            let x = i as f32;
            b.push_f32(
                &[x, -x, 0.5, 1.0],
                (i % 2) as i64,
                1.0,
                0.97,
                &[x + 1.0, 0.0, 0.0, 2.0],
            );
        }
        b.actor_id = 3;
        b.seq = 42;
        b.version = 9;
        ActorMsg::Transitions(b)
    }

    fn welcome() -> LearnerMsg {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        LearnerMsg::Welcome(Box::new(Welcome {
            run_id: "run-1".into(),
            network: NetworkSpec::mlp(&obs, &[64, 64], 2, 1).unwrap(),
            env: EnvSpec {
                id: "CartPole-v1".into(),
                obs,
                num_actions: 2,
                max_episode_steps: 500,
                reward_threshold: Some(475.0),
            },
            params_version: 12,
            slots: vec![0, 1],
            epsilons: vec![0.4, 0.0016],
            epsilon_decay: Some(crate::wire::EpsilonDecay {
                start: 1.0,
                end: 0.04,
                steps: 8000,
            }),
            n_step: 3,
            gamma: 0.99,
            batch_rows: 64,
        }))
    }

    fn round_trip<M: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(msg: M) {
        let frame = encode(&msg, DEFAULT_MAX_FRAME).unwrap();
        let len = payload_len(frame[..4].try_into().unwrap(), DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(len, frame.len() - 4);
        assert_eq!(decode::<M>(&frame[4..]).unwrap(), msg);
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(hello());
        round_trip(transitions(37));
        round_trip(ActorMsg::Stats(ActorStats {
            env_steps: 1 << 40,
            episodes: 3,
            episode_returns: vec![1.0, 500.0],
            params_version: 2,
        }));
        round_trip(ActorMsg::Heartbeat);
        round_trip(ActorMsg::Goodbye {
            reason: "bye".into(),
        });
        round_trip(welcome());
        round_trip(LearnerMsg::Params(Params {
            version: 5,
            env_steps: 0,
            population: 1,
            data: vec![0.25; 4610],
        }));
        round_trip(LearnerMsg::Error {
            reason: "wrong token".into(),
        });
    }

    #[test]
    fn oversized_frames_are_refused_before_allocation() {
        assert_eq!(
            payload_len(u32::MAX.to_le_bytes(), DEFAULT_MAX_FRAME),
            Err(CodecError::FrameTooLarge {
                len: u32::MAX as usize,
                max: DEFAULT_MAX_FRAME
            })
        );
        let big = LearnerMsg::Params(Params {
            version: 1,
            env_steps: 0,
            population: 1,
            data: vec![0.0; 1000],
        });
        assert!(matches!(
            encode(&big, 100),
            Err(CodecError::FrameTooLarge { .. })
        ));
        let mut framer = Framer::new(1024);
        framer.push(&2048u32.to_le_bytes());
        assert!(framer.wanted().is_err());
        assert!(framer.next_frame().is_err());
    }

    #[test]
    fn framer_reassembles_any_chunking() {
        let mut stream = Vec::new();
        let msgs = [
            hello(),
            transitions(5),
            ActorMsg::Heartbeat,
            transitions(64),
        ];
        for m in &msgs {
            stream.extend(encode(m, DEFAULT_MAX_FRAME).unwrap());
        }
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..50 {
            let mut framer = Framer::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            let mut at = 0;
            while at < stream.len() {
                let n = rng.random_range(1..=40).min(stream.len() - at);
                framer.push(&stream[at..at + n]);
                at += n;
                while let Some(frame) = framer.next_frame().unwrap() {
                    got.push(decode::<ActorMsg>(&frame).unwrap());
                }
            }
            assert_eq!(got, msgs);
            assert_eq!(framer.pending(), 0);
        }
    }

    #[test]
    fn truncated_and_trailing_payloads_are_errors() {
        let frame = encode(&transitions(3), DEFAULT_MAX_FRAME).unwrap();
        let payload = &frame[4..];
        for cut in [0, 1, payload.len() / 2, payload.len() - 1] {
            assert!(decode::<ActorMsg>(&payload[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = payload.to_vec();
        extra.push(0);
        assert_eq!(
            decode::<ActorMsg>(&extra),
            Err(CodecError::TrailingBytes(1))
        );
        let mut framer = Framer::new(DEFAULT_MAX_FRAME);
        framer.push(&frame[..frame.len() - 3]);
        assert_eq!(framer.next_frame(), Ok(None));
        assert_eq!(framer.wanted(), Ok(3));
        assert!(
            framer.pending() > 0,
            "a truncated frame is visible to the caller"
        );
    }

    #[test]
    fn a_huge_claimed_length_inside_a_small_frame_fails_cleanly() {
        // A Goodbye whose string claims 2^60 bytes: bincode's limit refuses the claim.
        let mut payload = vec![4u8]; // variant index of Goodbye
        payload.push(253); // varint marker for a u64 length
        payload.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(
            decode::<ActorMsg>(&payload),
            Err(CodecError::Malformed(_))
        ));
    }

    /// Bounded fuzzing: random bytes and mutations of valid frames must decode to a
    /// message or an error, never panic. Runs a fixed number of cases from fixed seeds
    /// so CI time is bounded and failures reproduce.
    #[test]
    fn decoder_survives_random_and_mutated_input() {
        let mut rng = SmallRng::seed_from_u64(0xF022);
        let valid: Vec<Vec<u8>> = [hello(), transitions(8), ActorMsg::Heartbeat]
            .iter()
            .map(|m| encode(m, DEFAULT_MAX_FRAME).unwrap()[4..].to_vec())
            .chain([encode(&welcome(), DEFAULT_MAX_FRAME).unwrap()[4..].to_vec()])
            .collect();
        let mut decoded = 0;
        for case in 0..200_000 {
            let input: Vec<u8> = if case % 2 == 0 {
                let len = rng.random_range(0..64);
                (0..len).map(|_| rng.random()).collect()
            } else {
                let mut v = valid[case % valid.len()].clone();
                for _ in 0..rng.random_range(1..4) {
                    match rng.random_range(0..3) {
                        0 if !v.is_empty() => {
                            let i = rng.random_range(0..v.len());
                            v[i] = rng.random();
                        }
                        1 if !v.is_empty() => {
                            v.truncate(rng.random_range(0..v.len()));
                        }
                        _ => v.insert(rng.random_range(0..=v.len()), rng.random()),
                    }
                }
                v
            };
            decoded += usize::from(decode::<ActorMsg>(&input).is_ok());
            let _ = decode::<LearnerMsg>(&input);
            let mut framer = Framer::new(1 << 16);
            framer.push(&input);
            while let Ok(Some(frame)) = framer.next_frame() {
                let _ = decode::<ActorMsg>(&frame);
            }
        }
        assert!(
            decoded > 0,
            "some mutations still decode (the fuzzer reaches the decoder)"
        );
    }

    #[test]
    fn token_comparison() {
        assert!(tokens_equal(b"abc", b"abc"));
        assert!(!tokens_equal(b"abc", b"abd"));
        assert!(!tokens_equal(b"abc", b"abcd"));
        assert!(!tokens_equal(b"", b"a"));
        assert!(tokens_equal(b"", b""));
    }
}
