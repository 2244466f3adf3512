//! One finished episode, as an actor reports it: in-process actors hand it to the
//! learner's statistics directly, remote ones send it over the wire and the learner's
//! server turns the message back into this.

/// A finished episode, as seen by an actor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpisodeStats {
    pub actor_id: u32,
    pub episode_return: f32,
    pub length: u32,
    /// Global env steps when it ended.
    pub env_steps: u64,
}
