//! Bytes on the wire, and the only place that turns them into messages and back.
//!
//! A frame is a little-endian `u32` payload length followed by the payload, a bincode
//! 2.0.1 (serde, standard config) encoding of one message. Every length is checked
//! against an explicit maximum before anything is allocated for it, and decoding runs
//! with a byte limit that follows from the payload's size (see [`decode`]), so a small
//! frame cannot claim a large allocation. Memory a hostile frame can cost is therefore
//! bounded: the frame itself, plus what decoding expands it to (at most ~24 bytes per
//! encoded byte, for a sequence of empty strings; 8 for varint-coded integers). Servers
//! read the pre-authentication handshake with a small frame limit for that reason, and
//! bound the bytes in flight across all connections.
//!
//! Reading is split the mini-redis way: [`Framer`] is the one framing state machine
//! (header, limit check, payload buffer), with no I/O; [`read_frame`] drives it from a
//! blocking reader (files, tests) and `io::FrameReader` from an async one (the server and
//! the remote actor). Handlers never see bytes.

use std::io::Read;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Hard ceiling on any frame: 64 MiB. Nature-DQN's parameters (~6.7 MB) fit with
/// room; larger networks are chunked by the sender.
pub const MAX_FRAME_CEILING: usize = 64 << 20;
/// Default frame limit for a connection.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;
/// Bytes of the length prefix.
pub const HEADER_BYTES: usize = 4;
/// A reader keeps a payload buffer up to this size between frames; larger ones are
/// freed (a connection idling after one large frame should not hold it).
const KEEP_BUFFER_BYTES: usize = 64 << 10;

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
    let config = bincode::config::standard().with_limit::<MAX_FRAME_CEILING>();
    bincode::serde::encode_into_std_write(msg, &mut frame, config)
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    let len = frame.len() - HEADER_BYTES;
    let max = max_frame.min(MAX_FRAME_CEILING);
    if len > max {
        return Err(CodecError::FrameTooLarge { len, max });
    }
    frame[..HEADER_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(frame)
}

/// `msg` as payload bytes (no length prefix): what [`crate::auth`] tags.
pub fn to_bytes<M: Serialize>(msg: &M) -> Result<Vec<u8>, CodecError> {
    let config = bincode::config::standard().with_limit::<MAX_FRAME_CEILING>();
    bincode::serde::encode_to_vec(msg, config).map_err(|e| CodecError::Encode(e.to_string()))
}

/// The protocol version a first frame claims, read from its fixed preamble (the
/// variant index of `ActorMsg::Hello`, 0, then the version, as bincode varints),
/// whatever follows: `None` if the payload does not start as a `Hello`.
pub fn hello_version(payload: &[u8]) -> Option<u32> {
    let config = bincode::config::standard().with_limit::<64>();
    let ((variant, version), _): ((u32, u32), usize) =
        bincode::serde::decode_from_slice(payload, config).ok()?;
    (variant == 0).then_some(version)
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

/// Decoded bytes per encoded byte, at most, in any message of this crate, counted the
/// way bincode 2.0.1 counts its limit: every primitive it decodes claims its decoded
/// width (a `u64` 8 bytes, a length 8, an `f32` 4, a variant index 4, a byte 1) and
/// consumes at least one encoded byte, and byte buffers claim their length once
/// (serde's sequences claim nothing up front). No wire type holds a 128-bit integer, so
/// 8 bounds the ratio; a varint `u64` of 1 byte is the worst case.
pub const DECODED_PER_ENCODED_BYTE: usize = 8;

/// The encoded payload sizes whose decoding limits are compiled in (bincode's limit is a
/// const generic): the limit for a payload is [`DECODED_PER_ENCODED_BYTE`] times the
/// smallest class that holds it.
const SIZE_CLASSES: [usize; 4] = [64 << 10, 1 << 20, 16 << 20, MAX_FRAME_CEILING];

fn decode_limited<M: DeserializeOwned, const LIMIT: usize>(
    payload: &[u8],
) -> Result<M, CodecError> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    let (msg, used) = bincode::serde::decode_from_slice(payload, config)
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(CodecError::TrailingBytes(payload.len() - used));
    }
    Ok(msg)
}

/// Decodes one message from a whole payload; the payload must hold exactly one.
///
/// bincode checks every length it reads against a byte limit before allocating for it
/// (a `Vec<u8>` claiming 60 MB is refused, not allocated), and it counts that limit in
/// *decoded* widths, not encoded bytes (a 1-byte varint decoded as an `i64` counts 8).
/// The limit is therefore [`DECODED_PER_ENCODED_BYTE`] × the payload's size class
/// (64 KiB, 1 MiB, 16 MiB, 64 MiB: the smallest that holds it): every valid message
/// decodes whatever its size, and whatever a frame claims, decoding allocates at most
/// 8 × its class at once for bytes: 512 KiB for a frame of the 64 KiB class (every
/// frame before authentication), up to 512 MiB (mostly untouched pages) for one of the
/// largest class, which only an authenticated peer may send.
pub fn decode<M: DeserializeOwned>(payload: &[u8]) -> Result<M, CodecError> {
    const K: usize = DECODED_PER_ENCODED_BYTE;
    const C: [usize; 4] = SIZE_CLASSES;
    match payload.len() {
        n if n <= C[0] => decode_limited::<M, { K * C[0] }>(payload),
        n if n <= C[1] => decode_limited::<M, { K * C[1] }>(payload),
        n if n <= C[2] => decode_limited::<M, { K * C[2] }>(payload),
        _ => decode_limited::<M, { K * C[3] }>(payload),
    }
}

/// The framing state machine, without I/O: it says how many bytes the current frame
/// still needs, holds them, and hands out the payload once complete.
///
/// The buffer never holds more than one header plus one frame's payload, and the
/// payload's space is allocated only after its length passed the frame limit.
#[derive(Debug)]
pub struct Framer {
    max_frame: usize,
    header: [u8; HEADER_BYTES],
    header_len: usize,
    /// The payload's length once the header is complete and checked.
    len: Option<usize>,
    payload: Vec<u8>,
    filled: usize,
}

impl Framer {
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame: max_frame.min(MAX_FRAME_CEILING),
            header: [0; HEADER_BYTES],
            header_len: 0,
            len: None,
            payload: Vec::new(),
            filled: 0,
        }
    }

    /// Changes the frame limit (a server raises it once a peer has authenticated).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame.min(MAX_FRAME_CEILING);
    }

    /// The current payload's length, once its header has been read and checked.
    pub fn payload_len(&self) -> Option<usize> {
        self.len
    }

    /// Bytes of the current frame received so far (non-zero means a stream that ends
    /// now ends mid-frame).
    pub fn pending(&self) -> usize {
        self.header_len + self.filled
    }

    /// Bytes of the current payload received so far.
    pub fn payload_filled(&self) -> usize {
        self.filled
    }

    /// Where the next bytes of the stream go: exactly what the current frame still
    /// needs (read at most this much, so nothing of the next frame is consumed). The
    /// payload's space is allocated here, once its header passed the limit.
    pub fn space(&mut self) -> Result<&mut [u8], CodecError> {
        match self.len {
            None => Ok(&mut self.header[self.header_len..]),
            Some(len) => {
                if self.payload.len() != len {
                    self.payload.clear();
                    self.payload.resize(len, 0);
                }
                Ok(&mut self.payload[self.filled..])
            }
        }
    }

    /// Records that `n` bytes were written into [`Framer::space`].
    pub fn filled(&mut self, n: usize) -> Result<(), CodecError> {
        match self.len {
            None => {
                self.header_len += n;
                debug_assert!(self.header_len <= HEADER_BYTES);
                if self.header_len == HEADER_BYTES {
                    self.len = Some(payload_len(self.header, self.max_frame)?);
                }
            }
            Some(_) => self.filled += n,
        }
        Ok(())
    }

    /// The complete payload, if the current frame is complete; the framer then starts
    /// on the next frame at the following call.
    pub fn frame(&mut self) -> Option<&[u8]> {
        let len = self.len?;
        if self.filled < len {
            return None;
        }
        // Taken: reset for the next frame, keeping a small buffer for reuse.
        self.len = None;
        self.header_len = 0;
        self.filled = 0;
        Some(&self.payload[..len])
    }

    /// Frees a large payload buffer once its frame was handled (never mid-frame: a
    /// caller interrupted while reading keeps what it has).
    pub fn shrink(&mut self) {
        if self.pending() == 0 && self.payload.capacity() > KEEP_BUFFER_BYTES {
            self.payload = Vec::new();
        }
    }
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("stream ended mid-frame ({got} bytes of the frame received)")]
    Truncated { got: usize },
    #[error("nothing received for {0:?}")]
    Idle(std::time::Duration),
    #[error("a frame of {len} bytes did not arrive within {limit:?} (the minimum rate)")]
    TooSlow {
        len: usize,
        limit: std::time::Duration,
    },
    #[error(
        "a frame of {len} bytes held more than its fair share ({share} bytes) of the memory \
         budget while other connections waited, and did not arrive within {limit:?} of that"
    )]
    OverShare {
        len: usize,
        share: usize,
        limit: std::time::Duration,
    },
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Reads one frame from a blocking reader into `framer`: `Ok(None)` is a clean end of
/// stream between frames; a stream that ends inside a frame is [`ReadError::Truncated`].
pub fn read_frame<'f, R: Read>(
    reader: &mut R,
    framer: &'f mut Framer,
) -> Result<Option<&'f [u8]>, ReadError> {
    // No `shrink`: a blocking reader (a file, a test's client) reuses one buffer.
    loop {
        if framer.payload_len().is_some_and(|len| framer.filled >= len) {
            return Ok(framer.frame());
        }
        let n = match reader.read(framer.space()?) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return match framer.pending() {
                0 => Ok(None),
                got => Err(ReadError::Truncated { got }),
            };
        }
        framer.filled(n)?;
    }
}

/// Reads and decodes one message from a blocking reader (see [`read_frame`]).
pub fn read_msg<M: DeserializeOwned, R: Read>(
    reader: &mut R,
    framer: &mut Framer,
) -> Result<Option<M>, ReadError> {
    match read_frame(reader, framer)? {
        Some(payload) => Ok(Some(decode(payload)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        ActorMsg, ActorStats, Capabilities, Goodbye, GoodbyeReason, Hello, LearnerMsg, Refusal,
        RefusalCode, Welcome, PROTOCOL_VERSION,
    };
    use crate::{DType, EnvSpec, NetworkSpec, ObsSpec, Params, TransitionBatch};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn hello() -> ActorMsg {
        ActorMsg::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            nonce: [7; 32],
            actor_name: "actor-7".into(),
            capabilities: Capabilities {
                envs: 64,
                env_ids: vec!["CartPole-v1".into()],
                features: vec!["priorities".into()],
            },
            agent: Some(2),
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
        b.agent = 1;
        b.seq = 42;
        b.version = 9;
        b.priorities = (0..rows).map(|i| i as f32 * 0.5).collect();
        ActorMsg::Transitions(b)
    }

    fn welcome() -> LearnerMsg {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        LearnerMsg::Welcome(Box::new(Welcome {
            env_config: crate::env::EnvConfig::new("CartPole-v1"),
            clip_rewards: false,
            max_frame: 16 << 20,
            run_id: "run-1".into(),
            network: NetworkSpec::mlp(&obs, &[64, 64], 2, 1).unwrap(),
            env: EnvSpec {
                id: "CartPole-v1".into(),
                obs,
                num_actions: 2,
                max_episode_steps: 500,
                reward_threshold: Some(475.0),
                reward_range: None,
                frame_stack: 1,
            },
            agent: 0,
            params_version: 12,
            env_indices: vec![0, 1],
            epsilons: vec![0.4, 0.0016],
            epsilon_decay: Some(crate::wire::EpsilonDecay {
                start: 1.0,
                end: 0.04,
                steps: 8000,
            }),
            n_step: 3,
            gamma: 0.99,
            batch_rows: 64,
            features: vec![],
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
        round_trip(ActorMsg::Proof([3; 32]));
        round_trip(LearnerMsg::Challenge([4; 32]));
        round_trip(LearnerMsg::ParamsSeal([5; 32]));
        round_trip(LearnerMsg::Sealed(crate::wire::Sealed {
            body: vec![1, 2, 3],
            tag: [6; 32],
        }));
        round_trip(ActorMsg::Goodbye(Goodbye {
            reason: GoodbyeReason::ActorStopping,
            message: "bye".into(),
        }));
        round_trip(welcome());
        round_trip(LearnerMsg::Params(Params {
            version: 5,
            env_steps: 0,
            updates: 99,
            population: 1,
            data: vec![0.25; 4610],
        }));
        round_trip(LearnerMsg::Refused(Refusal::new(
            RefusalCode::WrongToken,
            "wrong token",
        )));
        round_trip(LearnerMsg::Goodbye(Goodbye {
            reason: GoodbyeReason::RunFinished,
            message: "solved".into(),
        }));
    }

    #[test]
    fn observation_bytes_travel_as_one_block() {
        // 16 bytes per row, 2 rows per transition: the encoding is the raw bytes plus a
        // few bytes of lengths and columns, not a varint per byte.
        let ActorMsg::Transitions(b) = transitions(100) else {
            unreachable!()
        };
        let frame = encode(&b, DEFAULT_MAX_FRAME).unwrap();
        assert!(
            frame.len() < b.obs.len() + 100 * 24,
            "{} bytes",
            frame.len()
        );
        let at = frame
            .windows(b.obs.len())
            .position(|w| w == b.obs.as_slice());
        assert!(at.is_some(), "the observation rows appear verbatim");
    }

    /// A reader that hands out at most `chunk` bytes per call, like a socket.
    struct Chunked<'a> {
        data: &'a [u8],
        rng: SmallRng,
    }

    impl Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self
                .rng
                .random_range(1..=40)
                .min(buf.len())
                .min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
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
            updates: 0,
            population: 1,
            data: vec![0.0; 1000],
        });
        assert!(matches!(
            encode(&big, 100),
            Err(CodecError::FrameTooLarge { .. })
        ));
        let mut framer = Framer::new(1024);
        let mut input: &[u8] = &2048u32.to_le_bytes();
        assert!(matches!(
            read_frame(&mut input, &mut framer),
            Err(ReadError::Codec(CodecError::FrameTooLarge {
                len: 2048,
                ..
            }))
        ));
        assert_eq!(framer.payload.capacity(), 0, "nothing allocated");
    }

    #[test]
    fn the_reader_reassembles_any_chunking() {
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
        for seed in 0..50 {
            let mut reader = Chunked {
                data: &stream,
                rng: SmallRng::seed_from_u64(seed),
            };
            let mut framer = Framer::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            while let Some(m) = read_msg::<ActorMsg, _>(&mut reader, &mut framer).unwrap() {
                got.push(m);
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
        // A stream that ends inside a frame, in the payload or in the header.
        for cut in [frame.len() - 3, 2] {
            let mut framer = Framer::new(DEFAULT_MAX_FRAME);
            let mut input = &frame[..cut];
            match read_frame(&mut input, &mut framer) {
                Err(ReadError::Truncated { got }) => assert_eq!(got, cut),
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        let mut framer = Framer::new(DEFAULT_MAX_FRAME);
        assert!(matches!(read_frame(&mut &[][..], &mut framer), Ok(None)));
    }

    #[test]
    fn a_huge_claimed_length_inside_a_small_frame_fails_cleanly() {
        // Observation bytes claiming 2^60, then 60 MB: the small frame's limit (8 × its
        // 64 KiB size class) refuses both claims before any allocation.
        for claim in [1u64 << 60, 60 << 20] {
            let mut payload = vec![1u8, 0, 0, 0, 0, 0]; // Transitions; ids, version...
            payload.push(253); // varint marker for a u64 length
            payload.extend_from_slice(&claim.to_le_bytes());
            assert!(
                matches!(decode::<ActorMsg>(&payload), Err(CodecError::Malformed(_))),
                "claim {claim}"
            );
        }
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
            let mut reader = input.as_slice();
            while let Ok(Some(frame)) = read_frame(&mut reader, &mut framer) {
                let _ = decode::<ActorMsg>(frame);
            }
        }
        assert!(
            decoded > 0,
            "some mutations still decode (the fuzzer reaches the decoder)"
        );
    }

    #[test]
    fn the_version_preamble_is_read_whatever_follows_it() {
        // Version 6's Hello carried the token where version 7's carries a nonce.
        #[derive(Serialize)]
        struct OldHello {
            protocol_version: u32,
            token: String,
            actor_name: String,
        }
        #[derive(Serialize)]
        enum OldMsg {
            Hello(OldHello),
        }
        let old = to_bytes(&OldMsg::Hello(OldHello {
            protocol_version: 6,
            token: "s3cret".into(),
            actor_name: "old".into(),
        }))
        .unwrap();
        assert_eq!(hello_version(&old), Some(6));
        assert_eq!(
            hello_version(&to_bytes(&hello()).unwrap()),
            Some(PROTOCOL_VERSION)
        );
        assert_eq!(
            hello_version(&to_bytes(&ActorMsg::Heartbeat).unwrap()),
            None
        );
        assert_eq!(hello_version(&[]), None);
    }
}
