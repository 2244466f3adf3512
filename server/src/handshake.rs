//! The learner's side of the challenge-response ([`millrace_proto::auth`]): read the
//! `Hello` (its version preamble first), send a fresh challenge, check the proof. Until
//! the proof holds the peer hears nothing but the challenge or a typed refusal
//! (`ProtocolVersion`, `WrongToken`, `Timeout`, `ProtocolViolation`).

use millrace_proto::auth::{fresh_nonce, proof_holds, Seal};
use millrace_proto::codec::{self, hello_version};
use millrace_proto::io::{write_msg, FrameReader};
use millrace_proto::wire::{ActorMsg, Hello, LearnerMsg, Refusal, RefusalCode, PROTOCOL_VERSION};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

use super::HANDSHAKE_MAX_FRAME;

/// A peer that proved the token: its `Hello` as it sent it (names unescaped: the caller
/// bounds them before use) and the session's seal for what the learner tells it.
pub(super) struct Authenticated {
    pub hello: Hello,
    pub seal: Seal,
}

/// Why a handshake failed: the refusal to send (unsealed: the peer has not proved the
/// token), and whether it was a wrong proof (the caller throttles those).
#[derive(Debug)]
pub(super) struct Failed {
    pub refusal: Refusal,
    pub wrong_token: bool,
}

impl From<Refusal> for Failed {
    fn from(refusal: Refusal) -> Self {
        Self {
            refusal,
            wrong_token: false,
        }
    }
}

fn violation(message: impl Into<String>) -> Failed {
    Refusal::new(RefusalCode::ProtocolViolation, message).into()
}

fn timeout() -> Failed {
    Refusal::new(RefusalCode::Timeout, "no handshake within the timeout").into()
}

/// Runs the handshake: the `Hello` by `hello_by`, the rest by `deadline`. With no
/// `token` (a loopback learner started without one) every proof holds, and the seal is keyed by the empty token, as the
/// actor's is when it has none.
pub(super) async fn authenticate(
    rd: &mut FrameReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    token: Option<&str>,
    (hello_by, deadline): (Instant, Instant),
) -> Result<Authenticated, Failed> {
    // The first frame: a message of this version, or `Err` with the version it claims.
    let first = tokio::time::timeout_at(
        hello_by.min(deadline),
        rd.read_with(|payload| match hello_version(payload) {
            Some(v) if v != PROTOCOL_VERSION => Ok(Err(v)),
            _ => codec::decode::<ActorMsg>(payload).map(Ok),
        }),
    )
    .await
    .map_err(|_| timeout())?
    .map_err(|e| violation(format!("bad handshake: {e}")))?;
    let hello = match first {
        Some(Ok(ActorMsg::Hello(h))) => h,
        Some(Err(v)) => {
            return Err(Refusal::new(
                RefusalCode::ProtocolVersion,
                format!(
                    "protocol version {v} is not supported (this learner speaks {PROTOCOL_VERSION})"
                ),
            )
            .into())
        }
        Some(Ok(other)) => {
            return Err(violation(format!(
                "expected Hello first, got {}",
                other.kind()
            )))
        }
        None => return Err(violation("closed before the handshake")),
    };
    let challenge = fresh_nonce();
    tokio::time::timeout_at(
        deadline,
        write_msg(wr, &LearnerMsg::Challenge(challenge), HANDSHAKE_MAX_FRAME),
    )
    .await
    .map_err(|_| timeout())?
    .map_err(|e| violation(format!("the challenge could not be sent: {e}")))?;
    let proof = match tokio::time::timeout_at(deadline, rd.read_msg::<ActorMsg>())
        .await
        .map_err(|_| timeout())?
        .map_err(|e| violation(format!("bad handshake: {e}")))?
    {
        Some(ActorMsg::Proof(p)) => p,
        Some(other) => {
            return Err(violation(format!(
                "expected Proof after the challenge, got {}",
                other.kind()
            )))
        }
        None => return Err(violation("closed during the handshake")),
    };
    let key = token.unwrap_or_default().as_bytes();
    let holds = proof_holds(key, &hello, &challenge, &proof)
        .map_err(|e| violation(format!("bad handshake: {e}")))?;
    if token.is_some() && !holds {
        return Err(Failed {
            refusal: Refusal::new(RefusalCode::WrongToken, "wrong token"),
            wrong_token: true,
        });
    }
    let seal = Seal::for_session(key, &hello, &challenge).map_err(|e| violation(format!("{e}")))?;
    Ok(Authenticated { hello, seal })
}
