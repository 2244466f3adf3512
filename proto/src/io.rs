//! Async frame I/O over any tokio stream (feature `tokio`): the connection-owning tasks
//! of the learner's server and the remote actor read and write whole messages here.
//!
//! [`FrameReader`] drives the one framing state machine, [`codec::Framer`], from an
//! async reader; with a [`MemoryBudget`] it also bounds the bytes that all connections
//! together hold in frames being read or handled, each to its fair share while others
//! wait (see [`crate::budget`]).

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use crate::budget::{BudgetPermit, Contended, Lease, MemoryBudget};
pub use crate::codec::ReadError;
use crate::codec::{self, CodecError, Framer};

/// Bytes of socket buffer on each end of an actor's connection: the actor's send buffer
/// and the learner's receive buffer. Kept small on purpose: the kernel's autotuned
/// buffers hold megabytes, i.e. tens of thousands of transitions generated with old
/// parameters that the learner would take seconds to drain; backpressure should reach
/// the actor loop instead.
pub const SOCKET_BUFFER_BYTES: u32 = 16 << 10;

/// Reads whole messages from an async stream, reusing one buffer.
///
/// Cancel-safe: a read interrupted at an `.await` (a `select!` taking another branch)
/// keeps the bytes and the budget it has, and the next call carries on with the same
/// frame.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    framer: Framer,
    lease: Option<Lease>,
    /// The budget the frame being read holds, until it is handed out with the message.
    permit: Option<BudgetPermit>,
    /// A read that makes no progress for this long fails with [`ReadError::Idle`].
    idle: Option<Duration>,
    /// Each frame must arrive whole at this rate (see [`FrameReader::with_min_rate`]).
    min_rate: Option<MinRate>,
    /// When the frame being read must be complete.
    frame_deadline: Option<tokio::time::Instant>,
    /// When the frame being read must be complete since its lease was squeezed, the
    /// share it was over and the time it was given.
    squeeze_deadline: Option<(tokio::time::Instant, usize, Duration)>,
}

/// A frame of `len` bytes has `grace + len / bytes_per_s` to arrive once its header
/// is in (and its budget taken): a peer that trickles a large frame cannot hold its
/// share of the memory budget for long, however often it sends a byte.
#[derive(Clone, Copy, Debug)]
pub struct MinRate {
    pub grace: Duration,
    pub bytes_per_s: u64,
}

impl MinRate {
    fn limit(&self, len: usize) -> Duration {
        self.grace + Duration::from_secs_f64(len as f64 / self.bytes_per_s.max(1) as f64)
    }
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame: usize) -> Self {
        Self {
            inner,
            framer: Framer::new(max_frame),
            lease: None,
            permit: None,
            idle: None,
            min_rate: None,
            frame_deadline: None,
            squeeze_deadline: None,
        }
    }

    /// Fails a read with [`ReadError::TooSlow`] when a frame does not arrive whole at
    /// `rate` (the idle timeout alone resets on every byte).
    pub fn with_min_rate(mut self, rate: MinRate) -> Self {
        self.min_rate = Some(rate);
        self
    }

    /// Charges every frame's payload to `budget` while it is read and handled, through
    /// a lease of this reader's own (a frame over its fair share must hurry while
    /// another reader waits).
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.lease = Some(budget.lease());
        self
    }

    /// Fails a read when no byte arrives for `idle` (waiting for the memory budget is
    /// the reader's own backpressure, not the peer's silence, and does not count).
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// Changes the frame limit (e.g. from the handshake's to the session's).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.framer.set_max_frame(max_frame);
    }

    /// Reads one message with the bytes it holds against the budget (released when the
    /// permit drops). `Ok(None)` is a clean end of stream between frames; a stream
    /// that ends inside a frame is [`ReadError::Truncated`].
    pub async fn read_msg_charged<M: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<(M, BudgetPermit)>, ReadError> {
        self.read_charged_with(codec::decode).await
    }

    /// Reads one frame and hands its payload to `decode` (a handshake that looks at a
    /// frame's preamble before decoding it whole); its bytes go back to the budget at
    /// once.
    pub async fn read_with<T>(
        &mut self,
        decode: impl FnOnce(&[u8]) -> Result<T, CodecError>,
    ) -> Result<Option<T>, ReadError> {
        Ok(self.read_charged_with(decode).await?.map(|(m, _)| m))
    }

    async fn read_charged_with<T>(
        &mut self,
        decode: impl FnOnce(&[u8]) -> Result<T, CodecError>,
    ) -> Result<Option<(T, BudgetPermit)>, ReadError> {
        loop {
            if let Some(len) = self.framer.payload_len() {
                // The header passed the limit: charge the payload before allocating it.
                if self.permit.is_none() {
                    self.permit = Some(match &self.lease {
                        Some(lease) => lease.take(len).await?,
                        None => BudgetPermit::none(),
                    });
                    // The clock starts once the budget is taken: waiting for it is the
                    // reader's own backpressure.
                    self.frame_deadline = self
                        .min_rate
                        .map(|r| tokio::time::Instant::now() + r.limit(len));
                    self.squeeze_deadline = None;
                }
                if let Some(payload) = self.framer.frame() {
                    self.frame_deadline = None;
                    self.squeeze_deadline = None;
                    let permit = self.permit.take().unwrap_or_else(BudgetPermit::none);
                    let msg = decode(payload);
                    // Decoded: a large payload buffer goes now, so that the permit
                    // covers the message alone while the caller handles it (an idle
                    // connection keeps no large buffer either).
                    self.framer.shrink();
                    return Ok(Some((msg?, permit)));
                }
                // Over its share while another reader waits: the rest must come fast.
                if let (None, Some(lease)) = (self.squeeze_deadline, &self.lease) {
                    if let Some(share) = lease.squeezed() {
                        let left = len.saturating_sub(self.framer.payload_filled());
                        let limit = lease.contended().limit(left);
                        self.squeeze_deadline =
                            Some((tokio::time::Instant::now() + limit, share, limit));
                    }
                }
            }
            let now = tokio::time::Instant::now();
            let len = self.framer.payload_len();
            // The earliest of the three deadlines decides how the read fails.
            let mut cut: Option<(tokio::time::Instant, ReadError)> =
                self.idle.map(|idle| (now + idle, ReadError::Idle(idle)));
            let mut sooner = |at: tokio::time::Instant, err: ReadError| {
                if cut.as_ref().is_none_or(|(t, _)| at <= *t) {
                    cut = Some((at, err));
                }
            };
            if let (Some(len), Some(at)) = (len, self.frame_deadline) {
                let limit = self.min_rate.map_or(Duration::ZERO, |r| r.limit(len));
                sooner(at, ReadError::TooSlow { len, limit });
            }
            if let (Some(len), Some((at, share, limit))) = (len, self.squeeze_deadline) {
                sooner(at, ReadError::OverShare { len, share, limit });
            }
            if cut.as_ref().is_some_and(|(at, _)| *at <= now) {
                return Err(cut.map(|c| c.1).expect("a deadline was set"));
            }
            let watch_squeeze = len.is_some() && self.squeeze_deadline.is_none();
            let lease = self.lease.as_ref().filter(|_| watch_squeeze);
            let space = self.framer.space()?;
            let n = tokio::select! {
                biased;
                n = self.inner.read(space) => n?,
                _ = tokio::time::sleep_until(cut.as_ref().map_or(now, |c| c.0)), if cut.is_some() => {
                    return Err(cut.map(|c| c.1).expect("a deadline was set"));
                }
                _ = async { lease.expect("watched only with a lease").squeeze_notified().await },
                    if lease.is_some() => continue,
            };
            if n == 0 {
                return match self.framer.pending() {
                    0 => Ok(None),
                    got => Err(ReadError::Truncated { got }),
                };
            }
            self.framer.filled(n)?;
        }
    }

    /// Reads one message (see [`FrameReader::read_msg_charged`]); its bytes go back to
    /// the budget at once.
    pub async fn read_msg<M: DeserializeOwned>(&mut self) -> Result<Option<M>, ReadError> {
        Ok(self.read_msg_charged().await?.map(|(m, _)| m))
    }

    /// The underlying stream.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes one message as a frame.
pub async fn write_msg<M: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &M,
    max_frame: usize,
) -> Result<(), ReadError> {
    let frame = codec::encode(msg, max_frame)?;
    w.write_all(&frame).await?;
    Ok(())
}

/// Writes a frame that was encoded once for many receivers (parameter broadcasts).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(frame).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ActorMsg;

    #[tokio::test]
    async fn an_interrupted_read_carries_on_with_the_same_frame() {
        use tokio::io::AsyncWriteExt;
        // A frame larger than the kept buffer, sent in two parts with a pause between.
        let msg = ActorMsg::Stats(crate::wire::ActorStats {
            episode_returns: (0..40_000).map(|i| i as f32).collect(),
            ..Default::default()
        });
        let frame = codec::encode(&msg, 1 << 20).unwrap();
        assert!(frame.len() > 100 << 10);
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let budget = Arc::new(MemoryBudget::new(1 << 20));
        let mut reader = FrameReader::new(rx, 1 << 20).with_budget(Arc::clone(&budget));
        tx.write_all(&frame[..frame.len() / 2]).await.unwrap();
        // Interrupted mid-frame, as a select! taking another branch does.
        let cut = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            reader.read_msg_charged::<ActorMsg>(),
        )
        .await;
        assert!(cut.is_err(), "half a frame is not a message");
        assert!(
            budget.available() < 1 << 20,
            "the frame keeps its budget meanwhile"
        );
        tx.write_all(&frame[frame.len() / 2..]).await.unwrap();
        let (got, permit) = reader
            .read_msg_charged::<ActorMsg>()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, msg, "nothing lost or zeroed across the interruption");
        drop(permit);
        assert_eq!(budget.available(), 1 << 20);
    }

    #[tokio::test]
    async fn a_peer_that_stops_mid_frame_is_idle() {
        use tokio::io::AsyncWriteExt;
        let frame = codec::encode(&ActorMsg::Heartbeat, 1024).unwrap();
        let (mut tx, rx) = tokio::io::duplex(1024);
        tx.write_all(&frame[..2]).await.unwrap();
        let mut reader =
            FrameReader::new(rx, 1024).with_idle_timeout(std::time::Duration::from_millis(30));
        assert!(matches!(
            reader.read_msg::<ActorMsg>().await,
            Err(ReadError::Idle(_))
        ));
    }

    #[tokio::test]
    async fn a_frame_trickled_below_the_minimum_rate_is_cut_off() {
        use tokio::io::AsyncWriteExt;
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let frame = codec::encode(&vec![7u8; 4000], 1 << 20).unwrap();
        // A byte every 5 ms: never idle for long, but 4 KB would take 20 s.
        let writer = tokio::spawn(async move {
            for b in frame {
                if tx.write_all(&[b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        });
        let mut reader = FrameReader::new(rx, 1 << 20)
            .with_idle_timeout(std::time::Duration::from_secs(1))
            .with_min_rate(MinRate {
                grace: std::time::Duration::from_millis(200),
                bytes_per_s: 1 << 20,
            });
        let start = std::time::Instant::now();
        let err = reader.read_msg::<Vec<u8>>().await.unwrap_err();
        assert!(
            matches!(err, ReadError::TooSlow { len, .. } if len > 4000),
            "{err}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        writer.abort();
    }

    #[tokio::test]
    async fn frames_wait_for_the_shared_budget() {
        let frame = codec::encode(&ActorMsg::Heartbeat, 1024).unwrap();
        let len = frame.len() - codec::HEADER_BYTES;
        let budget = Arc::new(MemoryBudget::new(len));
        let stream = [frame.clone(), frame].concat();
        let mut a = FrameReader::new(stream.as_slice(), 1024).with_budget(Arc::clone(&budget));
        let (msg, held) = a.read_msg_charged::<ActorMsg>().await.unwrap().unwrap();
        assert_eq!(msg, ActorMsg::Heartbeat);
        assert_eq!(budget.available(), 0, "the first frame holds the budget");
        // The second frame waits until the first one's permit is dropped.
        let second = a.read_msg_charged::<ActorMsg>();
        tokio::pin!(second);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), &mut second).await;
        assert!(waited.is_err(), "blocked while the budget is spent");
        drop(held);
        let (msg, _held) = second.await.unwrap().unwrap();
        assert_eq!(msg, ActorMsg::Heartbeat);
        // A frame larger than the whole budget is an error, not a wait forever.
        let big = codec::encode(&ActorMsg::Stats(Default::default()), 1024).unwrap();
        let mut b =
            FrameReader::new(big.as_slice(), 1024).with_budget(Arc::new(MemoryBudget::new(1)));
        assert!(matches!(
            b.read_msg::<ActorMsg>().await,
            Err(ReadError::Codec(CodecError::FrameTooLarge { .. }))
        ));
    }
}
