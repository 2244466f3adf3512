//! Mutual authentication of an actor session by HMAC-SHA256 challenge-response keyed by
//! the shared token: the token itself never crosses the wire, each side proves it knows
//! it, and what the learner then tells the actor (what to run, with which parameters,
//! when to stop) is authenticated, so that a relay can neither rewrite it nor replay it.
//!
//! ```text
//! actor                                          learner
//!   │── Hello { version, nonce_a, … } ────────────▶│
//!   │◀────────────────────────── Challenge(nonce_l) │  nothing else before the proof
//!   │── Proof(HMAC(token, ACTOR ‖ Hello ‖ nonce_l)) ▶│  wrong: WrongToken (throttled)
//!   │◀───────────────────────────── Sealed(Welcome) │  under the session key
//!   │◀──────────────────────── Params, ParamsSeal  … │
//!   │◀────────────────── Sealed(Goodbye | Refused)  │
//! ```
//!
//! The session key is `HMAC(token, SESSION ‖ Hello ‖ nonce_l)`: both nonces are fresh
//! (the actor's is inside its `Hello`), so a recorded exchange fails when replayed to
//! either side. Each sealed message carries `HMAC(key, MESSAGE ‖ n ‖ body)` with `n`
//! counting the session's sealed messages, so none can be dropped, reordered or moved
//! to another session unnoticed. Parameters are large and encoded once for every
//! session: they carry a tag over their SHA-256 digest instead (one digest per
//! broadcast, one 32-byte HMAC per session). Every input is length-prefixed.
//!
//! What this does not do: encrypt (transitions and parameters travel in the clear), or
//! protect a guessable token from an offline dictionary attack on a recorded exchange.
//! `docs/guide/service.md` ("Threat model") says what to put in front of the learner.

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::codec::{self, CodecError};
use crate::params::Params;
use crate::wire::{Hello, LearnerMsg, Sealed};

type HmacSha256 = Hmac<Sha256>;

pub use crate::wire::{Nonce, Tag, NONCE_BYTES};

// Domain separation: a tag made for one purpose is never valid for another.
const ACTOR_PROOF: &[u8] = b"millrace/7/actor-proof";
const SESSION_KEY: &[u8] = b"millrace/7/session-key";
const MESSAGE: &[u8] = b"millrace/7/message";
const PARAMS: &[u8] = b"millrace/7/params";

/// Why a sealed message was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("its authentication tag does not match: the peer does not know the token, or the message was altered or replayed")]
    Forged,
    #[error("{0}")]
    Malformed(#[from] CodecError),
}

/// A fresh nonce from the thread's CSPRNG (ChaCha, seeded from the operating system).
pub fn fresh_nonce() -> Nonce {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::rng().fill(&mut nonce);
    nonce
}

/// An HMAC over length-prefixed `parts`.
fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes keys of any length (an empty token included).
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for part in parts {
        m.update(&(part.len() as u64).to_le_bytes());
        m.update(part);
    }
    m
}

fn tag(key: &[u8], parts: &[&[u8]]) -> Tag {
    mac(key, parts).finalize().into_bytes().into()
}

/// Checks `got` in constant time.
fn holds(key: &[u8], parts: &[&[u8]], got: &Tag) -> bool {
    mac(key, parts).verify_slice(got).is_ok()
}

/// What the actor answers the learner's challenge with.
pub fn actor_proof(token: &[u8], hello: &Hello, challenge: &Nonce) -> Result<Tag, CodecError> {
    let hello = codec::to_bytes(hello)?;
    Ok(tag(token, &[ACTOR_PROOF, &hello, challenge]))
}

/// Whether `proof` shows the actor that sent `hello` knows `token` (constant time).
pub fn proof_holds(
    token: &[u8],
    hello: &Hello,
    challenge: &Nonce,
    proof: &Tag,
) -> Result<bool, CodecError> {
    let hello = codec::to_bytes(hello)?;
    Ok(holds(token, &[ACTOR_PROOF, &hello, challenge], proof))
}

/// The digest parameters are sealed by: every field, the weights as their bytes.
pub fn params_digest(p: &Params) -> Tag {
    let mut h = Sha256::new();
    for field in [p.version, p.env_steps, p.updates, p.population as u64] {
        h.update(field.to_le_bytes());
    }
    h.update((p.data.len() as u64).to_le_bytes());
    // Little-endian on every host, as the wire carries them.
    if cfg!(target_endian = "little") {
        h.update(bytemuck::cast_slice::<f32, u8>(&p.data));
    } else {
        for x in &p.data {
            h.update(x.to_le_bytes());
        }
    }
    h.finalize().into()
}

/// One session's authentication of the learner's messages: the learner seals, the
/// actor opens, each counting the sealed messages in the same order.
pub struct Seal {
    key: Tag,
    next: u64,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("Seal").field("next", &self.next).finish()
    }
}

impl Seal {
    /// The session's key, from the token, the actor's `Hello` (its nonce in it) and the
    /// learner's challenge.
    pub fn for_session(token: &[u8], hello: &Hello, challenge: &Nonce) -> Result<Self, CodecError> {
        let hello = codec::to_bytes(hello)?;
        Ok(Self {
            key: tag(token, &[SESSION_KEY, &hello, challenge]),
            next: 0,
        })
    }

    fn count(&mut self) -> [u8; 8] {
        let n = self.next.to_le_bytes();
        self.next += 1;
        n
    }

    /// `msg` as the next sealed message of the session.
    pub fn seal(&mut self, msg: &LearnerMsg) -> Result<LearnerMsg, CodecError> {
        let body = codec::to_bytes(msg)?;
        let n = self.count();
        let tag = tag(&self.key, &[MESSAGE, &n, &body]);
        Ok(LearnerMsg::Sealed(Sealed { body, tag }))
    }

    /// The message inside `sealed`, if it is the session's next one.
    pub fn open(&mut self, sealed: &Sealed) -> Result<LearnerMsg, AuthError> {
        let n = self.count();
        if !holds(&self.key, &[MESSAGE, &n, &sealed.body], &sealed.tag) {
            return Err(AuthError::Forged);
        }
        Ok(codec::decode(&sealed.body)?)
    }

    /// The tag that follows parameters of `digest` ([`params_digest`]).
    pub fn seal_params(&mut self, digest: &Tag) -> Tag {
        let n = self.count();
        tag(&self.key, &[PARAMS, &n, digest])
    }

    /// Whether `tag` seals `params` as the session's next sealed message.
    pub fn open_params(&mut self, params: &Params, tag: &Tag) -> Result<(), AuthError> {
        let n = self.count();
        let digest = params_digest(params);
        if holds(&self.key, &[PARAMS, &n, &digest], tag) {
            Ok(())
        } else {
            Err(AuthError::Forged)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Capabilities, Goodbye, GoodbyeReason, PROTOCOL_VERSION};

    fn hello(nonce: Nonce) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            nonce,
            actor_name: "a".into(),
            capabilities: Capabilities {
                envs: 4,
                env_ids: vec!["CartPole-v1".into()],
                features: vec![],
            },
            agent: None,
        }
    }

    fn bye() -> LearnerMsg {
        LearnerMsg::Goodbye(Goodbye {
            reason: GoodbyeReason::RunFinished,
            message: "done".into(),
        })
    }

    #[test]
    fn a_proof_holds_only_for_the_token_the_hello_and_the_challenge_it_was_made_for() {
        let (h, challenge) = (hello(fresh_nonce()), fresh_nonce());
        let proof = actor_proof(b"s3cret", &h, &challenge).unwrap();
        assert!(proof_holds(b"s3cret", &h, &challenge, &proof).unwrap());
        assert!(!proof_holds(b"guess", &h, &challenge, &proof).unwrap());
        // Replayed against a new challenge (the learner's next connection).
        assert!(!proof_holds(b"s3cret", &h, &fresh_nonce(), &proof).unwrap());
        // A relay that changes what the actor asked for.
        let mut other = h.clone();
        other.capabilities.envs = 4096;
        assert!(!proof_holds(b"s3cret", &other, &challenge, &proof).unwrap());
        // The proof is not the session key's material: sealing with it fails.
        assert_ne!(
            proof,
            Seal::for_session(b"s3cret", &h, &challenge).unwrap().key
        );
    }

    #[test]
    fn sealed_messages_open_once_in_order_and_only_in_their_session() {
        let (h, challenge) = (hello(fresh_nonce()), fresh_nonce());
        let mut learner = Seal::for_session(b"s3cret", &h, &challenge).unwrap();
        let mut actor = Seal::for_session(b"s3cret", &h, &challenge).unwrap();
        let LearnerMsg::Sealed(first) = learner.seal(&bye()).unwrap() else {
            panic!("sealed")
        };
        let LearnerMsg::Sealed(second) = learner.seal(&bye()).unwrap() else {
            panic!("sealed")
        };
        assert_eq!(actor.open(&first).unwrap(), bye());
        // The first again (a replay within the session) is not the next one.
        let mut replayed = Seal::for_session(b"s3cret", &h, &challenge).unwrap();
        replayed.next = 1;
        assert_eq!(replayed.open(&first), Err(AuthError::Forged));
        assert_eq!(actor.open(&second).unwrap(), bye());
        // Another session (the actor's next nonce) or a wrong token opens nothing.
        let mut other = Seal::for_session(b"s3cret", &hello(fresh_nonce()), &challenge).unwrap();
        assert_eq!(other.open(&first), Err(AuthError::Forged));
        let mut wrong = Seal::for_session(b"guess", &h, &challenge).unwrap();
        assert_eq!(wrong.open(&first), Err(AuthError::Forged));
        // One flipped bit of the body.
        let mut fresh = Seal::for_session(b"s3cret", &h, &challenge).unwrap();
        let mut flipped = first.clone();
        flipped.body[0] ^= 1;
        assert_eq!(fresh.open(&flipped), Err(AuthError::Forged));
    }

    #[test]
    fn parameters_are_sealed_by_their_digest() {
        let (h, challenge) = (hello(fresh_nonce()), fresh_nonce());
        let mut learner = Seal::for_session(b"t", &h, &challenge).unwrap();
        let mut actor = Seal::for_session(b"t", &h, &challenge).unwrap();
        let p = Params::of_one(3, vec![0.5, -1.0, 2.0]);
        let t = learner.seal_params(&params_digest(&p));
        let mut altered = p.clone();
        altered.data[1] = 1.0;
        let mut again = Seal::for_session(b"t", &h, &challenge).unwrap();
        assert_eq!(again.open_params(&altered, &t), Err(AuthError::Forged));
        let mut newer = p.clone();
        newer.version = 4;
        let mut again = Seal::for_session(b"t", &h, &challenge).unwrap();
        assert_eq!(again.open_params(&newer, &t), Err(AuthError::Forged));
        assert_eq!(actor.open_params(&p, &t), Ok(()));
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(fresh_nonce(), fresh_nonce());
    }
}
