//! Async frame I/O over any tokio stream (feature `tokio`): the connection-owning tasks
//! of the learner's server and the remote actor read and write whole messages here.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::codec::{self, CodecError, HEADER_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection closed mid-frame ({got} of {wanted} bytes)")]
    Truncated { got: usize, wanted: usize },
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Fills `buf` completely; returns how many bytes arrived before end of stream.
async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = r.read(&mut buf[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// Reads one message. `Ok(None)` is a clean end of stream between frames; a stream that
/// ends inside a frame is [`ReadError::Truncated`]. The payload buffer is allocated only
/// after its length passed the frame limit.
pub async fn read_msg<M: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    max_frame: usize,
) -> Result<Option<M>, ReadError> {
    let mut header = [0u8; HEADER_BYTES];
    let got = fill(r, &mut header).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER_BYTES {
        return Err(ReadError::Truncated {
            got,
            wanted: HEADER_BYTES,
        });
    }
    let len = codec::payload_len(header, max_frame)?;
    let mut payload = vec![0u8; len];
    let got = fill(r, &mut payload).await?;
    if got < len {
        return Err(ReadError::Truncated { got, wanted: len });
    }
    Ok(Some(codec::decode(&payload)?))
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
