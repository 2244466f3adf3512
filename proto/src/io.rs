//! Async frame I/O over any tokio stream (feature `tokio`): the connection-owning tasks
//! of the learner's server and the remote actor read and write whole messages here.
//!
//! [`FrameReader`] drives the one framing state machine, [`codec::Framer`], from an
//! async reader; with a [`MemoryBudget`] it also bounds the bytes that all connections
//! together hold in frames being read or handled.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use crate::codec::ReadError;
use crate::codec::{self, CodecError, Framer};

/// Bytes that frames being received may occupy at once, across every connection that
/// shares it. A reader takes a frame's size from the budget once its header is checked
/// and before its payload is allocated, and gives it back when the handler drops the
/// [`BudgetPermit`]; when the budget is spent, readers wait (and TCP pushes back).
#[derive(Debug)]
pub struct MemoryBudget {
    bytes: usize,
    permits: Arc<Semaphore>,
}

/// Bytes taken from a [`MemoryBudget`], returned on drop.
#[derive(Debug)]
pub struct BudgetPermit {
    _held: Option<OwnedSemaphorePermit>,
}

impl BudgetPermit {
    fn none() -> Self {
        Self { _held: None }
    }
}

impl MemoryBudget {
    /// Semaphores count permits in `u32`: budgets are capped at 4 GiB − 1.
    pub fn new(bytes: usize) -> Self {
        let bytes = bytes.min(u32::MAX as usize);
        Self {
            bytes,
            permits: Arc::new(Semaphore::new(bytes)),
        }
    }

    /// Bytes not taken right now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.permits.available_permits()
    }

    async fn take(&self, bytes: usize) -> Result<BudgetPermit, CodecError> {
        if bytes > self.bytes {
            return Err(CodecError::FrameTooLarge {
                len: bytes,
                max: self.bytes,
            });
        }
        if bytes == 0 {
            return Ok(BudgetPermit::none());
        }
        let permit = Arc::clone(&self.permits)
            .acquire_many_owned(bytes as u32)
            .await
            .map_err(|_| CodecError::Malformed("memory budget closed".into()))?;
        Ok(BudgetPermit {
            _held: Some(permit),
        })
    }
}

/// Reads whole messages from an async stream, reusing one buffer.
///
/// Cancel-safe: a read interrupted at an `.await` (a `select!` taking another branch)
/// keeps the bytes and the budget it has, and the next call carries on with the same
/// frame.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    framer: Framer,
    budget: Option<Arc<MemoryBudget>>,
    /// The budget the frame being read holds, until it is handed out with the message.
    permit: Option<BudgetPermit>,
    /// A read that makes no progress for this long fails with [`ReadError::Idle`].
    idle: Option<Duration>,
    /// Each frame must arrive whole at this rate (see [`FrameReader::with_min_rate`]).
    min_rate: Option<MinRate>,
    /// When the frame being read must be complete.
    frame_deadline: Option<tokio::time::Instant>,
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
            budget: None,
            permit: None,
            idle: None,
            min_rate: None,
            frame_deadline: None,
        }
    }

    /// Fails a read with [`ReadError::TooSlow`] when a frame does not arrive whole at
    /// `rate` (the idle timeout alone resets on every byte).
    pub fn with_min_rate(mut self, rate: MinRate) -> Self {
        self.min_rate = Some(rate);
        self
    }

    /// Charges every frame's payload to `budget` while it is read and handled.
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = Some(budget);
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
                    self.permit = Some(match &self.budget {
                        Some(b) => b.take(len).await?,
                        None => BudgetPermit::none(),
                    });
                    // The clock starts once the budget is taken: waiting for it is the
                    // reader's own backpressure.
                    self.frame_deadline = self
                        .min_rate
                        .map(|r| tokio::time::Instant::now() + r.limit(len));
                }
                if let Some(payload) = self.framer.frame() {
                    self.frame_deadline = None;
                    let permit = self.permit.take().unwrap_or_else(BudgetPermit::none);
                    let msg = decode(payload);
                    // Decoded: a large payload buffer goes now, so that the permit
                    // covers the message alone while the caller handles it (an idle
                    // connection keeps no large buffer either).
                    self.framer.shrink();
                    return Ok(Some((msg?, permit)));
                }
            }
            let frame = self.framer.payload_len().zip(self.frame_deadline);
            let space = self.framer.space()?;
            let read = self.inner.read(space);
            let n = match (self.idle, frame) {
                (_, Some((len, deadline)))
                    if self
                        .idle
                        .is_none_or(|idle| deadline <= tokio::time::Instant::now() + idle) =>
                {
                    let limit = self.min_rate.map_or(Duration::ZERO, |r| r.limit(len));
                    tokio::time::timeout_at(deadline, read)
                        .await
                        .map_err(|_| ReadError::TooSlow { len, limit })??
                }
                (Some(idle), _) => tokio::time::timeout(idle, read)
                    .await
                    .map_err(|_| ReadError::Idle(idle))??,
                (None, _) => read.await?,
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
