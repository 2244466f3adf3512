//! Every valid message decodes whatever its size: the decoder's limit is counted the way
//! bincode counts it (decoded widths), not in encoded bytes.
//!
//! Regression (issue "One bad transition…", part 2): the limit used to be the payload's
//! size class itself, so a valid 62,884-byte batch (class 64 KiB) that decodes to more
//! than 64 KiB of columns was refused for good while a larger 72,484-byte one (class
//! 1 MiB) was stored. Batches here are built to the worst ratio a real batch reaches
//! (1-byte varint indices and actions decoded as `u32` and `i64`), at sizes on both sides
//! of every class boundary and at seeded random sizes inside each class.

use millrace_proto::codec::{self, CodecError, DEFAULT_MAX_FRAME, MAX_FRAME_CEILING};
use millrace_proto::wire::ActorMsg;
use millrace_proto::TransitionBatch;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Encoded bytes of one transition of [`batch_of_size`]: two 1-byte indices, a 1-byte
/// action, a reward, a discount and a priority.
const ROW_BYTES: usize = 15;

/// A valid batch (1-byte observation rows) whose `ActorMsg::Transitions` payload is
/// `target` bytes, give or take the two bytes a length's varint may change by; most of it
/// is transitions, the rest observation bytes.
fn batch_of_size(target: usize, rng: &mut SmallRng) -> TransitionBatch {
    let rows = target * 9 / 10 / ROW_BYTES;
    let mut b = TransitionBatch {
        obs_row_bytes: 1,
        obs: vec![rng.random(); 1],
        ..TransitionBatch::default()
    };
    for _ in 0..rows {
        b.push_transition(0, rng.random_range(0..2), rng.random(), 0.99, 0);
        b.priorities.push(rng.random());
    }
    let len = |b: &TransitionBatch| {
        codec::to_bytes(&ActorMsg::Transitions(b.clone()))
            .unwrap()
            .len()
    };
    let short = target.saturating_sub(len(&b));
    b.obs.extend((0..short).map(|_| rng.random::<u8>()));
    let over = len(&b).saturating_sub(target);
    b.obs.truncate(b.obs.len() - over);
    b
}

/// The payload sizes to try: both sides of every class boundary, the two sizes the
/// issue reported, and seeded random sizes inside each class.
fn sizes(rng: &mut SmallRng) -> Vec<usize> {
    let mut sizes = vec![62_884, 72_484];
    let mut lower = 1_000;
    for class in [64 << 10, 1 << 20, 16 << 20, MAX_FRAME_CEILING] {
        sizes.extend([class - 4, class - 1, class, class + 1, class + 300]);
        sizes.extend((0..2).map(|_| rng.random_range(lower..class)));
        lower = class;
    }
    sizes
}

#[test]
fn every_valid_batch_decodes_across_each_size_class_and_the_ceiling_refuses_only_more() {
    let mut rng = SmallRng::seed_from_u64(0xC1A55);
    for target in sizes(&mut rng) {
        let batch = batch_of_size(target, &mut rng);
        let msg = ActorMsg::Transitions(batch);
        let encoded = codec::encode(&msg, MAX_FRAME_CEILING);
        let len = codec::to_bytes(&msg).unwrap().len();
        assert!(len.abs_diff(target) <= 2, "{len} bytes for {target}");
        if len > MAX_FRAME_CEILING {
            assert!(
                matches!(encoded, Err(CodecError::FrameTooLarge { .. })),
                "{len} bytes: over the ceiling"
            );
            continue;
        }
        let frame = encoded.unwrap_or_else(|e| panic!("{len} bytes: {e}"));
        let payload = &frame[codec::HEADER_BYTES..];
        match codec::decode::<ActorMsg>(payload) {
            Ok(back) => assert!(back == msg, "{len} bytes: round trip differs"),
            Err(e) => panic!("a valid batch of {len} encoded bytes was refused: {e}"),
        }
        // Over the connection's default frame limit it is the frame limit that refuses,
        // before anything is read (the server raises it to what its welcome allows).
        let header: [u8; 4] = frame[..4].try_into().unwrap();
        assert_eq!(
            codec::payload_len(header, DEFAULT_MAX_FRAME).is_ok(),
            len <= DEFAULT_MAX_FRAME,
            "{len} bytes"
        );
    }
}

#[test]
fn decoded_widths_exceed_the_encoded_size_so_the_limit_must_scale() {
    // The same kind of batch under a limit equal to its size class, as `decode` had it:
    // refused (the bug the scaled limit mends).
    let mut rng = SmallRng::seed_from_u64(7);
    let payload = codec::to_bytes(&ActorMsg::Transitions(batch_of_size(62_884, &mut rng))).unwrap();
    let unscaled = bincode::config::standard().with_limit::<{ 64 << 10 }>();
    let refused = bincode::serde::decode_from_slice::<ActorMsg, _>(&payload, unscaled);
    assert!(
        matches!(refused, Err(bincode::error::DecodeError::LimitExceeded)),
        "decoded widths exceed the encoded size: {:?}",
        refused.map(|_| ())
    );
}
