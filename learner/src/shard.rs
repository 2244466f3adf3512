//! `--shard I/N`: the I-th of N disjoint parts of a population or sweep, one per task of
//! a job array (Slurm's `SLURM_ARRAY_TASK_ID`, a Kubernetes Indexed Job's
//! `JOB_COMPLETION_INDEX`).
//!
//! Which agents train together decides their batches (`run::population`: an agent's
//! batches wait for its group's), so a shard is not "every N-th agent": shard I of N is
//! thread I's plan of the same run with `--population-threads N` and the same
//! `--max-concurrent-agents` — its share of every group, with its share of the places —
//! and its agents' results are bit-identical to that one-process run's on the same
//! machine. Each shard writes under its own directory of the log directory
//! (`<logdir>/shard-I-of-N`), and `learner merge --logdir <logdir>` combines them
//! ([`crate::shard_merge`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Part `index` of `count` (0-based: `0/3`, `1/3`, `2/3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, ShardError> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| ShardError::NotAFraction(s.into()))?;
        let parse = |x: &str, what: &'static str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| ShardError::NotANumber {
                    shard: s.into(),
                    what,
                    got: x.into(),
                })
        };
        let (index, count) = (parse(i, "I")?, parse(n, "N")?);
        if count == 0 {
            return Err(ShardError::NoParts(s.into()));
        }
        if index >= count {
            return Err(ShardError::PastTheEnd(s.into(), count - 1));
        }
        Ok(Self { index, count })
    }
}

/// A `--shard` that is not `I/N` with `I < N` ([`Shard::from_str`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("`{0}` is not I/N (the I-th of N parts, from 0: 0/3)")]
    NotAFraction(String),
    #[error("`{shard}`: {what} `{got}` is not a whole number")]
    NotANumber {
        shard: String,
        what: &'static str,
        got: String,
    },
    #[error("`{0}`: N must be at least 1")]
    NoParts(String),
    #[error("`{0}`: I counts from 0 and must be below N (0 to {1})")]
    PastTheEnd(String, usize),
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Its directory under the shards' common log directory: `shard-I-of-N`.
    pub fn dir_name(&self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }

    /// The shard a directory name (`shard-I-of-N`) stands for.
    pub fn from_dir_name(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("shard-")?;
        let (i, n) = rest.split_once("-of-")?;
        let shard: Self = format!("{i}/{n}").parse().ok()?;
        // One spelling per shard: `shard-01-of-3` is not shard 1's directory.
        (shard.dir_name() == name).then_some(shard)
    }

    /// What every shard of one split must agree on, as a short text: the whole
    /// population's agents (each one's identity as `texts` gives it, in order), the
    /// places shared among the shards, and their number. `learner merge` refuses
    /// shards whose fingerprints differ (another seed, sweep or --max-concurrent-agents).
    pub fn fingerprint<'a>(&self, texts: impl Iterator<Item = &'a str>, places: usize) -> String {
        // FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for t in texts {
            eat(t.as_bytes());
            eat(b"\n");
        }
        eat(format!("places {places} shards {}", self.count).as_bytes());
        format!("{h:016x}")
    }

    /// Its places when `concurrent` agents train at once over all the shards: thread
    /// I's share in the one-process run (the first `concurrent % N` threads take one
    /// more).
    pub fn slots(&self, concurrent: usize) -> usize {
        concurrent / self.count + usize::from(self.index < concurrent % self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_i_of_n_from_zero_and_refuses_the_rest() {
        assert_eq!("2/3".parse(), Ok(Shard { index: 2, count: 3 }));
        assert_eq!("0/1".parse(), Ok(Shard { index: 0, count: 1 }));
        for bad in ["3/3", "1/0", "1", "a/3", "-1/3", "1/3/4", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        let err = "3/3".parse::<Shard>().unwrap_err().to_string();
        assert!(err.contains("0 to 2"), "{err}");
    }

    #[test]
    fn its_directory_name_reads_back_and_only_in_one_spelling() {
        let s = Shard { index: 1, count: 3 };
        assert_eq!(s.dir_name(), "shard-1-of-3");
        assert_eq!(Shard::from_dir_name("shard-1-of-3"), Some(s));
        for other in [
            "shard-01-of-3",
            "shard-3-of-3",
            "shard-1-of",
            "agents",
            "shard-1-of-3x",
        ] {
            assert_eq!(Shard::from_dir_name(other), None, "{other}");
        }
    }

    #[test]
    fn the_fingerprint_follows_the_agents_the_places_and_the_split() {
        let s = Shard { index: 0, count: 3 };
        let a = s.fingerprint(["agent 0", "agent 1"].into_iter(), 6);
        assert_eq!(
            a,
            Shard { index: 2, count: 3 }.fingerprint(["agent 0", "agent 1"].into_iter(), 6)
        );
        assert_ne!(a, s.fingerprint(["agent 0", "agent 2"].into_iter(), 6));
        assert_ne!(a, s.fingerprint(["agent 0", "agent 1"].into_iter(), 4));
        assert_ne!(
            a,
            Shard { index: 0, count: 2 }.fingerprint(["agent 0", "agent 1"].into_iter(), 6)
        );
    }

    #[test]
    fn places_are_shared_as_the_threads_of_one_process_share_them() {
        // 7 places over 3: 3, 2, 2, as threads 0, 1 and 2 of one run get them.
        let slots: Vec<usize> = (0..3)
            .map(|index| Shard { index, count: 3 }.slots(7))
            .collect();
        assert_eq!(slots, [3, 2, 2]);
        assert_eq!(slots.iter().sum::<usize>(), 7);
    }
}
