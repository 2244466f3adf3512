//! One round of TD errors, read back to the host, applied to replay: the items whose
//! TD errors show them poison evicted ([`crate::poison`]), and with prioritized replay
//! the others' magnitudes set as their priorities, by the items' stable keys. Lock-step
//! drivers apply inline; the learner thread hands rounds to a thread of their own
//! ([`crate::priority_thread`]), so that it never takes replay's shard locks.

use std::sync::Arc;

use millrace_replay::{ItemKey, PriorityOutcome, PriorityUpdate, Table};
use tch::Tensor;

/// Applies rounds to one table and counts what replay did with them.
pub(crate) struct Applier {
    table: Arc<Table>,
    /// Prioritized replay: set priorities (uniform replay only evicts poison).
    prioritized: bool,
    /// |TD error| beyond which an item is poison ([`crate::poison::td_bound`]).
    poison_td: f32,
    totals: PriorityOutcome,
}

impl Applier {
    pub(crate) fn new(table: Arc<Table>, prioritized: bool, poison_td: f32) -> Self {
        Self {
            table,
            prioritized,
            poison_td,
            totals: PriorityOutcome::default(),
        }
    }

    /// What replay did with the priorities applied so far.
    pub(crate) fn totals(&self) -> PriorityOutcome {
        self.totals
    }

    /// Applies `host`, the |TD error| of each of `keys`' items (a float tensor on the
    /// host whose copy has landed).
    pub(crate) fn apply(&mut self, host: &Tensor, mut keys: Vec<ItemKey>) {
        let mut priorities = match Vec::<f32>::try_from(host) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("priorities: cannot read TD errors back: {e}");
                return;
            }
        };
        let culprits = crate::poison::culprits(&priorities, self.poison_td);
        if !culprits.is_empty() {
            let poisoned: Vec<ItemKey> = culprits
                .iter()
                .filter_map(|i| keys.get(*i))
                .copied()
                .collect();
            let worst = culprits
                .iter()
                .map(|i| priorities[*i])
                .fold(0.0f32, |m, td| {
                    if td.is_finite() {
                        m.max(td)
                    } else {
                        f32::INFINITY
                    }
                });
            let evicted = self.table.evict(&poisoned);
            let before = self.table.stats().evicted.saturating_sub(evicted as u64);
            // Logged once per power of two (a flood says so without flooding the log).
            if (before + 1..=before + evicted as u64).any(u64::is_power_of_two) {
                tracing::warn!(
                    "replay: {evicted} item(s) evicted as poison (|TD error| up to {worst:e}, beyond {:e}); {} so far",
                    self.poison_td,
                    before + evicted as u64
                );
            }
            // Their TD errors are no priorities (one 3e38 would raise the maximum every
            // new item gets).
            let mut poison = vec![false; priorities.len()];
            for i in &culprits {
                poison[*i] = true;
            }
            (keys, priorities) = keys
                .iter()
                .zip(&priorities)
                .zip(&poison)
                .filter(|(_, bad)| !**bad)
                .map(|((k, td), _)| (*k, *td))
                .unzip();
        }
        if !self.prioritized {
            return;
        }
        let r = self
            .table
            .update_priorities(&PriorityUpdate { keys, priorities });
        self.totals.applied += r.applied;
        self.totals.stale += r.stale;
        self.totals.invalid += r.invalid;
    }
}
