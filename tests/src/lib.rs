//! Shared fakes and helpers for millrace's cross-crate behaviour tests (`tests/*.rs`).

use std::sync::Arc;

use millrace_actor::runner::SinkClosed;
use millrace_actor::{ActorSink, EpisodeStats};
use millrace_proto::TransitionBatch;
use millrace_replay::Table;

/// An actor sink that inserts straight into a replay table and counts episodes.
#[derive(Debug)]
pub struct TableSink {
    pub table: Arc<Table>,
    pub episodes: Vec<EpisodeStats>,
    /// Stop the actor after this many batches.
    pub max_batches: usize,
    pub batches: usize,
}

impl TableSink {
    pub fn new(table: Arc<Table>, max_batches: usize) -> Self {
        Self {
            table,
            episodes: Vec::new(),
            max_batches,
            batches: 0,
        }
    }
}

impl ActorSink for TableSink {
    fn transitions(&mut self, batch: TransitionBatch) -> Result<(), SinkClosed> {
        self.table.insert(&batch).map_err(|_| SinkClosed)?;
        self.batches += 1;
        if self.batches >= self.max_batches {
            Err(SinkClosed)
        } else {
            Ok(())
        }
    }

    fn episode(&mut self, stats: EpisodeStats) {
        self.episodes.push(stats);
    }
}
